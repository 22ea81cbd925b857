// kvoffload-bench manager: host block manager throughput on one core, LRU and ARC.

#include <cstring>
#include <random>

#include "bench_common.hpp"
#include "kvoffload/host_block_manager.hpp"
#include "scenarios.hpp"

namespace kvbench {
namespace {

using namespace kvoffload;
using Clock = std::chrono::steady_clock;

std::vector<Key> make_keys(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Key> keys;
  keys.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint8_t b[16];
    const std::uint64_t x = rng(), y = rng();
    std::memcpy(b, &x, 8);
    std::memcpy(b + 8, &y, 8);
    keys.push_back(Key{BlockHash::from_bytes(b), static_cast<std::uint32_t>(i % 3)});
  }
  return keys;
}

}  // namespace

nlohmann::json run_manager(const Options& opt) {
  const std::size_t runs = opt.runs > 0 ? opt.runs : (opt.quick ? 2 : 5);
  const std::size_t capacity = opt.quick ? 16384 : 262144;
  const std::size_t batch = 64;  // keys per prepare_store / touch call, like a request's blocks
  nlohmann::json out = nlohmann::json::object();
  Progress progress("manager", 2 * runs);
  for (const std::string policy : {"lru", "arc"}) {
    std::vector<double> lookups, stores, touches;
    for (std::size_t r = 0; r < runs; ++r) {
      ManagerConfig c;
      c.host_blocks = static_cast<std::int64_t>(capacity);
      c.policy = parse_eviction_policy(policy, "policy");
      c.enable_events = false;
      HostBlockManager m(c);
      const auto keys = make_keys(capacity * 2, 100 + r);
      PreparedStore prepared;
      // Fill the pool, then keep storing: every store evicts.
      auto t0 = Clock::now();
      std::size_t stored = 0;
      for (std::size_t i = 0; i + batch <= keys.size(); i += batch) {
        const std::span<const Key> chunk(keys.data() + i, batch);
        if (m.prepare_store(chunk, prepared)) {
          m.complete_store(prepared.keys_to_store, true);
          stored += prepared.keys_to_store.size();
        }
      }
      stores.push_back(static_cast<double>(stored) / seconds_since(t0));
      // Lookups: half hits (the recent keys), half misses.
      const std::size_t n = opt.quick ? 1 << 20 : 1 << 23;
      std::uint64_t hits = 0;
      t0 = Clock::now();
      for (std::size_t i = 0; i < n; ++i) {
        hits += m.lookup(keys[(i * 7919) % keys.size()]) == LookupResult::hit;
      }
      lookups.push_back(static_cast<double>(n) / seconds_since(t0));
      if (hits == 0) throw std::runtime_error("manager bench: no hits");
      t0 = Clock::now();
      std::size_t touched = 0;
      for (std::size_t i = capacity; i + batch <= keys.size(); i += batch) {
        m.touch(std::span<const Key>(keys.data() + i, batch));
        touched += batch;
      }
      touches.push_back(static_cast<double>(touched) / seconds_since(t0));
      progress.step(policy);
    }
    out[policy] = {{"capacity_blocks", capacity},
                   {"lookups_per_second", to_json(summarize(lookups), "per_s")},
                   {"stores_with_eviction_per_second", to_json(summarize(stores), "per_s")},
                   {"touches_per_second", to_json(summarize(touches), "per_s")}};
  }
  progress.done();
  return out;
}

}  // namespace kvbench
