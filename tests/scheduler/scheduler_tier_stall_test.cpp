// docs/semantics.md "Tiers", "A slow tier never holds a step" (issue 48, item 5): a promotion
// past its tier's promote_timeout_ms is a miss for lookups, and a tier job in flight at
// reset_cache is not flushed: its host blocks and slots stay held until its last report, so a
// late read never lands in a block handed out again.

#include <algorithm>
#include <chrono>
#include <thread>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "kvoffload/error.hpp"
#include "support/tiered_fixture.hpp"

using namespace kvtest;

namespace {

template <typename T>
bool shares_any(const std::vector<T>& a, const std::vector<T>& b) {
  return std::any_of(a.begin(), a.end(),
                     [&](T id) { return std::find(b.begin(), b.end(), id) != b.end(); });
}

/// a's four blocks in the tier only (b's evicted them from a host cache of 4), and c's lookup
/// of them planned and emitted: the promotion job.
TierJob promotion_in_flight(Tiered& t, const std::vector<BlockHash>& a) {
  t.store("a", a);
  t.complete(t.tier_jobs().at(0));
  t.store("b", chain_hashes("b", 4));
  t.complete(t.tier_jobs().at(0));
  REQUIRE_FALSE(t.h.lookup("c", a, 65, 0).has_value());
  const auto jobs = t.tier_jobs();
  REQUIRE(jobs.size() == 1);
  REQUIRE(jobs[0].kind == JobKind::promote);
  return jobs[0];
}

}  // namespace

TEST_CASE("A promotion past promote_timeout_ms is a miss; its host blocks wait for the report",
          "[scheduler][tier]") {
  SchedulerConfig c = tiered({full()}, 4, 16);
  c.tiers[0].promote_timeout_ms = 1000;  // wide: a loaded CI runner must not reach it early
  Tiered t(c);
  const auto a = chain_hashes("a", 4);
  const TierJob p = promotion_in_flight(t, a);
  CHECK_FALSE(t.h.s.lookup("c", 0).has_value());  // within the deadline: retry later
  CHECK(t.h.s.tier_stats(0).promotions_overdue == 0);

  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  // Past it: c computes a's tokens itself (the first key is a miss) and is not asked to wait.
  CHECK(t.h.s.lookup("c", 0) == 0);
  CHECK(t.h.s.tier_stats(0).promotions_overdue == 4);
  CHECK(t.h.lookup("d", a, 65, 0) == 0);               // another request: the same
  CHECK(t.h.s.tier_stats(0).promotions_overdue == 4);  // counted once per promotion
  for (const BlockHash& hash : a) CHECK(t.in_host(hash) == LookupResult::pending);

  // The four host blocks the late read fills are none of a new store's.
  REQUIRE(t.h.lookup("e", chain_hashes("e", 2), 33, 0).has_value());
  t.h.alloc_none("e");
  const StepResult st = t.h.step("e", 0, 33, {ids(500, 3)});
  CHECK(st.store_jobs.empty());  // no host room: all four are being filled
  CHECK(st.flush.empty());       // and nothing waits for the promotion

  // The promotion completes after all: its blocks are ordinary hits from now on.
  t.complete(p);
  CHECK(t.h.lookup("f", a, 65, 0) == 64);
  CHECK(t.h.s.tier_stats(0).promotions == 4);
}

TEST_CASE("While an overdue promotion is out, lookups do not ask its tier", "[scheduler][tier]") {
  SchedulerConfig c = tiered({full()}, 8, 16);
  c.tiers[0].promote_timeout_ms = 200;
  Tiered t(c);
  const auto a = chain_hashes("a", 4);
  const auto b = chain_hashes("b", 4);
  t.store("a", a);
  t.complete(t.tier_jobs().at(0));
  t.store("b", b);
  t.complete(t.tier_jobs().at(0));
  t.store("x", chain_hashes("x", 4));  // evicts a: a is in the tier only
  t.complete(t.tier_jobs().at(0));
  REQUIRE_FALSE(t.h.lookup("c", a, 65, 0).has_value());
  const auto promoting_a = t.tier_jobs();  // takes b's host blocks: b is in the tier only
  REQUIRE(promoting_a.size() == 1);
  for (const BlockHash& hash : b) REQUIRE(t.in_host(hash) == LookupResult::miss);

  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(t.h.s.lookup("c", 0) == 0);  // overdue: the tier is taken as stalled
  // g's keys are in the tier, but asking it would make g wait on the stalled disk too.
  CHECK(t.h.lookup("g", b, 65, 0) == 0);
  CHECK(t.tier_jobs().empty());

  t.complete(promoting_a.at(0));  // the disk answers: the tier is asked again
  CHECK_FALSE(t.h.lookup("h", b, 65, 0).has_value());
  const auto promoting_b = t.tier_jobs();
  REQUIRE(promoting_b.size() == 1);
  CHECK(promoting_b[0].keys == keys_of(b));
}

TEST_CASE("An overdue promotion orphaned by a reset keeps its tier unasked until it reports",
          "[scheduler][tier]") {
  SchedulerConfig c = tiered({full()}, 8, 16);
  c.tiers[0].promote_timeout_ms = 200;
  Tiered t(c);
  const auto a = chain_hashes("a", 4);
  t.store("a", a);
  t.complete(t.tier_jobs().at(0));
  t.store("x", chain_hashes("x", 4));
  t.complete(t.tier_jobs().at(0));
  t.store("y", chain_hashes("y", 4));  // evicts a
  t.complete(t.tier_jobs().at(0));
  REQUIRE_FALSE(t.h.lookup("c", a, 65, 0).has_value());
  const auto p = t.tier_jobs();
  REQUIRE(p.size() == 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(t.h.s.lookup("c", 0) == 0);  // overdue: the tier is stalled
  t.h.s.reset_cache("w2");
  // Under the new weights, z is written to the tier and evicted from host memory; the tier
  // still answers nothing while the stalled read is out.
  const auto z = chain_hashes("z", 4);
  t.store("z", z);
  t.complete(t.tier_jobs().at(0));
  t.store("q", chain_hashes("q", 4));  // 4 held + 4 free: evicts z
  t.complete(t.tier_jobs().at(0));
  REQUIRE(t.in_host(z[0]) == LookupResult::miss);
  CHECK(t.h.lookup("r", z, 65, 0) == 0);
  t.complete(p[0]);                                    // the orphan's report ends the stall
  CHECK_FALSE(t.h.lookup("s", z, 65, 0).has_value());  // promoted now
  CHECK(t.tier_jobs().size() == 1);
}

TEST_CASE("Orphan writes still fill the tier's write queue until they report",
          "[scheduler][tier]") {
  Tiered t(tiered({full()}, 8, 16, 0, /*queue=*/2));
  t.store("a", chain_hashes("a", 2));
  const auto w = t.tier_jobs();
  REQUIRE(w.size() == 1);
  t.h.s.reset_cache("w2");
  t.store("b", chain_hashes("b", 2));
  CHECK(t.tier_jobs().empty());  // the queue is full of a's write, on a disk that may be dead
  CHECK(t.h.s.tier_stats(0).writes_queue_full == 2);
  t.complete(w[0]);
  t.store("c", chain_hashes("c", 2));
  CHECK(t.tier_jobs().size() == 1);
}

TEST_CASE("promote_timeout_ms is checked and defaults to 5 s", "[scheduler][tier]") {
  SchedulerConfig c = tiered({full()}, 4, 16);
  c.tiers[0].promote_timeout_ms = -1;
  CHECK_THROWS_WITH(Scheduler(c), Catch::Matchers::ContainsSubstring(
                                      "tiers[0].promote_timeout_ms must be 0 (5000) to 3600000"));
  c.tiers[0].promote_timeout_ms = 3'600'001;
  CHECK_THROWS_AS(Scheduler(c), invalid_argument);
  c.tiers[0].promote_timeout_ms = 0;
  Tiered t(c);
  const auto a = chain_hashes("a", 4);
  (void)promotion_in_flight(t, a);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  CHECK_FALSE(t.h.s.lookup("c", 0).has_value());  // 0 is 5 s, not "no wait"
}

TEST_CASE("A tier job in flight at reset_cache is held, not flushed, until its last report",
          "[scheduler][tier]") {
  SchedulerConfig c = tiered({full()}, 6, 16);
  c.num_workers = 2;
  Tiered t(c);
  const auto a = chain_hashes("a", 2);
  const TransferJob stored = t.store("a", a);
  const auto writes = t.tier_jobs();
  REQUIRE(writes.size() == 1);
  const TierJob& w = writes[0];

  t.h.s.reset_cache("new weights");
  const StepResult next = t.h.s.build_step({});
  CHECK(next.flush.empty());  // the step does not wait for the disk
  CHECK(next.tier_jobs.empty());
  CHECK(t.h.s.manager().num_held() == 2);
  CHECK(t.h.s.tier_index(0).num_held() == 2);
  CHECK(t.h.s.cache_stats().blocks_free == 4);
  CHECK(t.in_tier(a[0]) == LookupResult::miss);  // the index forgot it all the same

  // A new store gets neither the held host blocks nor, for its write, the held slots.
  const auto b = chain_hashes("b", 4);
  const TransferJob sb = t.store("b", b);
  CHECK_FALSE(shares_any(sb.host_block_ids, w.host_block_ids));
  const auto b_writes = t.tier_jobs();
  REQUIRE(b_writes.size() == 1);
  CHECK_FALSE(shares_any(b_writes[0].slots, w.slots));
  CHECK(w.host_block_ids == stored.host_block_ids);
  (void)t.h.complete(b_writes[0].id);  // b's write, issued after the reset: an ordinary job

  // A second reset keeps them held; so does one worker's report of two.
  t.h.s.reset_cache("newer weights");
  CHECK(t.h.s.manager().num_held() == 2);
  (void)t.h.s.on_completed(std::vector<JobReport>{{w.id, 1, true}});
  CHECK(t.h.s.manager().num_held() == 2);
  // More reports than workers left is API misuse, named.
  CHECK_THROWS_WITH(t.h.s.on_completed(std::vector<JobReport>{{w.id, 2, true}}),
                    Catch::Matchers::ContainsSubstring("job " + std::to_string(w.id)));
  (void)t.h.s.on_completed(std::vector<JobReport>{{w.id, 1, true}});
  CHECK(t.h.s.manager().num_held() == 0);
  CHECK(t.h.s.tier_index(0).num_held() == 0);
  CHECK(t.h.s.cache_stats().blocks_free == 6);
  (void)t.h.s.on_completed(std::vector<JobReport>{{w.id, 1, true}});  // stale now: ignored
}

TEST_CASE("A tier job queued but not yet emitted at reset_cache is dropped, not held",
          "[scheduler][tier]") {
  Tiered t(tiered({full()}, 4, 16));
  t.store("a", chain_hashes("a", 2));  // its write-through waits for the next step
  t.h.s.reset_cache("new weights");    // before that step
  CHECK(t.h.s.manager().num_held() == 0);
  CHECK(t.h.s.tier_index(0).num_held() == 0);
  CHECK(t.tier_jobs().empty());
  CHECK(t.h.s.cache_stats().blocks_free == 4);
}

TEST_CASE("A host block written to two tiers stays held until both writes report",
          "[scheduler][tier]") {
  SchedulerConfig c = tiered({full()}, 4, 8);
  TierConfig second = c.tiers[0];
  c.tiers.push_back(second);
  Tiered t(c);
  const auto a = chain_hashes("a", 2);
  t.store("a", a);
  const auto writes = t.tier_jobs();
  REQUIRE(writes.size() == 2);
  CHECK(writes[0].host_block_ids == writes[1].host_block_ids);
  t.h.s.reset_cache("new weights");
  CHECK(t.h.s.manager().num_held() == 2);
  t.complete(writes[1]);
  CHECK(t.h.s.manager().num_held() == 2);  // tier 0's write may still read them
  CHECK(t.h.s.tier_index(1).num_held() == 0);
  t.complete(writes[0], false);  // a failed report releases them too
  CHECK(t.h.s.manager().num_held() == 0);
  CHECK(t.h.s.tier_index(0).num_held() == 0);
}
