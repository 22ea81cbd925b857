// The end-to-end loop in CI: the synthetic engine drives scheduler, host cache, pool and
// transfer engine for 2,000 steps with eviction pressure; every loaded byte must match.

#include <iostream>
#include <random>

#include <catch2/catch_test_macros.hpp>

#include "sim/synthetic_engine.hpp"

TEST_CASE("End to end: 2,000 steps with eviction pressure and zero mismatches", "[e2e][property]") {
  const std::uint64_t seed = std::random_device{}();
  for (const std::string policy : {"lru", "arc"}) {
    for (const std::int64_t factor : {1, 4}) {
      kvsim::SimConfig c;
      c.seed = seed;
      c.steps = 2000;
      c.policy = policy;
      c.block_size_factor = factor;
      c.copy_threads = 2;
      INFO("seed " << seed << ", policy " << policy << ", factor " << factor);
      kvsim::SyntheticEngine engine(c);
      const kvsim::SimReport r = engine.run();
      std::cout << "e2e " << policy << " f=" << factor << " seed " << seed << ": " << r.load_jobs
                << " loads, " << r.blocks_verified << " blocks verified, " << r.evictions
                << " evictions, " << r.mismatches << " mismatches\n";
      INFO(r.first_mismatch);
      CHECK(r.mismatches == 0);
      CHECK(r.steps == 2000);
      // The run must exercise what it checks.
      CHECK(r.blocks_verified > 100);
      CHECK(r.evictions > 100);
      CHECK(r.requests_finished > 50);
    }
  }
}
