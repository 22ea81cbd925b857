#pragma once

// A scheduler with one tier (or more) below its host cache, for the tier tests: stores that
// write through, the step's tier jobs, and their reports, in short calls.

#include <string>
#include <vector>

#include <catch2/catch_test_macros.hpp>

#include "support/scheduler_fixture.hpp"

namespace kvtest {

inline SchedulerConfig tiered(std::vector<GroupConfig> groups, std::int64_t host_blocks,
                              std::int64_t tier_blocks, std::int64_t threshold = 0,
                              std::int64_t queue = 0) {
  SchedulerConfig c = make_config(std::move(groups), 1, host_blocks);
  TierConfig t;
  t.blocks = tier_blocks;
  t.store_threshold = threshold;
  t.write_queue_blocks = queue;
  c.tiers.push_back(t);
  return c;
}

struct Tiered {
  explicit Tiered(const SchedulerConfig& c) : h(c), groups(c.groups.size()) {}

  /// A new request of `blocks` full blocks stored to host memory; returns its store job.
  TransferJob store(const std::string& req, const std::vector<BlockHash>& hashes) {
    const auto n = static_cast<std::int64_t>(hashes.size());
    REQUIRE(h.lookup(req, hashes, n * 16 + 1, 0).has_value());
    h.alloc_none(req);
    std::vector<std::vector<GpuBlockId>> fresh;
    for (std::size_t g = 0; g < groups; ++g) {
      fresh.push_back(ids(next_id, n + 1));
      next_id += static_cast<GpuBlockId>(n + 1);
    }
    StepResult st = h.step(req, 0, n * 16 + 1, fresh);
    REQUIRE(st.store_jobs.size() == 1);
    CHECK(st.tier_jobs.empty());
    h.complete(st.store_jobs[0].id);
    return st.store_jobs[0];
  }
  /// The tier jobs of an empty step.
  std::vector<TierJob> tier_jobs() { return h.s.build_step({}).tier_jobs; }
  void complete(const TierJob& job, bool ok = true) {
    (void)h.s.on_completed(std::vector<JobReport>{{job.id, 1, ok}});
  }
  LookupResult in_tier(const BlockHash& hash, std::uint32_t g = 0) const {
    return h.s.tier_index(0).peek(Key{hash, g});
  }
  LookupResult in_host(const BlockHash& hash, std::uint32_t g = 0) const {
    return h.s.manager().peek(Key{hash, g});
  }

  Harness h;
  std::size_t groups;
  GpuBlockId next_id = 1;
};

inline std::vector<Key> keys_of(const std::vector<BlockHash>& hashes, std::uint32_t g = 0) {
  std::vector<Key> out;
  for (const BlockHash& h : hashes) out.push_back(Key{h, g});
  return out;
}

}  // namespace kvtest
