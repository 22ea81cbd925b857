// SEMANTICS 6.10: a mamba block is stored only if it ends within the tokens the engine
// finalised (limit_state_stores): a block completed by decode steps holds a decode-time state,
// advanced over draft tokens under speculative decoding, that a later prefill would not compute
// (issue 47: vLLM's CPU engine with ngram drafts served such a state, and the first token
// differed). Expected jobs derived by hand from the contract.

#include <catch2/catch_test_macros.hpp>

#include "kvoffload/error.hpp"
#include "kvoffload/job.hpp"

#include "support/scheduler_fixture.hpp"

using namespace kvtest;

TEST_CASE("limit_state_stores: mamba blocks past the final tokens are not stored, others are",
          "[scheduler][store][final-states]") {
  for (const bool limited : {true, false}) {  // false: the control, which must store it
    CAPTURE(limited);
    // f = 1, GPU blocks of 32. A: a 100-token prompt, prefilled as vLLM's align mode chunks it
    // (0-96, the state in block 2 and null pads before it; then 96-100); then a decode step
    // (1 + drafts) completes block 3 (tokens 96-128) past the prompt.
    Harness h(make_config({full(32), mamba(32)}, 1, 64, 32));
    const auto hashes = chain_hashes("final", 4);
    REQUIRE(h.lookup("A", {hashes.begin(), hashes.begin() + 3}, 100, 0) == 0);
    if (limited) h.s.limit_state_stores("A", 100);
    h.alloc_none("A");
    StepResult prefill = h.step("A", 0, 96, {ids(1, 3), {0, 0, 13}});
    REQUIRE(prefill.store_jobs.size() == 1);
    // Blocks 0-2 of full attention, the state at 96 (block 2) of mamba.
    CHECK(prefill.store_jobs[0].gpu.group_sizes == std::vector<std::int64_t>{3, 1});
    h.complete(prefill.store_jobs[0].id);
    CHECK(h.step("A", 96, 4, {{4}, {14}}).store_jobs.empty());
    h.s.update_request("A", 129, hashes);
    StepResult decode = h.step("A", 100, 28, {{}, {}});
    REQUIRE(decode.store_jobs.size() == 1);
    const TransferJob& job = decode.store_jobs[0];
    CHECK_NOTHROW(check_job_invariants(job, 2, 1));
    if (limited) {  // full-attention block 3 only: its KV is the tokens', whichever step ran
      CHECK(job.gpu.block_ids == std::vector<GpuBlockId>{4});
      CHECK(job.gpu.group_sizes == std::vector<std::int64_t>{1, 0});
      CHECK(h.s.cache_stats().unfinal_state_skips == 1);
    } else {
      CHECK(job.gpu.block_ids == std::vector<GpuBlockId>{4, 14});
      CHECK(h.s.cache_stats().unfinal_state_skips == 0);
    }
    h.complete(job.id);
    // A later request with A's 128 tokens and more: the state at 128 is not served when it
    // was a decode-time state; the hit ends at the last prefill state (96).
    const auto longer = extend_hashes(hashes, "C", 5);
    CHECK(h.lookup("C", longer, 170, 0) == (limited ? 96 : 128));
  }
}

TEST_CASE("limit_state_stores: a resumed request's raised limit stores its recomputed states",
          "[scheduler][store][final-states]") {
  // A preempted request recomputes its outputs as a prefill (vLLM: prefill_end is
  // max(num_prompt_tokens, num_tokens - 1)); the engine raises the limit at its next lookup.
  Harness h(make_config({mamba(32)}, 1, 64, 32));
  const auto hashes = chain_hashes("resumed", 4);
  REQUIRE(h.lookup("A", hashes, 140, 0) == 0);
  h.s.limit_state_stores("A", 139);
  h.alloc_none("A");
  StepResult s = h.step("A", 0, 128, {{0, 0, 0, 4}}, true);
  REQUIRE(s.store_jobs.size() == 1);
  CHECK(s.store_jobs[0].gpu.block_ids == std::vector<GpuBlockId>{4});  // the state at 128
  CHECK(h.s.cache_stats().unfinal_state_skips == 0);
  CHECK_THROWS_AS(h.s.limit_state_stores("A", -1), kvoffload::invalid_argument);
  CHECK_THROWS_AS(h.s.limit_state_stores("nobody", 0), kvoffload::invalid_argument);
}

TEST_CASE("A prefill checkpoint that the step passed over is stored as the state at its end",
          "[scheduler][store][final-states]") {
  // vLLM 0.32/0.33 align mode: a 300-token prefill in one step exports the state after 288
  // tokens ((300 - 1) / 32 * 32) into column 8 (tokens 256-288), the running state into column
  // 9; the rest are null pads. Column 8 ends at 288: that state is finalised and stored.
  Harness h(make_config({mamba(32)}, 1, 64, 32));
  const auto hashes = chain_hashes("checkpoint", 9);
  REQUIRE(h.lookup("A", hashes, 300, 0) == 0);
  h.s.limit_state_stores("A", 300);
  h.alloc_none("A");
  StepResult s = h.step("A", 0, 300, {{0, 0, 0, 0, 0, 0, 0, 0, 17, 18}});
  REQUIRE(s.store_jobs.size() == 1);
  CHECK(s.store_jobs[0].gpu.block_ids == std::vector<GpuBlockId>{17});
  CHECK(s.store_jobs[0].gpu.block_indices == std::vector<std::int64_t>{8});
  CHECK(h.s.cache_stats().unfinal_state_skips == 0);  // column 9 ends past 300: not offloadable
}
