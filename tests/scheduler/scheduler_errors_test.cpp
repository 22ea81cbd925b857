// SEMANTICS 8b: bad input is rejected with invalid_argument naming the request, group, job or
// field, and the scheduler is exactly as before. "As before" is checked with a twin: two
// schedulers get the same history, one also gets the bad call, then both run the same
// continuation and must answer identically.

#include <functional>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "kvoffload/error.hpp"
#include "support/scheduler_fixture.hpp"

using namespace kvtest;
using Catch::Matchers::ContainsSubstring;

namespace {

// Full attention + window(32): f = 2, offloaded block 32 tokens, window 1 offloaded block.
SchedulerConfig config() {
  return make_config({full(16), window(32, 16)}, 2, 32, 16, 2);
}

const auto P = chain_hashes("p", 8);
const auto Q = chain_hashes("q", 8);

/// s: stored and complete (keys of P's first 2 offloaded blocks); c: looked up (hit 64), no
/// jobs; b: a load in flight, not yet emitted; a: a store in flight; d: 200 tokens but keys for
/// only 4 blocks; f: finished with a store in flight; u: updated, never looked up.
void setup(Harness& h) {
  REQUIRE(h.lookup("s", std::vector<BlockHash>(P.begin(), P.begin() + 4), 64, 0) == 0);
  h.alloc_none("s");
  const StepResult s = h.step("s", 0, 64, {ids(1, 4), ids(11, 4)});
  h.complete(s.store_jobs.at(0).id);
  REQUIRE(h.lookup("c", P, 128, 0) == 64);
  REQUIRE(h.lookup("b", P, 128, 0) == 64);
  std::vector<AllocatedGroup> b_groups{{ids(21, 4), 0}, {ids(31, 2, 2), 2}};
  h.s.on_allocated("b", b_groups, 64);
  REQUIRE(h.lookup("a", Q, 128, 0) == 0);
  h.alloc_none("a");
  REQUIRE(h.lookup("d", chain_hashes("d", 8), 200, 0) == 0);
  h.alloc_none("d");
  REQUIRE(h.lookup("f", chain_hashes("f", 2), 32, 0) == 0);
  h.alloc_none("f");
  std::vector<ScheduledRequest> e{{"a", 0, 128, {ids(41, 8), ids(51, 8)}, false},
                                  {"f", 0, 32, {ids(61, 2), ids(71, 2)}, false}};
  const StepResult st = h.s.build_step(e);
  REQUIRE(st.load_jobs.size() == 1);
  REQUIRE(st.store_jobs.size() == 2);
  h.s.on_finished("f");
  h.s.update_request("u", 32, chain_hashes("u", 2));
}

/// Drives both twins the same way and records every answer.
nlohmann::json continuation(Harness& h) {
  nlohmann::json out = nlohmann::json::array();
  out.push_back(h.s.num_requests());
  out.push_back(h.s.num_jobs_in_flight());
  for (JobId job = 0; job < 8; ++job) {
    try {
      const auto done = h.s.on_completed(std::vector<JobReport>{{job, 2, true}});
      out.push_back({job, done.size()});
    } catch (const invalid_argument&) {
      out.push_back({job, "unknown"});
    }
  }
  out.push_back(to_json(h.s.take_events()));
  std::vector<ScheduledRequest> e{{"c", 0, 128, {ids(81, 8), ids(91, 8)}, false},
                                  {"b", 64, 64, {ids(21, 8), ids(31, 6, 2)}, false}};
  out.push_back(to_json(h.s.build_step(e)));
  const auto z = h.lookup("z", Q, 128, 0);
  out.push_back(z ? *z : -1);
  out.push_back(to_json(h.s.take_events()));
  const auto& st = h.s.stats();
  out.push_back({st.lookups, st.hit_tokens, st.load_jobs, st.store_jobs, st.deferrals});
  const auto& ms = h.s.manager().stats();
  out.push_back({ms.hits, ms.misses, ms.stores, ms.evictions, h.s.manager().num_used()});
  return out;
}

void rejects(const std::function<void(Scheduler&)>& bad, const std::string& named) {
  Harness twin(config()), clean(config());
  setup(twin);
  setup(clean);
  CHECK_THROWS_AS(bad(twin.s), invalid_argument);
  CHECK_THROWS_WITH(bad(twin.s), ContainsSubstring(named));
  CHECK(continuation(twin) == continuation(clean));
}

std::vector<AllocatedGroup> good_c() {
  return {{ids(81, 4), 0}, {ids(91, 2, 2), 2}};
}

}  // namespace

TEST_CASE("The error twin really detects a changed state", "[scheduler][errors]") {
  // Guards the guard: a valid call that changes state makes the continuations differ.
  Harness twin(config()), clean(config());
  setup(twin);
  setup(clean);
  auto groups = good_c();
  twin.s.on_allocated("c", groups, 64);
  CHECK(continuation(twin) != continuation(clean));
}

TEST_CASE("on_allocated or a step for a request never looked up", "[scheduler][errors]") {
  rejects(
      [](Scheduler& s) {
        auto g = good_c();
        s.on_allocated("u", g, 64);
      },
      "\"u\"");
  rejects(
      [](Scheduler& s) {
        auto g = good_c();
        s.on_allocated("nope", g, 0);
      },
      "\"nope\"");
  rejects(
      [](Scheduler& s) {
        std::vector<ScheduledRequest> e{{"u", 0, 32, {ids(1, 2), ids(3, 2)}, false}};
        s.build_step(e);
      },
      "\"u\"");
  rejects(
      [](Scheduler& s) {
        // The valid entry before the bad one must not be applied either.
        std::vector<ScheduledRequest> e{{"c", 0, 128, {ids(81, 8), ids(91, 8)}, false},
                                        {"nope", 0, 32, {ids(1, 2), ids(3, 2)}, false}};
        s.build_step(e);
      },
      "\"nope\"");
}

TEST_CASE("on_allocated with the wrong number of groups, even without external tokens",
          "[scheduler][errors]") {
  rejects(
      [](Scheduler& s) {
        std::vector<AllocatedGroup> g(1);
        s.on_allocated("c", g, 0);
      },
      "1 groups given");
  rejects(
      [](Scheduler& s) {
        std::vector<AllocatedGroup> g(3);
        s.on_allocated("c", g, 64);
      },
      "request \"c\"");
}

TEST_CASE("on_allocated with external tokens while jobs are in flight", "[scheduler][errors]") {
  rejects(
      [](Scheduler& s) {
        auto g = good_c();
        s.on_allocated("a", g, 64);
      },
      "\"a\" has 1 job");
}

TEST_CASE("on_allocated with bad block lists", "[scheduler][errors]") {
  rejects(
      [](Scheduler& s) {
        std::vector<AllocatedGroup> g{{ids(81, 3), 0}, {ids(91, 2, 2), 2}};
        s.on_allocated("c", g, 64);
      },
      "group 0: 3 block ids");
  rejects(
      [](Scheduler& s) {
        std::vector<AllocatedGroup> g{{ids(81, 4), 5}, {ids(91, 2, 2), 2}};
        s.on_allocated("c", g, 64);
      },
      "group 0: num_computed_blocks 5");
  rejects(
      [](Scheduler& s) {
        std::vector<AllocatedGroup> g{{ids(81, 3, 1), 0}, {ids(91, 2, 2), 2}};
        s.on_allocated("c", g, 64);
      },
      "group 0: block 0 to load is the null block");
  rejects(
      [](Scheduler& s) {
        std::vector<AllocatedGroup> g{{ids(81, 4), 0}, {ids(91, 4), 0}};
        s.on_allocated("c", g, 64);
      },
      "group 1: 4 blocks to load, the window allows 2");
  rejects(
      [](Scheduler& s) {
        std::vector<AllocatedGroup> g{{ids(81, 6), 0}, {ids(91, 2, 4), 4}};
        s.on_allocated("c", g, 96);
      },
      "not in the host cache");
  rejects(
      [](Scheduler& s) {
        auto g = good_c();
        s.on_allocated("c", g, -1);
      },
      "num_external_tokens");
}

TEST_CASE("Step entries with too few keys or blocks, or a null after a real block",
          "[scheduler][errors]") {
  rejects(
      [](Scheduler& s) {
        std::vector<ScheduledRequest> e{{"d", 0, 200, {ids(1, 13), ids(21, 13)}, false}};
        s.build_step(e);
      },
      "request \"d\" group 0: 6 offloaded blocks are computed but only 4 have block hashes");
  rejects(
      [](Scheduler& s) {
        std::vector<ScheduledRequest> e{{"c", 0, 128, {ids(81, 7), ids(91, 8)}, false}};
        s.build_step(e);
      },
      "request \"c\" group 0: 7 GPU blocks");
  rejects(
      [](Scheduler& s) {
        std::vector<ScheduledRequest> e{{"c", 0, 128, {ids(81, 8)}, false}};
        s.build_step(e);
      },
      "new_block_ids has 1 groups");
  rejects(
      [](Scheduler& s) {
        std::vector<ScheduledRequest> e{{"c", 0, 8, {ids(81, 1), ids(91, 1)}, false},
                                        {"c", 8, 8, {{}, {}}, false}};
        s.build_step(e);
      },
      "\"c\" is scheduled twice");
}

TEST_CASE("Preemptions vLLM reports a step late are taken, not refused", "[scheduler][errors]") {
  // Issue 54: reset_prefix_cache(reset_running_requests=True) preempts between steps and vLLM
  // reports it with the next step, when the request may have been looked up again (a load
  // planned: b) or finished and forgotten (ghost). Neither may raise into the step; the load
  // is not flushed (it writes the request's new blocks), stores of a preempted request are.
  Harness h(config());
  setup(h);
  StepResult out;
  REQUIRE_NOTHROW(out = h.s.build_step({}, std::vector<std::string>{"b", "ghost", "a"}));
  // In flight: b's load, a's store, finished f's store. Only a's store is flushed.
  REQUIRE(h.s.num_jobs_in_flight() == 3);
  CHECK(out.flush.size() == 1);
}

TEST_CASE("Completing an unknown job, a non-positive count, more reports than workers",
          "[scheduler][errors]") {
  rejects(
      [](Scheduler& s) {
        s.on_completed(std::vector<JobReport>{{99, 1, true}});
      },
      "unknown job 99");
  rejects(
      [](Scheduler& s) {
        s.on_completed(std::vector<JobReport>{{2, 0, true}});
      },
      "job 2: count must be positive");
  rejects([](Scheduler& s) { s.on_completed(std::vector<JobReport>{{2, 3, true}}); }, "job 2");
  // Two reports that only together exceed the workers; the first must not be applied.
  rejects(
      [](Scheduler& s) {
        s.on_completed(std::vector<JobReport>{{2, 1, true}, {2, 2, true}});
      },
      "job 2");
}

TEST_CASE("A request update that does not extend its hashes, or for a finished request",
          "[scheduler][errors]") {
  rejects([](Scheduler& s) { s.update_request("c", 128, Q); }, "request \"c\": block hash 0");
  rejects(
      [](Scheduler& s) {
        s.update_request("c", 128, std::vector<BlockHash>(P.begin(), P.begin() + 3));
      },
      "request \"c\": 3 block hashes");
  rejects([](Scheduler& s) { s.update_request("f", 64, chain_hashes("f", 4)); },
          "\"f\" is finished");
  rejects([](Scheduler& s) { s.extend_request("f", 64, chain_hashes("f", 2)); },
          "\"f\" is finished");
  rejects([](Scheduler& s) { s.lookup("ghost", 0); }, "\"ghost\"");
  rejects([](Scheduler& s) { s.lookup("c", -5); }, "num_computed_tokens");
}

TEST_CASE("on_allocated refuses a load of sub-blocks no store wrote (SEMANTICS 6.8)",
          "[scheduler][errors]") {
  // f = 2, window 48 (2 offloaded blocks): key 1 is stored from sub-block 1 on. A lookup
  // promises 96 tokens with the window reading from sub-block 3; an engine that then asks to
  // load from sub-block 2 would get a sub-block nobody wrote.
  Harness h(make_config({window(48)}, 2, 8));
  const auto a = chain_hashes("a", 8);
  REQUIRE(h.lookup("a", a, 128, 96) == 0);
  const StepResult st = h.step("a", 96, 32, {{0, 0, 0, 4, 5, 6, 7, 8}});
  h.complete(st.store_jobs.at(0).id);
  const auto e = extend_hashes(std::vector<BlockHash>(a.begin(), a.begin() + 6), "e", 8);
  REQUIRE(h.lookup("e", e, 128, 0) == 96);
  std::vector<AllocatedGroup> too_low{{ids(31, 4, 2), 2}};
  CHECK_THROWS_WITH(h.s.on_allocated("e", too_low, 96),
                    ContainsSubstring("request \"e\" group 0") &&
                        ContainsSubstring("stored from sub-block 1 on") &&
                        ContainsSubstring("nobody wrote"));
  CHECK(h.s.num_jobs_in_flight() == 0);  // nothing planned
  std::vector<AllocatedGroup> right{{ids(31, 3, 3), 3}};
  h.s.on_allocated("e", right, 96);
  const StepResult load = h.s.build_step({});
  REQUIRE(load.load_jobs.size() == 1);
  CHECK(load.load_jobs[0].gpu.block_indices == std::vector<std::int64_t>{3});
  CHECK(load.load_jobs[0].gpu.group_sizes == std::vector<std::int64_t>{3});
}

TEST_CASE("on_allocated refuses a mamba load that ends inside a block", "[scheduler][errors]") {
  // Mamba in 16-token blocks, all four stored: the lookup of 65 tokens answers 64. An engine
  // that then allocates 56 tokens would load block 3, the state after 64 tokens, into a
  // request that has computed 56: refused, and nothing changes.
  Harness h(make_config({mamba()}, 1, 8));
  const auto hashes = chain_hashes("m", 4);
  for (std::size_t i = 0; i < 4; ++i) h.place(hashes, 0, i);
  REQUIRE(h.lookup("r", hashes, 65, 0) == 64);
  std::vector<AllocatedGroup> mid{{{0, 0, 0, 501}, 3}};
  CHECK_THROWS_WITH(h.s.on_allocated("r", mid, 56),
                    ContainsSubstring("request \"r\" group 0: a mamba load must end at a block's "
                                      "end; 56 tokens end inside offloaded block 3"));
  CHECK(h.s.num_jobs_in_flight() == 0);
  CHECK(h.s.manager().num_being_read() == 0);
  std::vector<AllocatedGroup> whole{{{0, 0, 0, 501}, 3}};
  h.s.on_allocated("r", whole, 64);
  CHECK(h.s.build_step({}).load_jobs.size() == 1);
}
