// SEMANTICS 6: store jobs, with exact per-group block counting.

#include <catch2/catch_test_macros.hpp>

#include <limits>

#include "kvoffload/error.hpp"

#include "support/scheduler_fixture.hpp"

using namespace kvtest;

TEST_CASE(
    "Straddle: a sliding-window block whose leading sub-blocks are null counts only the "
    "real ones",
    "[scheduler][store]") {
  // shared/traces/seed-straddle: f = 3, the window group's ids are [0, 0, 13, 14, ..., 22].
  Harness h(make_config({full(16), window(32, 16)}, 3, 16));
  const auto hashes = chain_hashes("straddle", 12);
  REQUIRE(h.lookup("r1", hashes, 192, 64) == 0);
  h.alloc_none("r1");
  const StepResult step = h.step("r1", 64, 128, {ids(1, 12), ids(13, 10, 2)});
  REQUIRE(step.store_jobs.size() == 1);
  const TransferJob& job = step.store_jobs[0];
  CHECK(job.gpu.group_sizes == std::vector<std::int64_t>{12, 10});  // vLLM said {12, 12}
  CHECK(job.gpu.block_indices == std::vector<std::int64_t>{0, 2});
  CHECK(job.gpu.block_ids == ids(1, 22));
  CHECK(job.keys.size() == 8);
  CHECK(job.host_block_ids == std::vector<HostBlockId>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK_NOTHROW(check_job_invariants(job, 2, 3));
}

TEST_CASE("vLLM's production symptom: factor 16, a half-null window block and 125 full blocks",
          "[scheduler][store]") {
  // Group 0 (sliding window) stores one offloaded block whose first 8 of 16 GPU sub-blocks are
  // null; group 1 (full attention) stores 125 blocks. vLLM emitted group sizes [16, 2000] for
  // 2008 ids and the worker asserted.
  Harness h(make_config({window(256, 16), full(16)}, 16, 1000));
  const auto hashes = chain_hashes("prod", 2000);
  REQUIRE(h.lookup("r", hashes, 32000, 0) == 0);
  h.alloc_none("r");
  const StepResult step = h.step("r", 0, 32000, {ids(1, 8, 1992), ids(5000, 2000)});
  REQUIRE(step.store_jobs.size() == 1);
  const TransferJob& job = step.store_jobs[0];
  CHECK(job.gpu.group_sizes == std::vector<std::int64_t>{8, 2000});
  CHECK(job.gpu.block_indices == std::vector<std::int64_t>{1992, 0});
  CHECK(job.gpu.block_ids.size() == 2008);
  CHECK(job.keys.size() == 126);
  CHECK(job.keys[0].group == 0);
  CHECK(job.keys[0].hash == hashes[124 * 16 + 15]);  // the last hash the window block covers
  CHECK_NOTHROW(check_job_invariants(job, 2, 16));
}

TEST_CASE("Keys are the hash of the last hash block each offloaded block covers",
          "[scheduler][store]") {
  // gpu block 16, f = 2, hash block 8: hash_factor 4.
  Harness h(make_config({full(16)}, 2, 8, 8));
  const auto hashes = chain_hashes("k", 8);
  REQUIRE(h.lookup("r", hashes, 64, 0) == 0);
  h.alloc_none("r");
  const StepResult step = h.step("r", 0, 64, {ids(1, 4)});
  REQUIRE(step.store_jobs.size() == 1);
  REQUIRE(step.store_jobs[0].keys.size() == 2);
  CHECK(step.store_jobs[0].keys[0].hash == hashes[3]);
  CHECK(step.store_jobs[0].keys[1].hash == hashes[7]);
}

TEST_CASE("Only whole offloaded blocks are stored, each once, as tokens are computed",
          "[scheduler][store]") {
  Harness h(make_config({full(16)}, 2, 8));
  const auto hashes = chain_hashes("grow", 6);
  REQUIRE(h.lookup("r", hashes, 96, 0) == 0);
  h.alloc_none("r");
  // 40 tokens: one offloaded block (32) is complete.
  StepResult s1 = h.step("r", 0, 40, {ids(1, 3)});
  REQUIRE(s1.store_jobs.size() == 1);
  CHECK(s1.store_jobs[0].gpu.block_ids == ids(1, 2));
  // 24 more (64): the second block.
  StepResult s2 = h.step("r", 40, 24, {ids(4, 1)});
  REQUIRE(s2.store_jobs.size() == 1);
  CHECK(s2.store_jobs[0].gpu.block_ids == std::vector<GpuBlockId>{3, 4});
  CHECK(s2.store_jobs[0].gpu.block_indices == std::vector<std::int64_t>{2});
  // 16 more (80): nothing new is complete.
  CHECK(h.step("r", 64, 16, {ids(5, 1)}).store_jobs.empty());
}

TEST_CASE("Entirely null blocks are not candidates and advance next_stored", "[scheduler][store]") {
  // A mamba group keeps only its last block; the others are null.
  Harness h(make_config({full(16), mamba(16)}, 1, 16));
  const auto hashes = chain_hashes("m", 4);
  REQUIRE(h.lookup("r", hashes, 65, 0) == 0);
  h.alloc_none("r");
  const StepResult step = h.step("r", 0, 64, {ids(1, 4), ids(9, 1, 3)});
  REQUIRE(step.store_jobs.size() == 1);
  const TransferJob& job = step.store_jobs[0];
  CHECK(job.gpu.group_sizes == std::vector<std::int64_t>{4, 1});
  CHECK(job.gpu.block_indices == std::vector<std::int64_t>{0, 3});
  CHECK(job.keys.size() == 5);
}

TEST_CASE("A step with no room in the host cache stores nothing and retries next step",
          "[scheduler][store]") {
  Harness h(make_config({full(16)}, 1, 2));
  REQUIRE(h.lookup("a", chain_hashes("a", 2), 32, 0) == 0);
  h.alloc_none("a");
  const StepResult first = h.step("a", 0, 32, {ids(1, 2)});
  REQUIRE(first.store_jobs.size() == 1);  // fills the pool; still writing
  REQUIRE(h.lookup("b", chain_hashes("b", 2), 32, 0) == 0);
  h.alloc_none("b");
  CHECK(h.step("b", 0, 32, {ids(10, 2)}).store_jobs.empty());  // nothing evictable
  CHECK(h.s.cache_stats().stores_without_room == 1);
  CHECK(h.s.manager().stats().store_rejections == 1);
  h.complete(first.store_jobs[0].id);
  // next_stored did not move: the same blocks are stored now, evicting a's.
  const StepResult retry = h.step("b", 32, 1, {{}});
  REQUIRE(retry.store_jobs.size() == 1);
  CHECK(retry.store_jobs[0].gpu.block_ids == ids(10, 2));
  const auto events = h.s.take_events();
  REQUIRE(events.size() == 2);
  CHECK(events[1].removed);
  CHECK(events[1].keys.size() == 2);
}

TEST_CASE("Keys already in the cache are not stored again", "[scheduler][store]") {
  Harness h(make_config({full(16)}, 1, 8));
  const auto shared = chain_hashes("shared", 2);
  REQUIRE(h.lookup("a", shared, 32, 0) == 0);
  h.alloc_none("a");
  const StepResult a = h.step("a", 0, 32, {ids(1, 2)});
  REQUIRE(a.store_jobs.size() == 1);
  const auto b_hashes = extend_hashes(shared, "b", 3);
  // b shares a's two blocks, still being written: a lookup defers...
  REQUIRE_FALSE(h.lookup("b", b_hashes, 48, 0).has_value());
  // ...and a store of b's blocks drops the two pending keys.
  h.alloc_none("b");
  const StepResult b = h.step("b", 0, 48, {ids(20, 3)});
  REQUIRE(b.store_jobs.size() == 1);
  CHECK(b.store_jobs[0].keys.size() == 1);
  CHECK(b.store_jobs[0].gpu.block_ids == std::vector<GpuBlockId>{22});
  CHECK(b.store_jobs[0].gpu.block_indices == std::vector<std::int64_t>{2});
}

TEST_CASE("Store jobs come in the order of the scheduled requests", "[scheduler][store]") {
  Harness h(make_config({full(16)}, 1, 8));
  for (const char* r : {"x", "y"}) {
    REQUIRE(h.lookup(r, chain_hashes(r, 1), 16, 0) == 0);
    h.alloc_none(r);
  }
  std::vector<ScheduledRequest> entries(2);
  entries[0] = {"y", 0, 16, {ids(1, 1)}, false};
  entries[1] = {"x", 0, 16, {ids(2, 1)}, false};
  const StepResult step = h.s.build_step(entries);
  REQUIRE(step.store_jobs.size() == 2);
  CHECK(step.store_jobs[0].request_id == "y");
  CHECK(step.store_jobs[1].request_id == "x");
  CHECK(step.store_jobs[0].id < step.store_jobs[1].id);
}

TEST_CASE("limit_stores: nothing past the limit is stored, and idle_window knows it",
          "[scheduler][store]") {
  // Offloaded blocks of 32 tokens (f = 2); the limit 70 allows two of the request's three.
  Harness h(make_config({full(16)}, 2, 8));
  const auto hashes = chain_hashes("limit", 6);
  REQUIRE(h.lookup("r", hashes, 96, 0) == 0);
  h.s.limit_stores("r", 70);
  h.alloc_none("r");
  StepResult s1 = h.step("r", 0, 96, {ids(1, 6)});
  REQUIRE(s1.store_jobs.size() == 1);
  CHECK(s1.store_jobs[0].gpu.block_ids == ids(1, 4));
  CHECK(s1.store_jobs[0].keys.size() == 2);
  // From here on nothing is due however far the request goes: the window never ends.
  const Scheduler::IdleWindow w = h.s.idle_window("r");
  CHECK(w.lo == 64);
  CHECK(w.hi == std::numeric_limits<std::int64_t>::max());
  // Without the limit the third block would be stored at 96; with 0 nothing at all.
  Harness none(make_config({full(16)}, 2, 8));
  REQUIRE(none.lookup("q", hashes, 96, 0) == 0);
  none.s.limit_stores("q", 0);
  none.alloc_none("q");
  CHECK(none.step("q", 0, 96, {ids(1, 6)}).store_jobs.empty());
  CHECK_THROWS_AS(h.s.limit_stores("nobody", 1), kvoffload::invalid_argument);
  CHECK_THROWS_AS(h.s.limit_stores("r", -1), kvoffload::invalid_argument);
}

TEST_CASE("idle_window: the token counts at which a step stores nothing", "[scheduler][store]") {
  Harness h(make_config({full(16)}, 2, 8));
  const auto hashes = chain_hashes("window", 6);
  CHECK(h.s.idle_window("r").lo >= h.s.idle_window("r").hi);  // unknown: no window
  REQUIRE(h.lookup("r", hashes, 96, 0) == 0);
  h.alloc_none("r");
  // Nothing stored yet: idle while fewer than 32 tokens are computed.
  Scheduler::IdleWindow w = h.s.idle_window("r");
  CHECK(w.lo == 0);
  CHECK(w.hi == 32);
  REQUIRE(h.step("r", 0, 40, {ids(1, 3)}).store_jobs.size() == 1);
  w = h.s.idle_window("r");
  CHECK(w.lo == 32);
  CHECK(w.hi == 64);
  // Inside the window a step does nothing; at its end it stores.
  CHECK(h.step("r", 40, 23, {ids(4, 1)}).store_jobs.empty());
  CHECK(h.step("r", 63, 1, {{}}).store_jobs.size() == 1);
}
