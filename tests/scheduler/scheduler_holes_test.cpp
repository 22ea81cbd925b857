// SEMANTICS 6.3 and 6.9: block tables with nulls anywhere (vLLM's align-mode mamba, window
// blocks freed while the request runs) and blocks the engine hands out again before a store
// reads them. The tables are the ones issue 54 saw vLLM make; every expected job is derived by
// hand from the contract.

#include <catch2/catch_test_macros.hpp>

#include <algorithm>

#include "kvoffload/job.hpp"

#include "support/scheduler_fixture.hpp"

using namespace kvtest;

namespace {

std::vector<AllocatedGroup> allocation(std::vector<std::vector<GpuBlockId>> tables,
                                       std::vector<std::int64_t> computed) {
  std::vector<AllocatedGroup> groups;
  for (std::size_t g = 0; g < tables.size(); ++g) {
    groups.push_back(AllocatedGroup{std::move(tables[g]), computed[g]});
  }
  return groups;
}

/// The one load job a step emitted, with its GPU side as expected and the job invariants held.
void check_load(const StepResult& step, const std::vector<GpuBlockId>& block_ids,
                const std::vector<std::int64_t>& group_sizes,
                const std::vector<std::int64_t>& block_indices, std::int64_t f) {
  REQUIRE(step.load_jobs.size() == 1);
  const TransferJob& load = step.load_jobs[0];
  CHECK(load.gpu.block_ids == block_ids);
  CHECK(load.gpu.group_sizes == group_sizes);
  CHECK(load.gpu.block_indices == block_indices);
  CHECK_NOTHROW(check_job_invariants(load, static_cast<std::int64_t>(group_sizes.size()), f));
}

bool reads(const TransferJob& job, GpuBlockId id) {
  return std::find(job.gpu.block_ids.begin(), job.gpu.block_ids.end(), id) !=
         job.gpu.block_ids.end();
}

}  // namespace

TEST_CASE("Issue 54 (a): a mamba table with a null between states is stored, not refused",
          "[scheduler][store][holes]") {
  // f = 1, GPU blocks of 32. B hit 96 tokens in vLLM's prefix cache and prefilled 96 -> 160 in
  // one chunk: align mode materialised the state at the chunk's end only, so B's mamba table
  // is [0, 0, hit, 0, state]. The old whole-range check threw "null GPU block at position 3
  // after a non-null one" inside vLLM's build_connector_meta, killing the engine.
  Harness h(make_config({full(32), mamba(32)}, 1, 64, 32));
  const auto hashes = chain_hashes("shared", 5);
  REQUIRE(h.lookup("B", hashes, 180, 96) == 0);
  h.alloc_none("B");
  StepResult step;
  REQUIRE_NOTHROW(step = h.step("B", 96, 64, {ids(1, 5), {0, 0, 7, 0, 9}}, true));
  REQUIRE(step.store_jobs.size() == 1);
  const TransferJob& job = step.store_jobs[0];
  // Full attention: blocks 0-4. Mamba: the states at blocks 2 and 4 (block 3 holds none).
  CHECK(job.gpu.block_ids == std::vector<GpuBlockId>{1, 2, 3, 4, 5, 7, 9});
  CHECK(job.gpu.group_sizes == std::vector<std::int64_t>{5, 2});
  CHECK(job.gpu.block_indices == std::vector<std::int64_t>{0, 2});
  CHECK(job.keys.size() == 7);
  CHECK_NOTHROW(check_job_invariants(job, 2, 1));
  h.complete(job.id);
  // A later request with the same 160 tokens and more finds the state at 160.
  REQUIRE(h.lookup("C", extend_hashes(hashes, "C", 6), 200, 0) == 160);
}

TEST_CASE("Issue 54 (a) at f = 2: two 48-token chunks give [0, 0, 4, 0, 0, 11]",
          "[scheduler][store][holes]") {
  Harness h(make_config({full(16), mamba(16)}, 2, 64));
  const auto hashes = chain_hashes("chunks", 7);
  REQUIRE(h.lookup("A", hashes, 120, 0) == 0);
  h.alloc_none("A");
  StepResult s1 = h.step("A", 0, 48, {ids(1, 3), {0, 0, 4}});
  REQUIRE(s1.store_jobs.size() == 1);  // full block 0; mamba block 0 ([0, 0]) holds nothing
  CHECK(s1.store_jobs[0].gpu.group_sizes == std::vector<std::int64_t>{2, 0});
  StepResult s2;
  REQUIRE_NOTHROW(s2 = h.step("A", 48, 48, {{5, 6, 7}, {0, 0, 11}}));
  REQUIRE(s2.store_jobs.size() == 1);
  const TransferJob& job = s2.store_jobs[0];
  // Full blocks 1 and 2 ([3, 5], [6, 7]); mamba block 1 ([4, 0]) has no state at its end;
  // mamba block 2 ([0, 11]) is stored from sub-block 1: valid_from 1.
  CHECK(job.gpu.block_ids == std::vector<GpuBlockId>{3, 5, 6, 7, 11});
  CHECK(job.gpu.group_sizes == std::vector<std::int64_t>{4, 1});
  CHECK(job.gpu.block_indices == std::vector<std::int64_t>{2, 5});
  CHECK_NOTHROW(check_job_invariants(job, 2, 2));
  CHECK(h.s.stats().partial_stores == 1);
  h.complete(s1.store_jobs[0].id);
  h.complete(job.id);
  // A request sharing the first 96 tokens: the mamba state at 96 is sub-block 1 of block 2,
  // the one sub-block written, and the only one a load ending at 96 reads.
  const auto c_hashes = extend_hashes({hashes.begin(), hashes.begin() + 6}, "other", 8);
  REQUIRE(h.lookup("C", c_hashes, 130, 0) == 96);
  // vLLM's align-mode allocation: a null pad, then the block that receives the state.
  REQUIRE_NOTHROW(
      h.s.on_allocated("C", allocation({ids(21, 9), {0, 0, 0, 0, 0, 31, 32, 33, 34}}, {0, 5}), 96));
  check_load(h.s.build_step({}), {21, 22, 23, 24, 25, 26, 31}, {6, 1}, {0, 5}, 2);
}

TEST_CASE("Issue 54 (b): f = 3, two-block chunks; a hole inside a mamba block keeps its end",
          "[scheduler][store][holes]") {
  // [0, s1, 0, s3, 0, s5, 0, s7, 0, s9, 0, s11]: offloaded blocks 1 and 3 ([s3, 0, s5] and
  // [s9, 0, s11]) hold the state at their end in their last sub-block; blocks 0 and 2 none.
  // Both are stored from sub-block 2, and since a job's group may start inside its first
  // host block only, each goes into a job of its own.
  Harness h(make_config({full(16), mamba(16)}, 3, 64));
  const auto hashes = chain_hashes("f3", 13);
  REQUIRE(h.lookup("A", hashes, 210, 0) == 0);
  h.alloc_none("A");
  const std::vector<GpuBlockId> table{0, 51, 0, 53, 0, 55, 0, 57, 0, 59, 0, 61};
  StepResult step;
  REQUIRE_NOTHROW(step = h.step("A", 0, 192, {ids(1, 12), table}));
  REQUIRE(step.store_jobs.size() == 2);
  const TransferJob& first = step.store_jobs[0];
  const TransferJob& second = step.store_jobs[1];
  CHECK(first.gpu.block_ids == std::vector<GpuBlockId>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 55});
  CHECK(first.gpu.group_sizes == std::vector<std::int64_t>{12, 1});
  CHECK(first.gpu.block_indices == std::vector<std::int64_t>{0, 5});
  CHECK(first.keys.size() == 5);
  CHECK(second.gpu.block_ids == std::vector<GpuBlockId>{61});
  CHECK(second.gpu.group_sizes == std::vector<std::int64_t>{0, 1});
  CHECK(second.gpu.block_indices == std::vector<std::int64_t>{0, 11});
  CHECK(second.keys.size() == 1);
  CHECK_NOTHROW(check_job_invariants(first, 2, 3));
  CHECK_NOTHROW(check_job_invariants(second, 2, 3));
  CHECK(h.s.stats().partial_stores == 2);
  CHECK(h.s.stats().store_jobs == 2);
}

TEST_CASE("A full-attention block with a hole is skipped and counted, never refused",
          "[scheduler][store][holes]") {
  Harness h(make_config({full(16)}, 3, 64));
  REQUIRE(h.lookup("A", chain_hashes("hole", 9), 144, 0) == 0);
  h.alloc_none("A");
  StepResult step;
  REQUIRE_NOTHROW(step = h.step("A", 0, 144, {{1, 2, 3, 4, 0, 6, 0, 8, 9}}));
  // Block 0 is whole. Block 1 ([4, 0, 6]) has a hole: a prefix load would need sub-block 1,
  // which nobody wrote, so it is not stored. Block 2 ([0, 8, 9]) has leading nulls only: stored
  // from sub-block 1 as before (SEMANTICS 6.8: a miss for the prefix scan), in a job of its own
  // since it starts inside its host block after block 0.
  REQUIRE(step.store_jobs.size() == 2);
  CHECK(step.store_jobs[0].gpu.block_ids == std::vector<GpuBlockId>{1, 2, 3});
  CHECK(step.store_jobs[1].gpu.block_ids == std::vector<GpuBlockId>{8, 9});
  CHECK(step.store_jobs[1].gpu.block_indices == std::vector<std::int64_t>{7});
  CHECK(h.s.stats().unsafe_skips == 1);
  CHECK(h.s.stats().partial_stores == 1);
}

namespace {

/// Issue 54 (c) in small: A's store fills the host cache (in flight, so nothing can be
/// evicted), B's store finds no room and waits for a retry. Returns A's store job.
JobId fill_then_defer(Harness& h, std::int64_t f) {
  const std::int64_t n = 2 * f;  // two offloaded blocks per group
  REQUIRE(h.lookup("A", chain_hashes("A", 4 * static_cast<std::size_t>(f)), 64 * f, 0) == 0);
  h.alloc_none("A");
  const StepResult a = h.step("A", 0, 32 * f, {ids(1, n), ids(101, n)});
  REQUIRE(a.store_jobs.size() == 1);
  REQUIRE(a.store_jobs[0].keys.size() == 4);  // the whole host cache
  REQUIRE(h.lookup("B", chain_hashes("B", 4 * static_cast<std::size_t>(f)), 64 * f, 0) == 0);
  h.alloc_none("B");
  const StepResult b = h.step("B", 0, 32 * f, {ids(201, n), ids(301, n)});
  REQUIRE(b.store_jobs.empty());  // no room: retried later (SEMANTICS 6 step 5)
  return a.store_jobs[0].id;
}

}  // namespace

TEST_CASE("Issue 54 (c): a deferred store never reads a window block given to another request",
          "[scheduler][store][holes]") {
  // f = 1, window 16 (one block): B's window blocks 301, 302. vLLM frees 301 (outside the
  // window) and hands it to C; C's forward pass writes C's KV there. B's retried store must
  // leave 301 out: vLLM's own connector zeroes it (_update_req_states).
  for (const bool control : {false, true}) {
    INFO((control ? "control: 301 stays B's" : "301 goes to C"));
    {
      Harness h(make_config({full(16), window(16, 16)}, 1, 4));
      const JobId a = fill_then_defer(h, 1);
      REQUIRE(h.lookup("C", chain_hashes("C", 2), 32, 0) == 0);
      h.alloc_none("C");
      const GpuBlockId c_window = control ? 401 : 301;
      std::vector<ScheduledRequest> entries{
          {"B", 32, 1, {{}, {}}, false},  // B first: the step's allocations count before it
          {"C", 0, 8, {{400}, {c_window}}, true}};
      (void)h.s.build_step(entries);  // still no room: A's store runs
      h.complete(a);
      const StepResult retry = h.step("B", 33, 1, {{}, {}});
      REQUIRE(retry.store_jobs.size() == 1);
      const TransferJob& job = retry.store_jobs[0];
      CHECK_NOTHROW(check_job_invariants(job, 2, 1));
      if (control) {
        CHECK(reads(job, 301));
        CHECK(h.s.stats().reused_sub_blocks == 0);
      } else {
        CHECK_FALSE(reads(job, 301));
        CHECK(job.gpu.block_ids == std::vector<GpuBlockId>{201, 202, 302});
        CHECK(h.s.stats().reused_sub_blocks == 1);
      }
    }
  }
}

TEST_CASE("Issue 54 (c) at f = 2: the freed sub-block is left out, the block kept from the next",
          "[scheduler][store][holes]") {
  Harness h(make_config({full(16), window(16, 16)}, 2, 4));
  const JobId a = fill_then_defer(h, 2);  // B's window blocks 301-304
  // C waits for a load, so its blocks show in on_allocated only (not in a step's entries):
  // 303 (sub-block 0 of B's second window block) is its load's destination.
  REQUIRE(h.lookup("C", chain_hashes("C", 4), 64, 0) == 0);
  REQUIRE_NOTHROW(h.s.on_allocated("C", allocation({{401, 402}, {403, 303}}, {2, 1}), 0));
  h.complete(a);
  const StepResult retry = h.step("B", 64, 1, {{}, {}});
  REQUIRE(retry.store_jobs.size() == 2);  // the partial block starts a job of its own
  CHECK(retry.store_jobs[0].gpu.block_ids == std::vector<GpuBlockId>{201, 202, 203, 204, 301, 302});
  CHECK(retry.store_jobs[1].gpu.block_ids == std::vector<GpuBlockId>{304});
  CHECK(retry.store_jobs[1].gpu.block_indices == std::vector<std::int64_t>{0, 3});
  CHECK(h.s.stats().reused_sub_blocks == 1);
  CHECK(h.s.stats().partial_stores == 1);
  for (const TransferJob& job : retry.store_jobs) CHECK_NOTHROW(check_job_invariants(job, 2, 2));
}

TEST_CASE("Issue 54 (c): a block the engine overwrites outside the step's new ids is left out",
          "[scheduler][store][holes]") {
  // vLLM's kv_cache_block_copies write their destinations in the step without listing them in
  // any request's new block ids: the bridge passes them to handed_out().
  Harness h(make_config({full(16), window(16, 16)}, 1, 4));
  const JobId a = fill_then_defer(h, 1);
  const std::vector<GpuBlockId> copied{301};
  h.s.handed_out(copied);
  h.complete(a);
  const StepResult retry = h.step("B", 33, 1, {{}, {}});
  REQUIRE(retry.store_jobs.size() == 1);
  CHECK(retry.store_jobs[0].gpu.block_ids == std::vector<GpuBlockId>{201, 202, 302});
  CHECK(h.s.stats().reused_sub_blocks == 1);
}

TEST_CASE("A mamba load skips null destinations before the block that receives the state",
          "[scheduler][alloc][holes]") {
  // vLLM's align mode pads with nulls; a load into [.., 61, 0, 63] must not be refused for the
  // null: only the last block's state is read, so the load copies that one.
  Harness h(make_config({full(16), mamba(16)}, 3, 64));
  const auto hashes = chain_hashes("pad", 6);
  REQUIRE(h.lookup("A", hashes, 100, 0) == 0);
  h.alloc_none("A");
  const StepResult a = h.step("A", 0, 96, {ids(1, 6), {0, 0, 0, 53, 54, 55}});
  REQUIRE(a.store_jobs.size() == 1);
  h.complete(a.store_jobs[0].id);
  REQUIRE(h.lookup("C", extend_hashes(hashes, "C", 7), 120, 0) == 96);
  REQUIRE_NOTHROW(
      h.s.on_allocated("C", allocation({ids(21, 7), {0, 0, 0, 61, 0, 63, 64}}, {0, 3}), 96));
  check_load(h.s.build_step({}), {21, 22, 23, 24, 25, 26, 63}, {6, 1}, {0, 5}, 3);
}

TEST_CASE("A store in flight is flushed when on_allocated or handed_out gives its block away",
          "[scheduler][store][holes]") {
  // A's store reads window block 11 (registered on the fence at once). vLLM frees 11 and gives
  // it to W through update_state_after_alloc only (another connector loads W's blocks, or a
  // copy-on-write writes it): the step must flush A's store before 11 is written.
  for (const bool copy : {false, true}) {
    INFO((copy ? "handed_out" : "on_allocated"));
    Harness h(make_config({full(16), window(16, 16)}, 1, 16));
    REQUIRE(h.lookup("A", chain_hashes("A", 4), 64, 0) == 0);
    h.alloc_none("A");
    const StepResult a = h.step("A", 0, 32, {{1, 2}, {11, 12}});
    REQUIRE(a.store_jobs.size() == 1);
    if (copy) {
      const std::vector<GpuBlockId> written{11};
      h.s.handed_out(written);
    } else {
      REQUIRE(h.lookup("W", chain_hashes("W", 4), 64, 0) == 0);
      h.s.on_allocated("W", allocation({{21, 22}, {0, 11}}, {0, 0}), 0);
    }
    const StepResult next = h.s.build_step({});
    CHECK(next.flush == std::vector<JobId>{a.store_jobs[0].id});
  }
}
