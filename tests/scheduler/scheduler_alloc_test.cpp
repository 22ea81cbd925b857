// SEMANTICS 5: load jobs planned after allocation.

#include <catch2/catch_test_macros.hpp>

#include "support/scheduler_fixture.hpp"

using namespace kvtest;

namespace {

/// r1 stores 4 offloaded blocks of a full-attention and a window group (seed-straddle).
struct StraddleCache {
  StraddleCache() : h(make_config({full(16), window(32, 16)}, 3, 16)) {
    REQUIRE(h.lookup("r1", hashes, 192, 64) == 0);
    h.alloc_none("r1");
    const StepResult st = h.step("r1", 64, 128, {ids(1, 12), ids(13, 10, 2)});
    REQUIRE(st.store_jobs.size() == 1);
    h.complete(st.store_jobs[0].id);
  }
  Harness h;
  std::vector<BlockHash> hashes = chain_hashes("straddle", 12);
};

}  // namespace

TEST_CASE("A load job loads the window's last blocks and counts exactly", "[scheduler][alloc]") {
  StraddleCache c;
  REQUIRE(c.h.lookup("r2", c.hashes, 200, 0) == 192);
  std::vector<AllocatedGroup> groups{{ids(31, 12), 0}, {ids(43, 3, 9), 9}};
  c.h.s.on_allocated("r2", groups, 192);
  CHECK(c.h.s.num_jobs_in_flight() == 1);
  const StepResult st = c.h.s.build_step({});
  REQUIRE(st.load_jobs.size() == 1);
  const TransferJob& job = st.load_jobs[0];
  CHECK(job.kind == JobKind::load);
  CHECK(job.gpu.group_sizes == std::vector<std::int64_t>{12, 3});
  CHECK(job.gpu.block_indices == std::vector<std::int64_t>{0, 9});
  CHECK(job.gpu.block_ids == ids(31, 15));
  CHECK(job.host_block_ids == std::vector<HostBlockId>{0, 1, 2, 3, 7});
  CHECK_NOTHROW(check_job_invariants(job, 2, 3));
  // Loaded blocks are not stored again.
  c.h.complete(job.id);
  std::vector<ScheduledRequest> e{{"r2", 192, 8, {ids(31, 13), ids(43, 4, 9)}, false}};
  CHECK(c.h.s.build_step(e).store_jobs.empty());
  // Once emitted, load jobs are not emitted again.
  CHECK(c.h.s.build_step({}).load_jobs.empty());
}

TEST_CASE("Loaded blocks are read-protected until the load completes", "[scheduler][alloc]") {
  StraddleCache c;
  REQUIRE(c.h.lookup("r2", c.hashes, 200, 0) == 192);
  std::vector<AllocatedGroup> groups{{ids(31, 12), 0}, {ids(43, 3, 9), 9}};
  c.h.s.on_allocated("r2", groups, 192);
  CHECK(c.h.s.manager().num_being_read() == 5);
  const StepResult st = c.h.s.build_step({});
  const auto done = c.h.complete(st.load_jobs[0].id);
  REQUIRE(done.size() == 1);
  CHECK(done[0].kind == JobKind::load);
  CHECK(done[0].ok);
  CHECK(c.h.s.manager().num_being_read() == 0);
}

TEST_CASE("No external tokens: no load job", "[scheduler][alloc]") {
  StraddleCache c;
  REQUIRE(c.h.lookup("r2", c.hashes, 200, 0) == 192);
  std::vector<AllocatedGroup> groups{{ids(31, 12), 0}, {ids(43, 3, 9), 9}};
  c.h.s.on_allocated("r2", groups, 0);
  CHECK(c.h.s.num_jobs_in_flight() == 0);
  CHECK(c.h.s.build_step({}).load_jobs.empty());
}

TEST_CASE("remote_decode stores the whole prompt, hits included", "[scheduler][alloc]") {
  for (const bool remote : {false, true}) {
    Harness h(make_config({full()}, 1, 4));
    const auto hashes = chain_hashes("p", 3);
    h.place(hashes, 0, 0);
    h.place(hashes, 0, 1);
    h.s.update_request("r", 48, hashes, remote);
    REQUIRE(h.s.lookup("r", 0) == 32);
    std::vector<AllocatedGroup> groups{{ids(1, 2), 0}};
    h.s.on_allocated("r", groups, 32);
    h.complete(h.s.build_step({}).load_jobs.at(0).id);
    // Another request evicts the two loaded keys.
    REQUIRE(h.lookup("z", chain_hashes("z", 4), 64, 0) == 0);
    h.alloc_none("z");
    h.complete(h.step("z", 0, 64, {ids(50, 4)}).store_jobs.at(0).id);
    REQUIRE(h.s.manager().block_of(Key{hashes[0], 0}) < 0);
    const StepResult st = h.step("r", 32, 16, {ids(1, 3)});
    REQUIRE(st.store_jobs.size() == 1);
    // Without remote_decode only the computed block 2 is stored; with it, the hit blocks 0
    // and 1 too.
    CHECK(st.store_jobs[0].keys.size() == (remote ? 3U : 1U));
    CHECK(st.store_jobs[0].gpu.block_indices[0] == (remote ? 0 : 2));
  }
}

TEST_CASE("A load into a GPU block that an in-flight store still reads flushes that store",
          "[scheduler][alloc]") {
  // The window group's source ids are registered at once: reusing one of them for a load
  // destination puts the store in the next step's flush set.
  Harness h(make_config({full(16), window(16, 16)}, 1, 16));
  const auto hashes = chain_hashes("x", 4);
  REQUIRE(h.lookup("a", hashes, 64, 0) == 0);
  h.alloc_none("a");
  const StepResult a = h.step("a", 0, 64, {ids(1, 4), ids(11, 4)});
  REQUIRE(a.store_jobs.size() == 1);
  const JobId store = a.store_jobs[0].id;
  // b loads block 0 of each group (stored by another donor) into GPU block 14, a's.
  const auto b_hashes = chain_hashes("y", 2);
  h.place(b_hashes, 0, 0);
  h.place(b_hashes, 1, 0);
  REQUIRE(h.lookup("b", b_hashes, 17, 0) == 16);
  std::vector<AllocatedGroup> groups{{ids(20, 1), 0}, {{14}, 0}};
  h.s.on_allocated("b", groups, 16);
  const StepResult st = h.s.build_step({});
  REQUIRE(st.load_jobs.size() == 1);
  CHECK(st.flush == std::vector<JobId>{store});
}

TEST_CASE("A window over larger blocks loads the block its window reaches into",
          "[scheduler][alloc]") {
  // Full attention in 16-token blocks ends the hit at 48, halfway through block 1 of a 20-token
  // window over 32-token blocks (window_blocks 1). vLLM keeps the blocks the window read at 48
  // touches (tokens 29-47): blocks 0 and 1, two pending blocks, one more than window_blocks * f.
  Harness h(make_config({full(16), window(20, 32)}, 1, 16));
  const auto hashes = chain_hashes("reach", 4);
  for (std::size_t i = 0; i < 3; ++i) h.place(hashes, 0, i);
  h.place(hashes, 1, 0);
  h.place(hashes, 1, 1);
  REQUIRE(h.lookup("r", hashes, 64, 0) == 48);
  // The window's first token, 29, is in GPU block 0: no null block (vLLM nulls (48-19)/32).
  std::vector<AllocatedGroup> groups{{ids(1, 3), 0}, {ids(11, 2), 0}};
  h.s.on_allocated("r", groups, 48);
  const StepResult st = h.s.build_step({});
  REQUIRE(st.load_jobs.size() == 1);
  const TransferJob& job = st.load_jobs[0];
  CHECK(job.gpu.group_sizes == std::vector<std::int64_t>{3, 2});
  CHECK(job.gpu.block_ids == std::vector<GpuBlockId>{1, 2, 3, 11, 12});
  REQUIRE(job.keys.size() == 5);
  CHECK(job.keys[3] == Key{hashes[1], 1});
  CHECK(job.keys[4] == Key{hashes[3], 1});
  CHECK_NOTHROW(check_job_invariants(job, 2, 1));
}
