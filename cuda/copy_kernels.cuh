#pragma once

// Host-only declarations of the copy kernels' launchers; safe to include from .cpp files.
// They never throw or log: they return the cudaError_t of the launch (as int).

#include <cstdint>

#include "kvoffload/detail/copy_body.hpp"

namespace kvoffload::detail {

/// Copies `count` pieces (the array is in device memory) with `ctas` CTAs of `threads`
/// threads, one warp per piece at a time. Host addresses must be device-accessible (registered
/// pinned memory on a unified-addressing system).
int launch_copy_pieces(const DevicePiece* pieces, std::uint64_t count, int ctas, int threads,
                       void* stream) noexcept;

}  // namespace kvoffload::detail

namespace kvoffload::detail {

/// Builds count * L.max_tensors pieces from compacted ids on the device (piece_for), then
/// copies them: the device-table path, with no host round trip. `count` is read on the device.
int launch_build_and_copy(const DeviceJobLayout& layout, const std::int32_t* ids,
                          const std::int64_t* count, const std::int64_t* group_counts,
                          const std::int32_t* host_ids, DevicePiece* pieces,
                          std::uint64_t max_pieces, int ctas, int threads, void* stream) noexcept;

}  // namespace kvoffload::detail
