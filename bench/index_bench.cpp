// kvoffload-bench index: what a block index costs at scale (issue 51 item 3). The host cache
// and every tier's index (disk slots, shared-tier keys: TierState::index) are the same
// HostBlockManager, so this measures one: heap bytes per stored block, beyond the blocks'
// own bytes (glibc's mallinfo2 before construction and after every block is stored, events
// taken; a second reading after another half of the capacity was stored, so evictions ran and
// ARC's ghosts were used: its ghost storage is allocated up front, so the figure is its whole
// cost; the default store_threshold 0, so no admission tracker), and the latency of single
// lookups (hits and misses, timed one by one; the timer's own cost is reported, not
// subtracted). The baseline in the same run: a
// std::unordered_map<Key, int32_t> holding the same keys (what a plain index costs).

#include <cstring>
#include <random>
#include <unordered_map>

#include "bench_common.hpp"
#include "kvoffload/host_block_manager.hpp"
#include "manager_fill.hpp"
#include "scenarios.hpp"

namespace kvbench {
namespace {

using namespace kvoffload;
using Clock = std::chrono::steady_clock;

// Key i of a run: `hash_bytes` bytes derived from (seed, i), group i % 3.
Key key_at(std::uint64_t seed, std::uint64_t i, std::size_t hash_bytes) {
  std::uint8_t b[BlockHash::max_size];
  std::uint64_t x = (seed * 0x9e3779b97f4a7c15ULL) ^ (i + 1);
  for (std::size_t at = 0; at < hash_bytes; at += 8) {
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 29;
    std::memcpy(b + at, &x, std::min<std::size_t>(8, hash_bytes - at));
  }
  return Key{BlockHash::from_bytes(std::span<const std::uint8_t>(b, hash_bytes)),
             static_cast<std::uint32_t>(i % 3)};
}

struct Latency {
  std::vector<double> hit_ns, miss_ns;
};

nlohmann::json quantiles(std::vector<double> v) {
  return {{"p50_ns", quantile(v, 0.5)},
          {"p99_ns", quantile(v, 0.99)},
          {"p999_ns", quantile(v, 0.999)},
          {"samples", v.size()}};
}

// Times `samples` single lookups of present keys (indices drawn from [first, first + count),
// or from `present` when given) and of absent ones (indices past every stored key),
// alternating.
template <typename Find>
Latency time_lookups(std::uint64_t seed, std::uint64_t first, std::uint64_t count,
                     std::size_t hash_bytes, std::size_t samples, Find&& find,
                     const std::vector<std::uint64_t>& present = {}) {
  std::mt19937_64 rng(seed + 7);
  Latency out;
  out.hit_ns.reserve(samples);
  out.miss_ns.reserve(samples);
  std::uint64_t found = 0;
  for (std::size_t s = 0; s < samples; ++s) {
    const std::uint64_t at =
        present.empty() ? first + rng() % count : present[rng() % present.size()];
    const Key hit = key_at(seed, at, hash_bytes);
    const Key miss = key_at(seed, (first + count) * 4 + rng() % count, hash_bytes);
    auto t0 = Clock::now();
    found += find(hit) ? 1 : 0;
    auto t1 = Clock::now();
    out.hit_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
    t0 = Clock::now();
    found += find(miss) ? 1 : 0;
    t1 = Clock::now();
    out.miss_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
  }
  if (found != samples) {
    throw std::runtime_error("index bench: " + std::to_string(found) + " lookups found, " +
                             std::to_string(samples) + " present keys looked up");
  }
  return out;
}

double timer_cost_ns() {
  std::vector<double> v;
  v.reserve(100000);
  for (int i = 0; i < 100000; ++i) {
    const auto t0 = Clock::now();
    const auto t1 = Clock::now();
    v.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
  }
  return summarize(v).median;
}

nlohmann::json latency_json(Latency lat) {
  return {{"hit", quantiles(std::move(lat.hit_ns))}, {"miss", quantiles(std::move(lat.miss_ns))}};
}

// The manager: fill [0, blocks), then store [blocks, 1.5 blocks) so that every store evicts
// (ARC's ghost lists fill); lookups of [blocks, 1.5 blocks), which LRU and ARC both keep
// (reuse: of the keys it kept).
nlohmann::json run_manager_index(std::uint64_t blocks, const std::string& policy,
                                 std::size_t hash_bytes, std::size_t samples, std::uint64_t seed) {
  ManagerFiller fill;
  fill.requests = policy == "reuse";
  const double heap0 = heap_in_use();
  ManagerConfig mc;
  mc.host_blocks = static_cast<std::int64_t>(blocks);
  mc.policy = parse_eviction_policy(policy, "policy");
  HostBlockManager m(mc);
  const auto key_of = [seed, hash_bytes](std::uint64_t i) { return key_at(seed, i, hash_bytes); };
  auto store = [&](std::uint64_t first, std::uint64_t last) {
    fill.store(m, first, last, key_of, "index bench");
  };
  const auto t0 = Clock::now();
  store(0, blocks);
  const double fill_s = seconds_since(t0);
  const double full = (heap_in_use() - heap0) / static_cast<double>(blocks);
  store(blocks, blocks + blocks / 2);
  const double churned = (heap_in_use() - heap0) / static_cast<double>(blocks);
  // Reuse keeps by predicted value, not recency: its hits are drawn from the keys it kept.
  std::vector<std::uint64_t> present;
  if (policy == "reuse") {
    for (std::uint64_t i = 0; i < blocks + blocks / 2; ++i) {
      if (m.peek(key_of(i)) == LookupResult::hit) present.push_back(i);
    }
  }
  Latency lat = time_lookups(
      seed, blocks, blocks / 2, hash_bytes, samples,
      [&m](const Key& k) { return m.lookup(k) == LookupResult::hit; }, present);
  return {{"heap_bytes_per_block_full", full},
          {"heap_bytes_per_block_after_evictions", churned},
          {"stores_per_second", static_cast<double>(blocks) / fill_s},
          {"lookup", latency_json(std::move(lat))}};
}

// The baseline: the same keys in a std::unordered_map (reserved for the capacity up front).
nlohmann::json run_map_index(std::uint64_t blocks, std::size_t hash_bytes, std::size_t samples,
                             std::uint64_t seed) {
  const double heap0 = heap_in_use();
  std::unordered_map<Key, std::int32_t, KeyHash> map;
  map.reserve(blocks);
  for (std::uint64_t i = 0; i < blocks; ++i) {
    map.emplace(key_at(seed, i, hash_bytes), static_cast<std::int32_t>(i));
  }
  const double full = (heap_in_use() - heap0) / static_cast<double>(blocks);
  Latency lat = time_lookups(seed, blocks / 2, blocks / 2, hash_bytes, samples,
                             [&map](const Key& k) { return map.find(k) != map.end(); });
  return {{"heap_bytes_per_block_full", full}, {"lookup", latency_json(std::move(lat))}};
}

}  // namespace

nlohmann::json run_index(const Options& opt, const std::string& blocks_list,
                         std::size_t hash_bytes) {
  if (hash_bytes < 8 || hash_bytes > BlockHash::max_size) {
    throw std::invalid_argument("--hash-bytes must be 8 to 32 (fewer cannot tell 10M keys apart)");
  }
  const std::vector<std::uint64_t> sizes = parse_counts(blocks_list, "--blocks", 1024, 1e9);
  const std::size_t samples = opt.quick ? 20000 : 1000000;
  const std::size_t runs = opt.runs > 0 ? opt.runs : 1;
  Progress progress("index", sizes.size() * runs * 4);
  nlohmann::json results = nlohmann::json::array();
  for (const std::uint64_t n : sizes) {
    for (std::size_t r = 0; r < runs; ++r) {
      nlohmann::json row = {{"blocks", n}, {"run", r}};
      for (const std::string policy : {"lru", "arc", "reuse"}) {
        row[policy] = run_manager_index(n, policy, hash_bytes, samples, 1000 + r);
        progress.step(std::to_string(n) + " " + policy);
      }
      row["unordered_map"] = run_map_index(n, hash_bytes, samples, 1000 + r);
      progress.step(std::to_string(n) + " unordered_map");
      results.push_back(row);
    }
  }
  progress.done();
  return {{"hash_bytes", hash_bytes},
          {"key_bytes", sizeof(Key)},
          {"timer_cost_ns", timer_cost_ns()},
          {"counts",
           "heap_bytes_per_block: glibc mallinfo2 (small and mmapped blocks) from before the index "
           "is built to after every block is stored, divided by the capacity; the blocks' own "
           "bytes (host pool, disk slots, cluster values) are not in it. The host cache and each "
           "tier's index are one HostBlockManager each, here with store_threshold 0 (no admission "
           "tracker). Lookup latency: single lookups timed one "
           "by one, the timer's cost (timer_cost_ns) included"},
          {"results", results}};
}

}  // namespace kvbench
