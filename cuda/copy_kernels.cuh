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

/// The device-table path's piece builder: build_piece for each of max_pieces pieces (empty
/// ones when *mismatch is set). All pointers are device memory.
int launch_build_pieces(const DeviceJobLayout& layout, const std::int32_t* ids,
                        const std::int64_t* count, const std::int64_t* group_counts,
                        const std::int32_t* host_ids, const int* mismatch, DevicePiece* pieces,
                        std::uint64_t max_pieces, int ctas, int threads, void* stream) noexcept;

}  // namespace kvoffload::detail
