#pragma once

// Host-only declarations of the CUDA side; safe to include from .cpp files.

namespace kvoffload::detail {

/// cudaGetDeviceCount, with any error (no driver, no device) reported as 0 devices.
int cuda_visible_devices() noexcept;

}  // namespace kvoffload::detail
