// SEMANTICS 4: lookup. Keys are put into the cache as hit (ready), pending (writing) or left
// missing with Harness::place, then a fresh request with the same hashes is looked up.
// Block size 16, factor 1: offloaded block i holds tokens [16i, 16i + 16).

#include <catch2/catch_test_macros.hpp>

#include "support/scheduler_fixture.hpp"

using namespace kvtest;

namespace {

enum State { M, H, P };  // miss, hit, pending

/// Looks up a request whose key states in `group` are `states` (other groups all hit unless
/// given). Returns hit tokens, or -1 for retry later.
std::int64_t lookup_with(const SchedulerConfig& config,
                         const std::vector<std::vector<State>>& states_per_group,
                         std::int64_t num_tokens, std::int64_t computed = 0,
                         std::int64_t load_limit = -1) {
  Harness h(config);
  std::size_t n = 0;  // hashes: enough for every group's blocks
  for (std::size_t g = 0; g < states_per_group.size(); ++g) {
    const auto per = static_cast<std::size_t>(h.s.layouts()[g].hash_factor);
    n = std::max(n, states_per_group[g].size() * per);
  }
  const auto hashes = chain_hashes("target", n);
  for (std::size_t g = 0; g < states_per_group.size(); ++g) {
    for (std::size_t i = 0; i < states_per_group[g].size(); ++i) {
      if (states_per_group[g][i] != M) h.place(hashes, g, i, states_per_group[g][i] == H);
    }
  }
  h.s.update_request("target", num_tokens, hashes);
  h.s.limit_loads("target", load_limit);
  const auto hit = h.s.lookup("target", computed);
  return hit ? *hit : -1;
}

SchedulerConfig fa() {
  return make_config({full()}, 1, 64);
}
SchedulerConfig sw(std::int64_t window_tokens) {
  return make_config({window(window_tokens)}, 1, 64);
}

}  // namespace

TEST_CASE("Prefix scan for full attention", "[scheduler][lookup]") {
  CHECK(lookup_with(fa(), {{H, H, H, H}}, 64) == 64);      // all hit
  CHECK(lookup_with(fa(), {{M, M, M, M}}, 64) == 0);       // all miss
  CHECK(lookup_with(fa(), {{H, H, M, M}}, 64) == 32);      // partial
  CHECK(lookup_with(fa(), {{M, H, H, H}}, 64) == 0);       // miss then hit: nothing
  CHECK(lookup_with(fa(), {{H, M, H, H}}, 64) == 16);      // stops at the first miss
  CHECK(lookup_with(fa(), {{H, H, H}}, 60) == 48);         // only blocks with keys
  CHECK(lookup_with(fa(), {{M, M, H, H}}, 64, 32) == 32);  // starts at num_computed_tokens
  CHECK(lookup_with(fa(), {{H, H, H, H}}, 64, 56) == 0);   // less than a block left
}

TEST_CASE("Prefix scan: a pending key before the first miss defers", "[scheduler][lookup]") {
  CHECK(lookup_with(fa(), {{P, H, H}}, 48) == -1);
  CHECK(lookup_with(fa(), {{H, P, H}}, 48) == -1);
  CHECK(lookup_with(fa(), {{H, H, P}}, 48) == -1);
  CHECK(lookup_with(fa(), {{H, P, M}}, 48) == -1);
  CHECK(lookup_with(fa(), {{H, M, P}}, 48) == 16);  // the scan stopped before the pending key
}

TEST_CASE("Suffix window scan for sliding window groups", "[scheduler][lookup]") {
  // Window 32 tokens = 2 blocks. num_tokens 16n + 1: the last token is recomputed, so the
  // whole n blocks can hit.
  CHECK(lookup_with(sw(32), {{H, H}}, 33) == 32);              // exact window
  CHECK(lookup_with(sw(32), {{M, M, H, H}}, 65) == 64);        // window at the end
  CHECK(lookup_with(sw(32), {{M, H, H, M}}, 65) == 48);        // window in the middle
  CHECK(lookup_with(sw(32), {{H, M, H, M}}, 65) == 16);        // no full window: front run
  CHECK(lookup_with(sw(32), {{M, H, M, H}}, 65) == 0);         // front run empty
  CHECK(lookup_with(sw(32), {{H, H, M, H, H, M}}, 97) == 80);  // the rightmost window wins
  // Window 48 = 3 blocks: the gap resets the run, so the two runs of 2 do not make a window.
  CHECK(lookup_with(sw(48), {{H, H, M, H, H}}, 81) == 32);
  // The last token is always recomputed: the hit stops one token short of the prompt.
  CHECK(lookup_with(sw(32), {{H, H, H}}, 48) == 47);
}

TEST_CASE("Suffix window scan: a pending key met before the window defers", "[scheduler][lookup]") {
  CHECK(lookup_with(sw(32), {{H, H, P, M}}, 65) == -1);
  CHECK(lookup_with(sw(32), {{H, H, P}}, 49) == -1);
  CHECK(lookup_with(sw(32), {{P, H, H}}, 49) == 48);  // left of the window: not met
}

TEST_CASE("A load limit ends the hit at a block within it, every group checked there",
          "[scheduler][lookup]") {
  // Full attention: floor((computed + L) / 16) * 16 - computed, as vLLM 0.33 cuts it.
  CHECK(lookup_with(fa(), {{H, H, H, H}}, 64, 0, 40) == 32);
  CHECK(lookup_with(fa(), {{H, H, H, H}}, 64, 0, 15) == 0);
  CHECK(lookup_with(fa(), {{H, H, H, H}}, 64, 16, 40) == 32);  // ends at 48
  CHECK(lookup_with(fa(), {{H, H, H, H}}, 64, 0, 1000) == 64);
  CHECK(lookup_with(fa(), {{H, H, H, H}}, 64, 0, -1) == 64);  // no limit
  // Sliding window of 2 blocks: the window is checked at the limited end, not the full one.
  // Blocks 0-1 hit, 2 missing, 3-4 hit: unlimited the window at 3-4 gives 80; limited to 40
  // (39 with the recomputed token, down to 32) the window 0-1 gives 32.
  CHECK(lookup_with(sw(32), {{H, H, M, H, H}}, 81) == 80);
  CHECK(lookup_with(sw(32), {{H, H, M, H, H}}, 81, 0, 40) == 32);
  // Limited to 64 (63, down to 48): blocks 1-2 would be the window, 2 is missing: the front
  // run 0-1 (32).
  CHECK(lookup_with(sw(32), {{H, H, M, H, H}}, 81, 0, 64) == 32);
  // A hybrid model: each group at the limited end.
  const SchedulerConfig hybrid = make_config({full(), window(32)}, 1, 64);
  CHECK(lookup_with(hybrid, {{H, H, H, H, H}, {H, H, M, H, H}}, 81, 0, 40) == 32);
  // Block 0 of the window group missing: at the limited end its window (0-1) fails, and the
  // run reaching the front is empty; unlimited, the window at 3-4 gives the whole 80.
  CHECK(lookup_with(hybrid, {{H, H, H, H, H}, {M, H, M, H, H}}, 81, 0, 40) == 0);
  CHECK(lookup_with(hybrid, {{H, H, H, H, H}, {M, H, M, H, H}}, 81) == 80);
}

TEST_CASE("Mamba keeps one block: the last hit block is enough", "[scheduler][lookup]") {
  const auto config = make_config({mamba()}, 1, 64);
  CHECK(lookup_with(config, {{M, M, H}}, 49) == 48);
  CHECK(lookup_with(config, {{H, H, M}}, 49) == 32);
}

TEST_CASE("A mamba hit ends at a block's end: its block holds the state at its last token",
          "[scheduler][lookup]") {
  // 48 tokens, all three blocks stored: the last token is recomputed, and the state after 47
  // tokens is in no block (block 2 holds the state after 48), so the hit is block 1's 32.
  CHECK(lookup_with(make_config({mamba()}, 1, 64), {{H, H, H}}, 48) == 32);
  // Full attention in 16-token blocks ends the hit at 48, inside mamba's 32-token block 1:
  // down to 32, where block 0 holds the state.
  const auto mixed = make_config({full(16), mamba(32)}, 1, 64);
  CHECK(lookup_with(mixed, {{H, H, H, M}, {H, H}}, 64) == 32);
  CHECK(lookup_with(mixed, {{H, H, H, H, H}, {M, H, M}}, 96) == 64);
}

TEST_CASE("Hybrid: the hit is the largest that every group allows", "[scheduler][lookup]") {
  const auto config = make_config({full(), window(32)}, 1, 64);
  CHECK(lookup_with(config, {{H, H, H, H}, {H, H, M, H}}, 65) == 32);
  CHECK(lookup_with(config, {{H, H, M, M}, {H, H, H, H}}, 65) == 32);
  CHECK(lookup_with(config, {{H, H, H, H}, {M, M, M, M}}, 65) == 0);
}

TEST_CASE("A window over larger blocks, the hit ended inside one, needs the block it reaches",
          "[scheduler][lookup]") {
  // Full attention in 16-token blocks, a 20-token window in 32-token blocks (1 block). Full
  // attention ends the hit at 48, halfway through window block 1: the window read there,
  // tokens 29-47, reaches back into window block 0, which the load then needs too (vLLM 0.33's
  // load window). Counting window_blocks from the block boundary (64) missed it: the hit was
  // 48 and allocation refused the load of the missing block 0.
  const auto config = make_config({full(16), window(20, 32)}, 1, 64);
  CHECK(lookup_with(config, {{H, H, H, M}, {M, H}}, 64) == 0);
  CHECK(lookup_with(config, {{H, H, H, M}, {H, H}}, 64) == 48);
  // Ended on the boundary (32): the window (13-31) is in block 0 alone.
  CHECK(lookup_with(config, {{H, H, M, M}, {H, M}}, 64) == 32);
  // A 12-token window read at 48 (37-47) stays in block 1: block 1 alone is enough.
  CHECK(lookup_with(make_config({full(16), window(12, 32)}, 1, 64), {{H, H, H, M}, {M, H}}, 64) ==
        48);
  // Only the run at the back ends inside a block: below a miss the run ends on a boundary and
  // window_blocks is enough. Full attention ends at 80; window block 2 is missing, and the run
  // below it, block 1, ends at 64, where the window (45-63) is block 1 alone.
  CHECK(lookup_with(config, {{H, H, H, H, H, M}, {M, H, M}}, 96) == 64);
}

TEST_CASE("Convergence: a shrunk hit re-runs the windowed groups", "[scheduler][lookup]") {
  // Lookup order: the window group (2 blocks) before mamba (1). The window group first finds
  // its window at blocks [4, 5] (hit 96); mamba then shrinks the hit to 80 (5 blocks). On
  // [0, 5) the window group's only window is blocks [0, 1], so the re-run brings the hit to
  // 32. Without the re-run the answer would be 80, with block 3 of the window missing.
  const auto config = make_config({window(32), mamba()}, 1, 64);
  CHECK(lookup_with(config, {{H, H, M, M, H, H}, {H, H, H, H, H, M}}, 97) == 32);
}

TEST_CASE("Convergence: a deferral is dropped when a later group shrinks the hit",
          "[scheduler][lookup]") {
  // Full attention meets a pending key at block 5 (deferred); the window group caps the hit at
  // 64, so every group runs again on [0, 4), where nothing is pending.
  const auto config = make_config({full(), window(32)}, 1, 64);
  CHECK(lookup_with(config, {{H, H, H, H, H, P}, {H, H, H, H, M, M}}, 97) == 64);
  // Without the cap the deferral stands.
  CHECK(lookup_with(config, {{H, H, H, H, H, P}, {H, H, H, H, H, H}}, 97) == -1);
}

TEST_CASE("Lookup defers a request whose blocks are being loaded for another",
          "[scheduler][lookup]") {
  for (const bool prefix_caching : {true, false}) {
    auto config = make_config({full()}, 1, 64);
    config.prefix_caching = prefix_caching;
    Harness h(config);
    const auto hashes = chain_hashes("t", 3);
    for (std::size_t i = 0; i < 3; ++i) h.place(hashes, 0, i);
    REQUIRE(h.lookup("a", hashes, 48, 0) == 48);
    std::vector<AllocatedGroup> groups{{ids(1, 3), 0}};
    h.s.on_allocated("a", groups, 48);
    const auto b = h.lookup("b", hashes, 48, 0);
    if (prefix_caching) {
      CHECK_FALSE(b.has_value());
      CHECK(h.s.stats().deferrals == 1);
    } else {
      CHECK(b == 48);
    }
  }
}

TEST_CASE("A lookup answering 0 still records the hit blocks and touches the request",
          "[scheduler][lookup]") {
  // Two keys in a pool of 2; the request whose lookup touches key 0 keeps it over key 1.
  Harness h(make_config({full()}, 1, 2));
  const auto hashes = chain_hashes("t", 3);
  h.place(hashes, 0, 0);
  h.place(hashes, 0, 1);
  // A lookup of a request that shares only block 1 (with its own block 0) answers 0 (first
  // key misses) but touches block 1's key: block 0's key becomes the least recent.
  auto other = chain_hashes("t", 2);
  other[0] = chain_hashes("zz", 1)[0];
  h.s.update_request("o", 48, other);
  REQUIRE(h.s.lookup("o", 0) == 0);
  (void)h.s.take_events();  // the donors' stored events
  REQUIRE(h.lookup("c", chain_hashes("c", 1), 16, 0) == 0);
  h.alloc_none("c");
  const StepResult st = h.step("c", 0, 16, {ids(7, 1)});
  REQUIRE(st.store_jobs.size() == 1);
  const auto removed = h.s.take_events();
  REQUIRE(removed.size() == 1);
  REQUIRE(removed[0].removed);
  CHECK(removed[0].keys == std::vector<Key>{Key{hashes[0], 0}});
}

TEST_CASE("A preempted request whose stores still run is asked to retry, not given a load",
          "[scheduler][lookup]") {
  // Issue 54: vLLM may look a preempted request up again before its flushed stores are
  // reported; a hit then made on_allocated refuse the load inside the engine's step ("has 1
  // job(s) in flight"). vLLM's own connector delays such a request; so does kvoffload.
  Harness h(fa());
  const auto hashes = chain_hashes("pre", 5);
  REQUIRE(h.lookup("A", hashes, 80, 0) == 0);
  h.alloc_none("A");
  const StepResult s1 = h.step("A", 0, 64, {ids(1, 4)});
  REQUIRE(s1.store_jobs.size() == 1);
  h.complete(s1.store_jobs[0].id);  // blocks 0-3 ready
  const StepResult s2 = h.step("A", 64, 16, {ids(5, 1)});
  REQUIRE(s2.store_jobs.size() == 1);  // block 4, still in flight
  const std::vector<std::string> preempted{"A"};
  const StepResult s3 = h.s.build_step({}, preempted);
  CHECK(s3.flush == std::vector<JobId>{s2.store_jobs[0].id});
  h.s.limit_loads("A", 64);  // blocks 0-3 only: without the rule this is a 64-token hit
  CHECK_FALSE(h.s.lookup("A", 0).has_value());
  h.complete(s2.store_jobs[0].id);
  REQUIRE(h.s.lookup("A", 0) == 64);
  std::vector<AllocatedGroup> groups{{ids(11, 5), 0}};
  CHECK_NOTHROW(h.s.on_allocated("A", groups, 64));
}
