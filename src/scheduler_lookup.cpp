// SEMANTICS 4: how many of a request's tokens can be loaded from the host cache.

#include <algorithm>

#include "block_math.hpp"
#include "scheduler_impl.hpp"

namespace kvoffload {
namespace {

using detail::cdiv;

/// A scan's answer: a count of offloaded blocks, or "deferred" (it met a key being stored).
struct ScanResult {
  std::int64_t count = 0;
  bool deferred = false;
};

/// Full attention: keys from the front up to the first miss; a pending key counts as a hit
/// but defers the answer.
ScanResult prefix_scan(HostBlockManager& manager, const Scheduler::Impl& s, const RequestState& r,
                       std::size_t g, std::int64_t start, std::int64_t end) {
  ScanResult res;
  for (std::int64_t i = start; i < end; ++i) {
    const LookupResult found = manager.lookup(s.key(r, g, i));
    if (found == LookupResult::miss) break;
    if (found == LookupResult::pending) res.deferred = true;
    ++res.count;
  }
  return res;
}

/// Sliding window and mamba: from the back, the rightmost run of window_blocks consecutive
/// hits; without one, the run that reaches the front. A pending key breaks a run and defers.
ScanResult suffix_scan(HostBlockManager& manager, const Scheduler::Impl& s, const RequestState& r,
                       std::size_t g, std::int64_t start, std::int64_t end) {
  const std::int64_t window = s.layouts[g].window_blocks;
  ScanResult res;
  std::int64_t run = 0;
  for (std::int64_t i = end - 1; i >= start; --i) {
    const LookupResult found = manager.lookup(s.key(r, g, i));
    if (found == LookupResult::hit) {
      if (++run == window) {
        res.count = (i - start) + window;
        return res;
      }
    } else {
      if (found == LookupResult::pending) res.deferred = true;
      run = 0;
    }
  }
  res.count = run;  // the run that reaches the front (0 if the first key missed)
  return res;
}

}  // namespace

std::optional<std::int64_t> Scheduler::Impl::lookup(RequestState& r,
                                                    std::int64_t num_computed_tokens) {
  const bool is_new = !r.looked_up;
  if (is_new) {
    r.looked_up = true;
  } else {
    for (GroupState& g : r.groups) g.block_ids.clear();
  }
  r.num_local_tokens = num_computed_tokens;
  ++stats.lookups;

  const std::int64_t nct = num_computed_tokens;
  // Every answer but "retry later" records the hit of a new request and touches its keys;
  // "nothing to load" included (vLLM records the request's hit blocks either way).
  const auto finish = [&](std::int64_t hit_tokens) -> std::optional<std::int64_t> {
    if (is_new) {
      for (std::size_t g = 0; g < layouts.size(); ++g) {
        r.groups[g].num_hit_blocks = (nct + hit_tokens) / layouts[g].offloaded_block_size;
      }
    }
    touch(r);
    stats.hit_tokens += static_cast<std::uint64_t>(hit_tokens);
    return hit_tokens;
  };
  std::int64_t max_hit = r.num_tokens - (any_windowed ? 1 : 0);
  std::int64_t hit = 0;
  bool defer = false;

  enum class Pass { none, windowed, all };
  Pass queued = Pass::all;
  while (queued != Pass::none) {
    const Pass pass = queued;
    queued = Pass::none;
    bool windowed_seen = false;
    for (const std::size_t g : lookup_order) {
      const GroupLayout& layout = layouts[g];
      if (pass == Pass::windowed && !layout.windowed()) continue;
      const std::int64_t obs = layout.offloaded_block_size;
      const std::int64_t nk = num_keys(r, g);
      max_hit = std::min(max_hit, nk * obs);
      if (max_hit - nct < obs) return finish(0);
      const std::int64_t start = nct / obs;
      const std::int64_t end = std::min(cdiv(max_hit, obs), nk);
      const ScanResult res = layout.windowed() ? suffix_scan(manager, *this, r, g, start, end)
                                               : prefix_scan(manager, *this, r, g, start, end);
      if (res.deferred) {
        defer = true;
      } else {
        if (res.count == 0) return finish(0);
        max_hit = std::min(max_hit, obs * (start + res.count));
      }
      const std::int64_t new_hit = max_hit - nct;
      if (new_hit < obs) return finish(0);
      if (new_hit < hit) {
        // A later group shrank the hit: earlier answers may have changed.
        if (defer) {
          defer = false;
          queued = Pass::all;
        } else if (windowed_seen && queued == Pass::none) {
          queued = Pass::windowed;
        }
      }
      hit = new_hit;
      if (layout.windowed()) windowed_seen = true;
    }
  }
  if (defer) {
    ++stats.deferrals;
    return std::nullopt;
  }

  if (config.prefix_caching && !being_loaded.empty()) {
    for (std::size_t g = 0; g < layouts.size(); ++g) {
      const std::int64_t obs = layouts[g].offloaded_block_size;
      const std::int64_t start = nct / obs;
      const std::int64_t stop = cdiv(nct + hit, obs);
      const std::int64_t first =
          layouts[g].windowed() ? std::max(start, stop - layouts[g].window_blocks) : start;
      for (std::int64_t i = first; i < stop; ++i) {
        if (being_loaded.contains(key(r, g, i))) {
          ++stats.deferrals;
          return std::nullopt;
        }
      }
    }
  }

  return finish(hit);
}

}  // namespace kvoffload
