// SEMANTICS 8: completion with several workers and failures, finish and the block-reuse
// fence, preemption, reset_cache.

#include <catch2/catch_test_macros.hpp>

#include "kvoffload/error.hpp"
#include "support/scheduler_fixture.hpp"

using namespace kvtest;

namespace {

/// One request "a" of 64 tokens in a full-attention + window(16) model, with its store job
/// in flight.
struct InFlight {
  explicit InFlight(std::int64_t workers = 1)
      : h(make_config({full(16), window(16, 16)}, 1, 16, 16, workers)) {
    REQUIRE(h.lookup("a", hashes, 64, 0) == 0);
    h.alloc_none("a");
    const StepResult st = h.step("a", 0, 64, {ids(1, 4), ids(11, 4)});
    REQUIRE(st.store_jobs.size() == 1);
    job = st.store_jobs[0].id;
  }
  Harness h;
  std::vector<BlockHash> hashes = chain_hashes("a", 4);
  JobId job = -1;

  bool hit(std::size_t i, std::uint32_t g = 0) {
    return h.s.manager().peek(Key{hashes[i], g}) == LookupResult::hit;
  }
  /// A step of another request "b" whose new blocks are `full_ids` and `window_ids`.
  StepResult reuse(std::vector<GpuBlockId> full_ids, std::vector<GpuBlockId> window_ids) {
    if (!looked_up_b) {
      REQUIRE(h.lookup("b", chain_hashes("b", 1), 17, 0) == 0);
      h.alloc_none("b");
      looked_up_b = true;
    }
    return h.step("b", 0, 1, {std::move(full_ids), std::move(window_ids)});
  }
  bool looked_up_b = false;
};

}  // namespace

TEST_CASE("With several workers a job completes when all have reported", "[scheduler][complete]") {
  InFlight f(3);
  CHECK(f.h.s.on_completed(std::vector<JobReport>{{f.job, 1, true}}).empty());
  CHECK(f.h.s.on_completed(std::vector<JobReport>{{f.job, 1, true}}).empty());
  CHECK_FALSE(f.hit(0));
  const auto done = f.h.s.on_completed(std::vector<JobReport>{{f.job, 1, true}});
  REQUIRE(done.size() == 1);
  CHECK(done[0].ok);
  CHECK(f.hit(0));
  CHECK(f.hit(3, 1));
}

TEST_CASE("A job fails if any worker fails, and a failed store is never a hit",
          "[scheduler][complete]") {
  InFlight f(2);
  const auto done = f.h.s.on_completed(std::vector<JobReport>{{f.job, 1, false}, {f.job, 1, true}});
  REQUIRE(done.size() == 1);
  CHECK_FALSE(done[0].ok);
  CHECK_FALSE(f.hit(0));
  CHECK(f.h.s.manager().num_used() == 0);
  CHECK(f.h.s.stats().failed_stores == 1);
  // The blocks are not retried (next_stored moved on), and a new lookup misses.
  CHECK(f.h.lookup("c", f.hashes, 64, 0) == 0);
}

TEST_CASE("A count covering several workers at once is accepted", "[scheduler][complete]") {
  InFlight f(4);
  CHECK(f.h.s.on_completed(std::vector<JobReport>{{f.job, 3, true}}).empty());
  CHECK(f.h.s.on_completed(std::vector<JobReport>{{f.job, 1, true}}).size() == 1);
}

TEST_CASE("A failed load is reported so the engine recomputes", "[scheduler][complete]") {
  InFlight f;
  f.h.complete(f.job);
  REQUIRE(f.h.lookup("c", f.hashes, 64, 0) == 63);  // the last token is recomputed
  std::vector<AllocatedGroup> groups{{ids(30, 4), 0}, {ids(40, 1, 3), 3}};
  f.h.s.on_allocated("c", groups, 63);
  const JobId load = f.h.s.build_step({}).load_jobs.at(0).id;
  const auto done = f.h.complete(load, false);
  REQUIRE(done.size() == 1);
  CHECK(done[0].kind == JobKind::load);
  CHECK_FALSE(done[0].ok);
  CHECK(done[0].request_id == "c");
  CHECK(f.h.s.stats().failed_loads == 1);
  CHECK(f.h.s.manager().num_being_read() == 0);
  CHECK(f.hit(0));  // a failed load does not drop the cached data
}

TEST_CASE("Window source blocks are fenced at once, full-attention ones once finished",
          "[scheduler][complete]") {
  SECTION("a window block reused while the store runs is flushed") {
    InFlight f;
    CHECK(f.reuse({60}, {12}).flush == std::vector<JobId>{f.job});
  }
  SECTION("a full-attention block of a running request is not fenced") {
    InFlight f;
    CHECK(f.reuse({2}, {60}).flush.empty());
  }
  SECTION("after finish, its full-attention blocks are fenced") {
    InFlight f;
    f.h.s.on_finished("a");
    CHECK(f.reuse({2}, {60}).flush == std::vector<JobId>{f.job});
  }
  SECTION("nothing is fenced once the store completed") {
    InFlight f;
    f.h.s.on_finished("a");
    f.h.complete(f.job);
    CHECK(f.reuse({2}, {12}).flush.empty());
  }
}

TEST_CASE("A finished request is forgotten once its jobs complete", "[scheduler][complete]") {
  InFlight f;
  const auto before = f.h.s.num_requests();
  f.h.s.on_finished("a");
  CHECK(f.h.s.num_requests() == before);
  f.h.complete(f.job);
  CHECK(f.h.s.num_requests() == before - 1);
  f.h.s.on_finished("a");  // again, and unknown: ignored
  f.h.s.on_finished("never-seen");
  // The id can be used again by a new request.
  CHECK(f.h.lookup("a", chain_hashes("new", 2), 32, 0) == 0);
}

TEST_CASE("Preempting a request flushes its stores; resuming restarts its block list",
          "[scheduler][complete]") {
  InFlight f;
  const std::vector<std::string> preempted{"a"};
  CHECK(f.h.s.build_step({}, preempted).flush == std::vector<JobId>{f.job});
  f.h.complete(f.job);
  // Resumed with new blocks (no new lookup): block 4 comes from the new list, not from the
  // old one with the new ids appended.
  auto more = extend_hashes(f.hashes, "a2", 5);
  f.h.s.update_request("a", 80, more);
  const StepResult st = f.h.step("a", 0, 80, {ids(71, 5), ids(81, 5)}, true);
  REQUIRE(st.store_jobs.size() == 1);
  CHECK(st.store_jobs[0].gpu.block_ids == std::vector<GpuBlockId>{75, 85});
}

TEST_CASE("reset_cache empties the cache, flushes in-flight jobs and ignores their reports",
          "[scheduler][complete]") {
  InFlight f;
  f.h.s.reset_cache();
  CHECK(f.h.s.manager().num_used() == 0);
  CHECK(f.h.s.num_jobs_in_flight() == 0);
  CHECK_NOTHROW(f.h.complete(f.job));  // stale: ignored
  CHECK_FALSE(f.hit(0));
  const StepResult st = f.h.step("a", 64, 0, {{}, {}});
  CHECK(st.flush == std::vector<JobId>{f.job});
  // next_stored went back to 0: the same blocks are stored again under a new job id.
  REQUIRE(st.store_jobs.size() == 1);
  CHECK(st.store_jobs[0].id > f.job);
  CHECK(st.store_jobs[0].keys.size() == 8);
  // Reports for the new job count again.
  CHECK(f.h.complete(st.store_jobs[0].id).size() == 1);
  CHECK(f.hit(0));
}
