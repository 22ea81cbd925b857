// The offline optimum of a trace's host cache (issue 55, item 1): Belady's rule with the whole
// trace known in advance. A request hits the longest prefix of its full blocks (full_blocks:
// what an engine hashes) the cache holds, then every full block it names is used: a held block's
// next use moves on, a missing one is admitted if the cache has room, else in place of the held
// block whose next use is farthest, unless its own next use is farther still (then it is not
// admitted: the optimum also decides admission). The request's own blocks are never the ones
// evicted for it, as in the real cache.

#include <cstdint>
#include <iterator>
#include <limits>
#include <set>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "trace_bench.hpp"

namespace kvbench {
namespace {

constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();

/// next[k][i]: the index of the first request after k that names request k's full block i, or
/// kNever.
std::vector<std::vector<std::int64_t>> next_uses(const std::vector<TraceRequest>& trace,
                                                 std::int64_t block_tokens) {
  std::vector<std::vector<std::int64_t>> next(trace.size());
  std::unordered_map<std::uint64_t, std::int64_t> later;
  for (std::size_t k = trace.size(); k-- > 0;) {
    const auto ids = std::span(trace[k].hash_ids).first(full_blocks(trace[k], block_tokens));
    next[k].resize(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const auto it = later.find(ids[i]);
      next[k][i] = it == later.end() ? kNever : it->second;
    }
    for (const std::uint64_t id : ids) later[id] = static_cast<std::int64_t>(k);
  }
  return next;
}

}  // namespace

double optimum_hit_ratio(const std::vector<TraceRequest>& trace, std::int64_t block_tokens,
                         std::int64_t capacity_blocks) {
  const auto next = next_uses(trace, block_tokens);
  std::unordered_map<std::uint64_t, std::int64_t> held;  // block -> its next use
  std::set<std::pair<std::int64_t, std::uint64_t>> by_next;
  std::int64_t hit = 0, total = 0;
  for (std::size_t k = 0; k < trace.size(); ++k) {
    const TraceRequest& r = trace[k];
    const auto ids = std::span(r.hash_ids).first(full_blocks(r, block_tokens));
    for (std::size_t i = 0; i < ids.size() && held.contains(ids[i]); ++i) {
      hit += block_tokens_of(r, i, block_tokens);
    }
    total += prompt_tokens(r, block_tokens);
    const std::unordered_set<std::uint64_t> mine(ids.begin(), ids.end());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const std::uint64_t id = ids[i];
      const std::int64_t use = next[k][i];
      if (const auto it = held.find(id); it != held.end()) {
        by_next.erase({it->second, id});
        it->second = use;
        by_next.insert({use, id});
        continue;
      }
      if (capacity_blocks <= 0) continue;
      if (static_cast<std::int64_t>(held.size()) >= capacity_blocks) {
        // The held block used farthest ahead that is not this request's.
        auto victim = by_next.end();
        for (auto it = by_next.rbegin(); it != by_next.rend(); ++it) {
          if (!mine.contains(it->second)) {
            victim = std::prev(it.base());
            break;
          }
        }
        if (victim == by_next.end() || victim->first <= use) continue;  // not admitted
        held.erase(victim->second);
        by_next.erase(victim);
      }
      held.emplace(id, use);
      by_next.insert({use, id});
    }
  }
  return total > 0 ? static_cast<double>(hit) / static_cast<double>(total) : 0.0;
}

}  // namespace kvbench
