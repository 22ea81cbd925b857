#pragma once

// Internal: the block-reuse fence, which in-flight store jobs still read a GPU block
// (SEMANTICS 6.7 and 8): a block given to a request again while a store reads it flushes
// that store. Almost always one job per block, kept in a dense array indexed by block id
// (engines number their GPU blocks densely; every new block of every step is checked, and new
// blocks come in runs of consecutive ids, so the array is read sequentially where a hash table
// would miss the cache once per block). The rare further jobs on the same block go to a short
// side list.

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kvoffload/types.hpp"

namespace kvoffload {

class BlockReuseFence {
 public:
  /// Sizes the table for block ids below `blocks` (it still grows past them).
  void reserve(std::size_t blocks) {
    if (blocks > first_.size()) first_.resize(blocks, kNone);
  }

  void add(GpuBlockId block, JobId job) {
    const auto b = static_cast<std::size_t>(block);
    if (b >= first_.size()) first_.resize(std::max(b + 1, 2 * first_.size()), kNone);
    if (first_[b] == kNone) {
      first_[b] = job;
      ++count_;
    } else {
      more_.emplace_back(block, job);
    }
  }

  /// add() for every block of `blocks` (sizing the array once).
  void add_all(std::span<const GpuBlockId> blocks, JobId job) {
    if (blocks.empty()) return;
    const auto most = static_cast<std::size_t>(*std::max_element(blocks.begin(), blocks.end()));
    if (most >= first_.size()) first_.resize(std::max(most + 1, 2 * first_.size()), kNone);
    for (const GpuBlockId block : blocks) {
      JobId& slot = first_[static_cast<std::size_t>(block)];
      if (slot == kNone) {
        slot = job;
        ++count_;
      } else {
        more_.emplace_back(block, job);
      }
    }
  }

  void remove(GpuBlockId block, JobId job) {
    const auto b = static_cast<std::size_t>(block);
    if (b >= first_.size()) return;
    if (first_[b] == job) {
      first_[b] = kNone;
      --count_;
      // Promote a further job on the same block, if any.
      auto it =
          std::find_if(more_.begin(), more_.end(), [&](const auto& e) { return e.first == block; });
      if (it != more_.end()) {
        first_[b] = it->second;
        ++count_;
        *it = more_.back();
        more_.pop_back();
      }
      return;
    }
    auto it = std::find(more_.begin(), more_.end(), std::make_pair(block, job));
    if (it != more_.end()) {
      *it = more_.back();
      more_.pop_back();
    }
  }

  /// Appends to `out` the jobs registered on each of `blocks`: one tight loop over the dense
  /// array, as every new block of every step goes through it.
  void collect(std::span<const GpuBlockId> blocks, std::vector<JobId>& out) const {
    if (count_ == 0) return;
    const std::size_t n = first_.size();
    const JobId* first = first_.data();
    for (const GpuBlockId block : blocks) {
      const auto b = static_cast<std::size_t>(block);
      if (b >= n || first[b] == kNone) [[likely]]
        continue;
      out.push_back(first[b]);
      for (const auto& [blk, job] : more_) {
        if (blk == block) out.push_back(job);
      }
    }
  }

  void clear() {
    std::fill(first_.begin(), first_.end(), kNone);
    more_.clear();
    count_ = 0;
  }

 private:
  static constexpr JobId kNone = -1;
  std::vector<JobId> first_;                        // per GPU block id
  std::vector<std::pair<GpuBlockId, JobId>> more_;  // further jobs on a block
  std::size_t count_ = 0;                           // blocks with a job (collect's fast path)
};

}  // namespace kvoffload
