#pragma once

// Host-only declarations of the GPU compaction of null block ids (CUB); safe to include from
// .cpp files. Nothing throws or logs: functions return cudaError_t values (as int).

#include <cstddef>
#include <cstdint>

namespace kvoffload::detail {

/// Bytes of temporary storage compact_block_ids needs for up to `max_ids` ids in up to
/// `max_groups` groups (size it once, reuse it: CUB's two-phase pattern).
int compaction_temp_bytes(std::int64_t max_ids, int max_groups, std::size_t* bytes) noexcept;

/// On `stream`, with no host round trip: copies the non-null ids of `ids` (n entries, group g's
/// entries at [offsets[g], offsets[g + 1])) to `out`, writes their number to *count, each
/// group's number to group_counts[g], and sets *mismatch to 1 if any group's count differs
/// from expected[g] (the job's group_sizes) or, when max_id is given, an id of group g is
/// negative or above max_id[g]. All pointers are device memory.
int compact_block_ids(const std::int32_t* ids, std::int64_t n, const std::int64_t* offsets,
                      int groups, const std::int64_t* expected, std::int32_t* out,
                      const std::int64_t* max_id, std::int64_t* count, std::int64_t* group_counts,
                      int* mismatch, void* temp, std::size_t temp_bytes, void* stream) noexcept;

}  // namespace kvoffload::detail
