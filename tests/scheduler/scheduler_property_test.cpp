// Property test: the library's synthetic engine (tools/sim) drives the scheduler, a real worker
// and its HostBackend over random hybrid configurations (1-4 groups, factors 1-16, small host
// pools that force eviction, 1-3 workers reporting piecemeal, failed reports and failed
// copies, GPU prefix-cache hits, preemptions, GPU block reuse, reset_cache, and block tables as
// vLLM makes them: window blocks and mamba states freed while the request runs and handed to
// other requests at once, align-mode mamba pads), and this test's oracle checks after every step:
//  - every job satisfies the SEMANTICS 6 invariants (check_job_invariants);
//  - job keys and host blocks agree with the manager (stores writing, loads ready and read);
//  - a key is a hit exactly when a store of it succeeded and it was not evicted since (a model
//    kept from the manager's events);
//  - a GPU block written this step while a store still reads it has that store in the flush
//    set, and the flush set is sorted;
// and the engine compares every loaded page with what the request would have computed.
// The seed is printed; KVOFFLOAD_TEST_SEED=N replays one.

#include <cstdlib>
#include <iostream>
#include <random>
#include <set>

#include <catch2/catch_test_macros.hpp>

#include "kvoffload/job.hpp"
#include "sim/synthetic_engine.hpp"

using namespace kvoffload;

namespace {

struct KeyLess {
  bool operator()(const Key& a, const Key& b) const {
    if (a.group != b.group) return a.group < b.group;
    return std::lexicographical_compare(a.hash.data(), a.hash.data() + a.hash.size(), b.hash.data(),
                                        b.hash.data() + b.hash.size());
  }
};

/// A random configuration of the synthetic engine, as varied as the scheduler allows.
kvsim::SimConfig random_config(std::uint64_t seed, std::int64_t steps, const char* policy) {
  std::mt19937_64 rng(seed);
  auto rand = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
  kvsim::SimConfig c;
  c.seed = rng();
  c.steps = steps;
  c.policy = policy;
  c.groups.clear();
  const auto G = rand(1, 4);
  c.hash_block_size = 16;
  c.block_size_factor = chance(0.3) ? 1 : rand(1, 16);
  for (std::int64_t g = 0; g < G; ++g) {
    GroupConfig gc;
    const auto k = rand(0, 2);
    gc.kind = k == 0 ? GroupKind::full_attention
                     : (k == 1 ? GroupKind::sliding_window : GroupKind::mamba);
    gc.gpu_block_size = chance(0.7) ? 16 : 32;
    // Windows of whole blocks and of any length (17, 2047: an off-by-one in the window's
    // first token shows only there).
    if (gc.kind == GroupKind::sliding_window)
      gc.sliding_window = chance(0.5) ? rand(1, 4) * 16 * rand(1, 8) : rand(1, 600);
    c.groups.push_back(gc);
  }
  c.num_workers = rand(1, 3);
  c.prefix_caching = chance(0.7);
  c.host_blocks = rand(4, 48) * G;
  if (chance(0.2)) c.store_threshold = 2;
  c.layers = 1;
  c.page_bytes = 16;
  c.gpu_blocks = 20000;
  c.max_running = 6;
  c.prefix_families = 3;
  c.preempt_probability = 0.02;
  c.local_hit_probability = 0.4;
  c.reset_probability = 0.002;
  c.report_failure_probability = 0.03;
  c.staggered_reports = true;
  c.copy_threads = 1;
  c.defer_stores = chance(0.5);
  c.mamba_pads = chance(0.5);   // vLLM's align-mode tables: nulls between mamba states
  c.spec_decode = chance(0.5);  // drafts; mamba blocks of decode steps hold decode-time states
  c.final_states = true;        // as the vLLM connector: the final tokens at every lookup
  if (chance(0.3)) {
    c.faulty = true;
    c.faults.seed = rng();
    c.faults.fail = 0.02;
    c.faults.delay = 0.2;
  }
  return c;
}

std::string describe(const kvsim::SimConfig& c) {
  // Appends only: GCC 12 warns (-Wrestrict, a false positive) on "literal" + std::string&&.
  std::string d = "groups:";
  for (const auto& g : c.groups) {
    d.append(" ").append(to_string(g.kind)).append("/").append(std::to_string(g.gpu_block_size));
    if (g.sliding_window) d.append("/w").append(std::to_string(g.sliding_window));
  }
  d.append(" f=").append(std::to_string(c.block_size_factor));
  d.append(" host_blocks=").append(std::to_string(c.host_blocks));
  d.append(" workers=").append(std::to_string(c.num_workers));
  d.append(" prefix_caching=").append(std::to_string(c.prefix_caching));
  d.append(" policy=").append(c.policy);
  d.append(" store_threshold=").append(std::to_string(c.store_threshold));
  d.append(" faulty=").append(std::to_string(c.faulty));
  d.append(" mamba_pads=").append(std::to_string(c.mamba_pads));
  d.append(" spec_decode=").append(std::to_string(c.spec_decode));
  return d;
}

/// The oracle: SEMANTICS' invariants, checked on what each step did.
class Oracle {
 public:
  explicit Oracle(std::int64_t num_groups, std::int64_t f) : groups_(num_groups), f_(f) {}

  void observe(const kvsim::StepObservation& o) {
    apply(o.events_before_reset);
    if (o.reset) model_.clear();  // reset_cache emits no per-key events
    apply(o.events);
    const HostBlockManager& m = o.scheduler.manager();
    for (const TransferJob& job : o.out.store_jobs) {
      check_job_invariants(job, groups_, f_);
      for (std::size_t i = 0; i < job.keys.size(); ++i) {
        REQUIRE(m.peek(job.keys[i]) == LookupResult::pending);
        REQUIRE(m.block_of(job.keys[i]) == job.host_block_ids[i]);
        seen_keys_.insert(job.keys[i]);
      }
    }
    for (const TransferJob& job : o.out.load_jobs) {
      check_job_invariants(job, groups_, f_);
      for (std::size_t i = 0; i < job.keys.size(); ++i) {
        // Loaded keys were stored successfully and not evicted since.
        REQUIRE(model_.count(job.keys[i]) == 1);
        REQUIRE(m.block_of(job.keys[i]) == job.host_block_ids[i]);
        REQUIRE(m.readers(job.host_block_ids[i]) > 0);
      }
    }
    // The fence: a store still running that reads a block this step writes (the forward
    // pass, a local prefix hit, a load) must be in the flush set.
    const std::set<JobId> flush(o.out.flush.begin(), o.out.flush.end());
    for (const auto& [id, sources] : o.stores_running) {
      for (const GpuBlockId b : sources) {
        if (o.written.count(b) == 0) continue;
        ++fence_checks;
        INFO("store job " << id << " reads GPU block " << b << ", written this step");
        REQUIRE(flush.count(id) == 1);
      }
    }
    for (std::size_t i = 1; i < o.out.flush.size(); ++i) {
      REQUIRE(o.out.flush[i - 1] < o.out.flush[i]);
    }
    // A key is a hit exactly when the model says it was stored and not evicted since.
    if (steps_++ % 50 == 0) {
      for (const Key& k : seen_keys_) {
        INFO("key " << to_string(k));
        REQUIRE((m.peek(k) == LookupResult::hit) == (model_.count(k) == 1));
      }
    }
  }

  std::int64_t fence_checks = 0;

 private:
  void apply(const std::vector<ManagerEvent>& events) {
    for (const ManagerEvent& e : events) {
      for (const Key& k : e.keys) {
        if (e.removed) {
          REQUIRE(model_.erase(k) == 1);
        } else {
          REQUIRE(model_.insert(k).second);
        }
      }
    }
  }

  std::int64_t groups_, f_;
  std::int64_t steps_ = 0;
  std::set<Key, KeyLess> model_;
  std::set<Key, KeyLess> seen_keys_;
};

std::uint64_t test_seed() {
  if (const char* env = std::getenv("KVOFFLOAD_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  return std::random_device{}();
}

}  // namespace

TEST_CASE(
    "Property: random hybrid configurations, LRU, ARC and reuse, hold the SEMANTICS invariants",
    "[scheduler][property]") {
  const std::uint64_t seed = test_seed();
  std::cout << "scheduler property test seed: " << seed
            << " (replay with KVOFFLOAD_TEST_SEED=" << seed << ")\n";
  std::mt19937_64 seeds(seed);
  constexpr int kConfigs = 50;
  constexpr std::int64_t kSteps = 500;  // 25,000 steps in all
  std::int64_t loads = 0, stores = 0, hits = 0, local_hits = 0, fences = 0, resets = 0,
               verified = 0;
  std::uint64_t partial_stores = 0, partial_misses = 0;
  // KVOFFLOAD_TEST_CONFIG=N runs only configuration N of the seed (the copies' timing still
  // varies from run to run: the worker's threads are real).
  const int only = std::getenv("KVOFFLOAD_TEST_CONFIG") != nullptr
                       ? std::atoi(std::getenv("KVOFFLOAD_TEST_CONFIG"))
                       : -1;
  // A lookup refusing a partly written block needs a rare interleaving (1 to 10 in the 50
  // configurations, by the copies' timing, sometimes none): more configurations of the same
  // seed run until one happens, up to twice as many (every one checked the same way).
  for (int c = 0; c < kConfigs || (partial_misses == 0 && only < 0 && c < 2 * kConfigs); ++c) {
    // The configurations take LRU, ARC and reuse in turn: every policy must hold every
    // invariant.
    static constexpr const char* kPolicies[] = {"lru", "arc", "reuse"};
    kvsim::SimConfig config = random_config(seeds(), kSteps, kPolicies[c % 3]);
    if (only >= 0 && c != only) continue;
    INFO("seed " << seed << ", configuration " << c << " (" << describe(config) << ")");
    Oracle oracle(static_cast<std::int64_t>(config.groups.size()), config.block_size_factor);
    config.observer = [&](const kvsim::StepObservation& o) { oracle.observe(o); };
    kvsim::SyntheticEngine engine(config);
    const kvsim::SimReport r = engine.run();
    INFO("first mismatch: " << r.first_mismatch);
    // A load of a sub-block no store wrote counts as a mismatch, in every group kind.
    REQUIRE(r.unwritten_reads == 0);
    REQUIRE(r.mismatches == 0);
    loads += r.load_jobs;
    stores += r.store_jobs;
    hits += r.lookup_hits;
    local_hits += r.local_hits;
    fences += oracle.fence_checks;
    partial_stores += r.partial_stores;
    partial_misses += r.partial_misses;
    resets += r.resets;
    verified += r.blocks_verified;
  }
  std::cout << "  " << stores << " stores, " << loads << " loads (" << verified
            << " GPU blocks verified), " << hits << " lookup hits, " << local_hits
            << " GPU prefix-cache hits, " << fences << " fenced block reuses, " << resets
            << " resets, " << partial_stores << " blocks stored partly written, " << partial_misses
            << " lookups that refused one\n";
  if (only >= 0) return;
  // The run must have exercised what it checks.
  CHECK(loads > 100);
  CHECK(stores > 1000);
  CHECK(verified > 1000);
  CHECK(local_hits > 0);
  CHECK(fences > 0);
  // The written-sub-block rule was exercised: partly written blocks were stored and refused.
  CHECK(partial_stores > 0);
  CHECK(partial_misses > 0);
}

TEST_CASE("Property control: without the final tokens, decode-time mamba states are served",
          "[scheduler][property][final-states]") {
  // The oracle must see what limit_state_stores prevents (SEMANTICS 6.10): the same runs with
  // the engine leaving the final tokens out (the bridge before issue 47) load mamba blocks
  // that decode steps wrote, which differ from what the requests' prefill computes.
  const std::uint64_t seed = test_seed();
  std::cout << "final-states control seed: " << seed << "\n";
  std::mt19937_64 seeds(seed);
  std::int64_t caught = 0, clean_verified = 0;
  for (int c = 0; c < 6; ++c) {
    kvsim::SimConfig config = random_config(seeds(), 500, "lru");
    config.groups = {{GroupKind::full_attention, 16, 0}, {GroupKind::mamba, 16, 0}};
    config.host_blocks = 96;
    config.faulty = false;
    config.report_failure_probability = 0;
    config.spec_decode = true;
    INFO("seed " << seed << ", configuration " << c << " (" << describe(config) << ")");
    config.final_states = true;
    const kvsim::SimReport good = kvsim::SyntheticEngine(config).run();
    INFO("first mismatch with the final tokens: " << good.first_mismatch);
    REQUIRE(good.mismatches == 0);
    clean_verified += good.blocks_verified;
    config.final_states = false;
    caught += kvsim::SyntheticEngine(config).run().mismatches;
  }
  CHECK(clean_verified > 100);
  CHECK(caught > 0);
}
