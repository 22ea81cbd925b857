#pragma once

// Internal: the block arithmetic that the scheduler, the job checks, the copy planner and the
// CUDA backend share (SEMANTICS 2 and 5). One host (offloaded) block holds f = block_size_factor
// GPU blocks; null GPU blocks (outside a sliding window) form a leading run.

#include <cstdint>
#include <vector>

#include "kvoffload/types.hpp"

namespace kvoffload::detail {

/// a / b rounded up (a >= 0, b > 0).
constexpr std::int64_t cdiv(std::int64_t a, std::int64_t b) noexcept {
  return (a + b - 1) / b;
}

/// Offloaded block i of a group's GPU block list is real (not entirely null): its last
/// sub-block is real, since null sub-blocks only lead.
inline bool offloaded_block_real(const std::vector<GpuBlockId>& ids, std::int64_t i,
                                 std::int64_t f) noexcept {
  return ids[static_cast<std::size_t>(i * f + f - 1)] != null_block;
}

/// The host blocks a job's group spans: `size` GPU blocks starting at sub-block
/// `index % f` of its first host block.
constexpr std::int64_t host_blocks_spanned(std::int64_t size, std::int64_t index,
                                           std::int64_t f) noexcept {
  return cdiv(size + index % f, f);
}

/// A group's counts when `cached` tokens are computed and `local` GPU blocks of them are in
/// the GPU prefix cache (SEMANTICS 5): what on_allocated plans and validate_allocated checks.
struct AllocatedCounts {
  std::int64_t n_gpu = 0;    ///< GPU blocks the cached tokens fill
  std::int64_t local = 0;    ///< of them, in the GPU prefix cache
  std::int64_t pending = 0;  ///< n_gpu - local: to load
  std::int64_t n_off = 0;    ///< offloaded blocks the cached tokens touch
};

constexpr AllocatedCounts allocated_counts(std::int64_t cached, std::int64_t gpu_block_size,
                                           std::int64_t offloaded_block_size,
                                           std::int64_t local) noexcept {
  const std::int64_t n_gpu = cdiv(cached, gpu_block_size);
  return {n_gpu, local, n_gpu - local, cdiv(cached, offloaded_block_size)};
}

}  // namespace kvoffload::detail
