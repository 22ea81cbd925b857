#pragma once

#include "kvoffload/export.hpp"

namespace kvoffload {

/// Whether this build of the library contains the CUDA backend.
KVOFFLOAD_EXPORT bool built_with_cuda() noexcept;

/// CUDA devices visible to this process; 0 without a CUDA build, a driver or a device.
/// Thread-safe.
KVOFFLOAD_EXPORT int cuda_device_count() noexcept;

}  // namespace kvoffload
