// SEMANTICS 4: how many of a request's tokens can be loaded from the host cache.

#include <algorithm>

#include "common/block_math.hpp"
#include "scheduler/scheduler_impl.hpp"

namespace kvoffload {
namespace {

using detail::cdiv;

/// A scan's answer: a count of offloaded blocks, or "deferred" (it met a key being stored).
struct ScanResult {
  std::int64_t count = 0;
  bool deferred = false;
};

/// Full attention: keys from the front up to the first miss; a pending key counts as a hit
/// but defers the answer. A key stored without its leading sub-blocks is a miss (SEMANTICS
/// 6.8): a prefix needs all of them.
ScanResult prefix_scan(Scheduler::Impl& s, const RequestState& r, std::size_t g, std::int64_t start,
                       std::int64_t end, LookupPass* pass) {
  ScanResult res;
  for (std::int64_t i = start; i < end; ++i) {
    const Probe found = s.probe(r, g, i, pass);
    if (found.result == LookupResult::miss) break;
    if (found.valid_from > 0) {
      ++s.stats.partial_misses;
      break;
    }
    if (found.result == LookupResult::pending) res.deferred = true;
    ++res.count;
  }
  return res;
}

/// Sliding window and mamba: from the back, the rightmost run of window_blocks consecutive
/// hits; without one, the run that reaches the front. A pending key breaks a run and defers.
/// The run at the back ends at max_hit, which may fall short of this group's block boundary:
/// it needs the load window (one more block when the window then reaches further back); a run
/// below a miss ends on a boundary and needs window_blocks. A key stored without its leading
/// sub-blocks may only be the run's front, and only if the window at the run's end needs none
/// of its unwritten sub-blocks (SEMANTICS 6.8).
ScanResult suffix_scan(Scheduler::Impl& s, const RequestState& r, std::size_t g, std::int64_t start,
                       std::int64_t end, std::int64_t nct, std::int64_t max_hit, LookupPass* pass) {
  const std::int64_t window = s.layouts[g].window_blocks;
  std::int64_t need = s.load_window(g, max_hit);
  ScanResult res;
  std::int64_t run = 0;
  for (std::int64_t i = end - 1; i >= start; --i) {
    const Probe found = s.probe(r, g, i, pass);
    if (found.result == LookupResult::hit) {
      if (found.valid_from > 0) {
        const bool front = run + 1 == need || i == start;
        if (!front || found.valid_from > s.first_needed_sub_block(g, i, run + 1, nct, max_hit)) {
          ++s.stats.partial_misses;
          run = 0;  // a miss: the run restarts below it, on a block boundary
          need = window;
          continue;
        }
      }
      if (++run == need) {
        res.count = (i - start) + need;
        return res;
      }
    } else {
      if (found.result == LookupResult::pending) res.deferred = true;
      run = 0;
      need = window;
    }
  }
  res.count = run;  // the run that reaches the front (0 if the first key missed)
  return res;
}

}  // namespace

std::int64_t Scheduler::Impl::first_needed_sub_block(std::size_t g, std::int64_t i,
                                                     std::int64_t run, std::int64_t nct,
                                                     std::int64_t max_hit) const noexcept {
  const GroupLayout& layout = layouts[g];
  const std::int64_t end = std::min(layout.offloaded_block_size * (i + run), max_hit);
  // The tokens the engine reads at `end`: a sliding window's last `sliding_window`, mamba's
  // last state only; none below what it computed itself.
  const std::int64_t back =
      layout.kind == GroupKind::sliding_window ? config.groups[g].sliding_window - 1 : 1;
  const std::int64_t need_from = std::max({nct, end - back, std::int64_t{0}});
  return std::max<std::int64_t>(0, need_from / layout.gpu_block_size - i * f);
}

std::int64_t Scheduler::Impl::load_window(std::size_t g, std::int64_t end) const noexcept {
  const GroupLayout& layout = layouts[g];
  if (layout.kind != GroupKind::sliding_window) return layout.window_blocks;
  // The window read at `end` starts at token end - (sliding_window - 1); counted from the
  // block boundary at or above `end`, it spans cdiv(sliding_window - 1 + short_by, obs) blocks.
  const std::int64_t obs = layout.offloaded_block_size;
  const std::int64_t short_by = (obs - end % obs) % obs;
  return std::max(layout.window_blocks, cdiv(config.groups[g].sliding_window - 1 + short_by, obs));
}

Probe Scheduler::Impl::probe(const RequestState& r, std::size_t g, std::int64_t i,
                             LookupPass* pass) {
  const Key k = key(r, g, i);
  Probe host;
  host.result = manager.lookup(k, host.valid_from);
  if (pass == nullptr) return host;
  return tiers->probe(r, k, g, i, host, *pass);
}

bool Scheduler::Impl::scan(RequestState& r, std::int64_t nct, std::int64_t& hit_out,
                           LookupPass* pass) {
  // vLLM 0.33's order: the load limit, then one token less for windowed models, then (per
  // group, with a limit) down to the group's offloaded block.
  const bool limited = r.load_limit >= 0;
  std::int64_t max_hit = (limited ? std::min(r.num_tokens, nct + r.load_limit) : r.num_tokens) -
                         (any_windowed ? 1 : 0);
  std::int64_t hit = 0;
  bool defer = false;
  hit_out = 0;

  // The groups are swept again when a later group shrank the hit: all of them, or only the
  // windowed ones.
  enum class Sweep { none, windowed, all };
  Sweep queued = Sweep::all;
  while (queued != Sweep::none) {
    const Sweep sweep = queued;
    queued = Sweep::none;
    bool windowed_seen = false;
    for (const std::size_t g : lookup_order) {
      const GroupLayout& layout = layouts[g];
      if (sweep == Sweep::windowed && !layout.windowed()) continue;
      const std::int64_t obs = layout.offloaded_block_size;
      const std::int64_t nk = num_keys(r, g);
      max_hit = std::min(max_hit, nk * obs);
      // A mamba block holds the state at its last token: a hit ending inside one would load
      // the state of tokens the engine has not computed (vLLM 0.33's mamba alignment).
      if (limited || layout.kind == GroupKind::mamba) max_hit = max_hit / obs * obs;
      if (max_hit - nct < obs) return true;
      const std::int64_t start = nct / obs;
      const std::int64_t end = std::min(cdiv(max_hit, obs), nk);
      const ScanResult res = layout.windowed()
                                 ? suffix_scan(*this, r, g, start, end, nct, max_hit, pass)
                                 : prefix_scan(*this, r, g, start, end, pass);
      if (res.deferred) {
        defer = true;
      } else {
        if (res.count == 0) return true;
        max_hit = std::min(max_hit, obs * (start + res.count));
      }
      const std::int64_t new_hit = max_hit - nct;
      if (new_hit < obs) return true;
      if (new_hit < hit) {
        // A later group shrank the hit: earlier answers may have changed.
        if (defer) {
          defer = false;
          queued = Sweep::all;
        } else if (windowed_seen && queued == Sweep::none) {
          queued = Sweep::windowed;
        }
      }
      hit = new_hit;
      if (layout.windowed()) windowed_seen = true;
    }
  }
  if (defer) return false;

  if (config.prefix_caching && !being_loaded.empty()) {
    for (std::size_t g = 0; g < layouts.size(); ++g) {
      const auto [first, stop] = used_blocks(g, nct, hit);
      for (std::int64_t i = first; i < stop; ++i) {
        if (being_loaded.contains(key(r, g, i))) return false;
      }
    }
  }
  hit_out = hit;
  return true;
}

std::optional<std::int64_t> Scheduler::Impl::lookup(RequestState& r,
                                                    std::int64_t num_computed_tokens) {
  const bool is_new = !r.looked_up;
  if (is_new) {
    r.looked_up = true;
  } else {
    for (GroupState& g : r.groups) {
      g.block_ids.clear();
      g.block_gens.clear();
    }
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
  const auto defer = [&]() -> std::optional<std::int64_t> {
    ++stats.deferrals;
    return std::nullopt;
  };

  // A request looked up again while stores of it still run (preempted, its stores flushed
  // but not yet reported): a load now would be refused by on_allocated, inside the engine's
  // step. Retry later, as vLLM's own connector does (issue 54).
  if (!r.jobs.empty()) return defer();

  std::int64_t hit = 0;
  if (!tiers) return scan(r, nct, hit, nullptr) ? finish(hit) : defer();

  // With tiers, keys found only in a tier count as hits; the keys the answer uses are then
  // promoted and the lookup retried later. After a promotion found no host room, one lookup
  // of the request answers from the host cache alone.
  if (tiers->any_shared()) tiers->poll_presence();
  const bool skip_tiers = r.skip_tiers;
  r.skip_tiers = false;
  // Twice at most: again if a shared tier's check could not start (its keys are then misses).
  for (int attempt = 0;; ++attempt) {
    LookupPass& pass = tiers->begin_pass(!skip_tiers, is_new && attempt == 0);
    const bool answered = scan(r, nct, hit, &pass);
    if (!pass.shared_unknown.empty()) {
      // Keys nobody knows about: ask the shared tiers, answer later (never wait here).
      if (!pass.catch_up_writes.empty()) tiers->queue_writes(pass.catch_up_writes);
      tiers->check_presence(r, pass);
      if (r.shared_check == RequestState::SharedCheck::in_flight || attempt > 0) return defer();
      continue;
    }
    const bool promote =
        answered && hit > 0 && !pass.tier_found.empty() && tiers->plan_promotion(r, nct, hit, pass);
    // After the plan: its slots are reserved, so these writes cannot evict them from the tier.
    if (!pass.catch_up_writes.empty()) tiers->queue_writes(pass.catch_up_writes);
    if (!answered || promote) return defer();
    break;
  }
  return finish(hit);
}

}  // namespace kvoffload
