#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvoffload/export.hpp"
#include "kvoffload/job.hpp"
#include "kvoffload/kv_layout.hpp"

namespace kvoffload {

/// One copy: `bytes` from `src` to `dst`.
struct CopyDescriptor {
  std::uintptr_t src = 0;
  std::uintptr_t dst = 0;
  std::uint64_t bytes = 0;
};

/// A job's copies, coalesced, largest first.
/// A point in the engine's compute work that a backend marked (Backend::mark_compute); 0: none.
using ComputeMark = std::uint64_t;

struct CopyPlan {
  JobId job = 0;
  JobKind kind = JobKind::store;
  std::vector<CopyDescriptor> descriptors;
  std::uint64_t total_bytes = 0;
  /// A deferred store's mark, taken when the engine submitted it: the copies wait for the
  /// engine's work up to that point only, not for what the engine queued after it. 0: they
  /// wait for the engine's work queued before this submission.
  ComputeMark compute_mark = 0;
};

/// Where host blocks live: block i at base + i * block_stride_bytes + row_offset, with room for
/// row_bytes (a tensor-parallel worker's row of the shared pool, or the whole block).
struct HostRegion {
  std::uintptr_t base = 0;
  std::int64_t num_blocks = 0;
  std::int64_t block_stride_bytes = 0;
  std::int64_t row_offset = 0;
  std::int64_t row_bytes = 0;
  /// Host blocks per device registration (PinnedHostPool::blocks_per_registration): a copy
  /// never spans two, since CUDA refuses a cudaMemcpy*Async whose host range crosses from one
  /// cudaHostRegister range into the next (cudaErrorInvalidValue, seen on an H200), however
  /// adjacent they are. 0: the region is one registration (or none).
  std::int64_t blocks_per_registration = 0;
};

/// Turns a job into copy descriptors for one worker: for each group it skips
/// block_indices[g] % f sub-blocks of the group's first host block, pairs each GPU block with
/// the next host sub-block, and copies every tensor of the group. A job that breaks the
/// SEMANTICS 6 invariants (the pre-fix sliding-window counting among them) or points outside
/// the layout or the host region is refused with invalid_argument naming the job and group:
/// never a wrong copy. Contiguous pieces (on both sides) are merged, except across the seam of
/// two host registrations (HostRegion::blocks_per_registration). A block the job would write
/// twice is refused too (a load naming one GPU block twice, within a group or in two groups
/// that share a tensor; a store naming one host block twice): two copies into one block leave
/// whichever lands last. Reading a block twice is allowed. Thread-safe (const).
class KVOFFLOAD_EXPORT CopyPlanner {
 public:
  /// Throws invalid_argument if a group's host block does not fit in host.row_bytes.
  CopyPlanner(const KvLayout& layout, const HostRegion& host);

  /// Fills `plan` (reusing its capacity: no allocation once it is large enough).
  void plan(const TransferJob& job, JobKind kind, CopyPlan& plan) const;

  [[nodiscard]] const KvLayout& layout() const noexcept { return layout_; }
  [[nodiscard]] const HostRegion& host() const noexcept { return host_; }

 private:
  void check(const TransferJob& job) const;

  /// Throws for a block the job writes twice: a GPU block a load names twice, a host block a
  /// store names twice (a block read twice is harmless).
  void check_duplicates(const TransferJob& job, JobKind kind) const;

  const KvLayout& layout_;
  HostRegion host_;
  std::vector<std::int64_t> max_block_id_;  // per group: the smallest num_blocks of its tensors
  // Per group: the lowest group it shares a tensor with, directly or through others (itself
  // when it shares none): GPU ids of groups of one class name the same memory.
  std::vector<std::size_t> tensor_class_;
};

}  // namespace kvoffload
