#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvoffload/enums.hpp"
#include "kvoffload/export.hpp"
#include "kvoffload/types.hpp"

namespace kvoffload {

/// The GPU side of a transfer: the source of a store, the destination of a load
/// (SEMANTICS 6). block_ids is group-major; group g contributes group_sizes[g] ids, the first
/// of which is sub-block block_indices[g] of the request's block list for that group.
struct GpuSpec {
  std::vector<GpuBlockId> block_ids;
  std::vector<std::int64_t> group_sizes;
  std::vector<std::int64_t> block_indices;
};

/// One transfer between GPU blocks and host blocks. keys and host_block_ids have the same
/// order (group-major, offloaded-block order within a group).
struct TransferJob {
  JobId id = 0;
  JobKind kind = JobKind::store;
  std::string request_id;
  std::vector<Key> keys;
  GpuSpec gpu;
  std::vector<HostBlockId> host_block_ids;
};

/// One transfer between host blocks and a tier's slots, run by the workers (each moves its own
/// rows): promote reads slots into host blocks, write copies host blocks into slots. keys,
/// host_block_ids and slots have the same order.
struct TierJob {
  JobId id = 0;
  JobKind kind = JobKind::write;  ///< promote or write
  std::uint32_t tier = 0;         ///< index into SchedulerConfig::tiers (the worker's too)
  std::string request_id;         ///< promote: the request whose lookup started it; write: empty
  std::vector<Key> keys;
  std::vector<HostBlockId> host_block_ids;
  std::vector<std::int64_t> slots;  ///< the tier's slots: read from (promote) or written to (write)
  /// The weights' epoch the scheduler stored and looks up under (weights_epoch): a tier
  /// writes it with each block and finds a block only under the epoch it was written with.
  std::uint64_t epoch = 0;
};

/// Checks the invariants SEMANTICS 6 states for every GPU spec: sum(group_sizes) ==
/// len(block_ids), one size and one index per group, no null id, and per group
/// cdiv(group_sizes[g] + block_indices[g] % f, f) == the number of that group's keys (host
/// blocks), with keys grouped by ascending group. Throws invalid_argument naming the job and
/// group. The copy planner relies on exactly these.
KVOFFLOAD_EXPORT void check_job_invariants(const TransferJob& job, std::int64_t num_groups,
                                           std::int64_t block_size_factor);

/// The part of check_job_invariants that does not read gpu.block_ids (the device-table path
/// takes its ids from a device table): one size and one non-negative index per group, and
/// per group the number of host blocks its size and index need, keys grouped by group.
KVOFFLOAD_EXPORT void check_job_shape(const TransferJob& job, std::int64_t num_groups,
                                      std::int64_t block_size_factor);

}  // namespace kvoffload
