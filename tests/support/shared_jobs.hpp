#pragma once

// For the shared tier's tests: a tier job of keys and host blocks, and running one to its end.

#include <catch2/catch_test_macros.hpp>

#include <span>
#include <vector>

#include "kvoffload/job.hpp"
#include "kvoffload/tiers/shared_tier.hpp"

namespace kvoffload::test {

/// A promote or write job of `keys` from or into `hosts` (a shared tier has no slots).
inline TierJob job(JobId id, JobKind kind, const std::vector<Key>& keys,
                   const std::vector<HostBlockId>& hosts) {
  TierJob j;
  j.id = id;
  j.kind = kind;
  j.keys = keys;
  j.host_block_ids = hosts;
  j.slots.assign(keys.size(), -1);
  return j;
}

/// Submits `j`, waits for it, and returns its report (the only one finished).
inline FinishedTierJob run(SharedTier& t, const TierJob& j) {
  t.submit(j);
  const JobId id = j.id;
  t.wait(std::span(&id, 1));
  const auto done = t.get_finished();
  REQUIRE(done.size() == 1);
  REQUIRE(done[0].job == j.id);
  return done[0];
}

}  // namespace kvoffload::test
