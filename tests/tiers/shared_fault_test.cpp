// The shared tier under faults, end to end: the synthetic engine (every loaded block verified,
// the reliability invariants checked every step) runs on the cluster ctest starts while one of
// its masters is stopped (SIGSTOP), then killed (SIGKILL), then started again; alone, and
// below a small disk tier (which evicts, so the shared tier still serves some hits, and
// takes the blocks promoted from it).

#include <signal.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <chrono>
#include <random>

#include "sim/synthetic_engine.hpp"
#include "support/cluster.hpp"
#include "support/shared_secret.hpp"
#include "support/temp_dir.hpp"

namespace {

struct Phase {
  kvsim::SimReport before, after;
  double seconds = 0;
};

Phase run_steps(kvsim::SyntheticEngine& e, int steps, kvsim::SimReport& last) {
  Phase p;
  p.before = last;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) last = e.step();
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  p.after = last;
  CHECK(last.mismatches == 0);
  CHECK(last.invariant_violations == 0);
  return p;
}

}  // namespace

TEST_CASE("Shared tier: a master stopped, killed and restarted mid-run", "[cluster]") {
  const bool with_disk = GENERATE(false, true);
  const unsigned seed = std::random_device{}();
  INFO("seed " << seed << (with_disk ? ", with a disk tier" : ", no disk tier"));
  kvtest::TempDir dir;
  kvsim::SimConfig c;
  if (with_disk) {
    c.disk_dir = dir.path.string();
    c.disk_capacity = 4ull << 20;
  }
  c.seed = seed;
  c.shared_nodes = kvoffload::test::cluster_seed();
  c.shared_name = "fault-test-" + std::to_string(seed);
  c.shared_secret_file = kvoffload::test::shared_secret_file();
  c.shared_reply_timeout_ms = 200;
  c.check_invariants = true;
  kvsim::SyntheticEngine e(c);
  kvsim::SimReport last;

  const Phase healthy = run_steps(e, 800, last);
  UNSCOPED_INFO("healthy: disk promotions "
                << healthy.after.disk_promotions << ", written "
                << healthy.after.disk_blocks_written << ", evicted " << healthy.after.disk_evictions
                << "; shared promotions " << healthy.after.shared_promotions);
  // With the disk, host misses go to the disk first; how many there are (disk or shared
  // hits) depends on the seed's workload (CI met a seed with none in 800 steps), so only that
  // both tiers are used is checked: written to, and the shared tier asked.
  if (with_disk) {
    CHECK(healthy.after.disk_blocks_written > 0);
    CHECK(healthy.after.shared_checks > 0);
  } else {
    CHECK(healthy.after.shared_promotions > 0);
  }
  CHECK(healthy.after.shared_blocks_written > 0);
  CHECK(healthy.after.shared_read_errors == 0);
  CHECK(healthy.after.shared_failed_writes == 0);

  // Node 1 stops answering: its blocks fail within the timeouts; the engine keeps going.
  const int pid = kvoffload::test::cluster_node_pid(1);
  REQUIRE(pid > 0);
  REQUIRE(::kill(pid, SIGSTOP) == 0);
  const Phase stopped = run_steps(e, 400, last);
  ::kill(pid, SIGKILL);
  ::kill(pid, SIGCONT);
  const Phase killed = run_steps(e, 200, last);
  const auto failures = [](const kvsim::SimReport& r) {
    return r.shared_read_errors + r.shared_failed_writes + r.shared_failed_promotions;
  };
  CHECK(failures(killed.after) > failures(healthy.after));
  CHECK(stopped.seconds < 60);  // bounded by the timeouts, not stuck
  CHECK(killed.seconds < 60);

  // Back (empty: persistence is off): after a settling phase, no errors, and hits return.
  REQUIRE(kvoffload::test::cluster_script("restart-node 1") == 0);
  (void)run_steps(e, 300, last);
  const Phase recovered = run_steps(e, 800, last);
  CHECK(recovered.after.shared_read_errors == recovered.before.shared_read_errors);
  CHECK(recovered.after.shared_failed_writes == recovered.before.shared_failed_writes);
  CHECK(recovered.after.shared_blocks_written > recovered.before.shared_blocks_written);
  if (!with_disk) CHECK(recovered.after.shared_promotions > recovered.before.shared_promotions);
  e.drain();
  CHECK(e.step().invariant_violations == 0);
}
