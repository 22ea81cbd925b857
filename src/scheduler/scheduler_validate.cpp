// SEMANTICS 8b: every check on caller input, made before anything changes, so a rejected call
// leaves the scheduler exactly as it was.

#include <algorithm>
#include <limits>

#include "common/block_math.hpp"
#include "common/expects.hpp"
#include "kvoffload/tiers/shared_keys.hpp"
#include "scheduler/scheduler_impl.hpp"

namespace kvoffload {
RequestState& Scheduler::Impl::find_record(std::string_view id, std::string_view op) {
  RequestState* r = requests.find(id);
  KVOFFLOAD_EXPECTS(r != nullptr, "{}: unknown request \"{}\"", op, id);
  return *r;
}

RequestState& Scheduler::Impl::find_looked_up(std::string_view id, std::string_view op) {
  RequestState& r = find_record(id, op);
  KVOFFLOAD_EXPECTS(r.looked_up, "{}: request \"{}\" was never looked up", op, id);
  KVOFFLOAD_EXPECTS(!r.finished, "{}: request \"{}\" is finished", op, id);
  return r;
}

void Scheduler::Impl::validate_hashes(const RequestState& r,
                                      std::span<const BlockHash> hashes) const {
  KVOFFLOAD_EXPECTS(!r.finished, "request \"{}\" is finished and cannot be updated", r.id);
  KVOFFLOAD_EXPECTS(hashes.size() >= r.hashes.size(),
                    "request \"{}\": {} block hashes do not extend the {} already given", r.id,
                    hashes.size(), r.hashes.size());
  for (std::size_t i = 0; i < r.hashes.size(); ++i) {
    KVOFFLOAD_EXPECTS(hashes[i] == r.hashes[i],
                      "request \"{}\": block hash {} changed from {} to {}: the list must "
                      "extend the previous one",
                      r.id, i, r.hashes[i].to_hex(), hashes[i].to_hex());
  }
  check_new_hashes(r.id, hashes.subspan(r.hashes.size()), r.hashes.size());
}

void Scheduler::Impl::check_new_hashes(std::string_view id, std::span<const BlockHash> hashes,
                                       std::size_t first) const {
  for (std::size_t i = 0; i < hashes.size(); ++i) {
    KVOFFLOAD_EXPECTS(hashes[i].size() >= 1, "request \"{}\": block hash {} is empty", id,
                      first + i);
    KVOFFLOAD_EXPECTS(hashes[i].size() >= min_hash_bytes,
                      "request \"{}\": block hash {} is {} bytes; with a shared tier they must "
                      "be at least {} (a shorter one can be collided by another writer)",
                      id, first + i, hashes[i].size(), min_hash_bytes);
  }
}

void Scheduler::Impl::validate_allocated(RequestState& r, std::span<const AllocatedGroup> groups,
                                         std::int64_t num_external_tokens) {
  const std::size_t G = layouts.size();
  KVOFFLOAD_EXPECTS(groups.size() == G, "alloc: request \"{}\": {} groups given, the model has {}",
                    r.id, groups.size(), G);
  KVOFFLOAD_EXPECTS(num_external_tokens >= 0,
                    "alloc: request \"{}\": num_external_tokens is negative ({})", r.id,
                    num_external_tokens);
  if (num_external_tokens == 0) return;
  KVOFFLOAD_EXPECTS(r.jobs.empty(),
                    "alloc: request \"{}\" has {} job(s) in flight and cannot load now", r.id,
                    r.jobs.size());
  const std::int64_t cached = r.num_local_tokens + num_external_tokens;
  for (std::size_t g = 0; g < G; ++g) {
    const GroupLayout& layout = layouts[g];
    const AllocatedGroup& group = groups[g];
    const auto [n_gpu, local, pending, n_off] = detail::allocated_counts(
        cached, layout.gpu_block_size, layout.offloaded_block_size, group.num_computed_blocks);
    KVOFFLOAD_EXPECTS(local >= 0 && local <= n_gpu,
                      "alloc: request \"{}\" group {}: num_computed_blocks {} is outside 0..{}",
                      r.id, g, local, n_gpu);
    KVOFFLOAD_EXPECTS(static_cast<std::int64_t>(group.block_ids.size()) >= n_gpu,
                      "alloc: request \"{}\" group {}: {} block ids, {} tokens need {}", r.id, g,
                      group.block_ids.size(), cached, n_gpu);
    if (layout.windowed()) {
      const std::int64_t allowed = load_window(g, cached) * f;
      KVOFFLOAD_EXPECTS(pending <= allowed,
                        "alloc: request \"{}\" group {}: {} blocks to load, the window allows {}",
                        r.id, g, pending, allowed);
    }
    if (pending <= 0) continue;
    // A mamba block holds the state at its last token: a load ending inside one would give the
    // request the state of tokens it has not computed (the lookup never answers so).
    KVOFFLOAD_EXPECTS(layout.kind != GroupKind::mamba || cached % layout.offloaded_block_size == 0,
                      "alloc: request \"{}\" group {}: a mamba load must end at a block's end; "
                      "{} tokens end inside offloaded block {} ({} tokens each)",
                      r.id, g, cached, cached / layout.offloaded_block_size,
                      layout.offloaded_block_size);
    KVOFFLOAD_EXPECTS(n_off <= num_keys(r, g),
                      "alloc: request \"{}\" group {}: {} tokens need {} offloaded blocks, the "
                      "request has keys for {}",
                      r.id, g, cached, n_off, num_keys(r, g));
    // A mamba load copies only the written sub-blocks of its one block (the engine reads the
    // last state alone): it starts at the block's valid_from if the engine asked for more.
    const std::int64_t from = layout.kind == GroupKind::mamba
                                  ? mamba_load_from(r, g, local, n_off, n_gpu, group.block_ids)
                                  : local;
    for (std::int64_t i = from; i < n_gpu; ++i) {
      const GpuBlockId id = group.block_ids[static_cast<std::size_t>(i)];
      KVOFFLOAD_EXPECTS(id > 0, "alloc: request \"{}\" group {}: block {} to load is {}", r.id, g,
                        i, id == null_block ? "the null block" : "negative");
    }
    for (std::int64_t i = from / f; i < n_off; ++i) {
      const Key k = key(r, g, i);
      std::uint16_t valid_from = 0;
      const LookupResult found = manager.peek(k, valid_from);
      KVOFFLOAD_EXPECTS(found == LookupResult::hit,
                        "alloc: request \"{}\" group {}: key {} (offloaded block {}) is {}, not "
                        "ready to load",
                        r.id, g, to_string(k), i,
                        found == LookupResult::miss ? "not in the host cache" : "being stored");
      // SEMANTICS 6.8: a load never reads a sub-block that no store wrote.
      const std::int64_t first_read = std::max<std::int64_t>(0, from - i * f);
      KVOFFLOAD_EXPECTS(first_read >= valid_from,
                        "alloc: request \"{}\" group {}: key {} (offloaded block {}) was stored "
                        "from sub-block {} on; loading from sub-block {} would read sub-blocks "
                        "nobody wrote",
                        r.id, g, to_string(k), i, valid_from, first_read);
    }
  }
}

void Scheduler::Impl::validate_step(std::span<const ScheduledRequest> scheduled, StepPlan& plan) {
  // The step's preempted ids need no check: vLLM reports preemptions a step late
  // (reset_prefix_cache with reset_running_requests preempts between steps), when the request
  // may be finished and forgotten (build_step ignores unknown ids) or looked up again with a
  // load planned (build_step flushes only its stores).
  const std::size_t G = layouts.size();
  plan.clear(G);
  // A request scheduled twice in one step would be validated against a state its first entry
  // changes: each request is stamped with the step being validated.
  ++step_stamp;
  // A decode step reads a few cache lines per entry, each a likely miss with thousands of
  // requests (the id's index slot, the request): a pipeline starts loading them
  // kAhead entries apart, so the misses overlap instead of adding up (issue 30: cost per
  // request flat in the number of requests). Prefetches only: the checks run in order.
  constexpr std::size_t kAhead = 16;
  const std::size_t n = scheduled.size();
  plan.id_hashes.resize(n);
  for (std::size_t i = 0; i < n + 2 * kAhead; ++i) {
    if (i < n) {
      const ScheduledRequest& e = scheduled[i];
      const std::uint64_t h = RequestTable<RequestState>::hash(e.request_id);
      plan.id_hashes[i] = h;
      requests.prefetch_slot(h);
      __builtin_prefetch(e.new_block_ids.data());
    }
    if (i >= kAhead && i - kAhead < n) {
      if (const RequestState* r = requests.hint(plan.id_hashes[i - kAhead])) {
        const char* p = reinterpret_cast<const char*>(r);
        __builtin_prefetch(p);
        __builtin_prefetch(p + 79);  // up to the idle window's end (bytes 0 to 80)
      }
    }
    if (i >= 2 * kAhead) {
      const std::size_t k = i - 2 * kAhead;
      validate_entry(scheduled[k], plan.id_hashes[k], plan);
    }
  }
}

void Scheduler::Impl::validate_entry(const ScheduledRequest& e, std::uint64_t h, StepPlan& plan) {
  const std::size_t G = layouts.size();
  RequestState* found = requests.find_hashed(e.request_id, h);
  KVOFFLOAD_EXPECTS(found != nullptr, "step: unknown request \"{}\"", e.request_id);
  RequestState& r = *found;
  KVOFFLOAD_EXPECTS(r.looked_up, "step: request \"{}\" was never looked up", r.id);
  KVOFFLOAD_EXPECTS(!r.finished, "step: request \"{}\" is finished", r.id);
  KVOFFLOAD_EXPECTS(r.step_stamp != step_stamp, "step: request \"{}\" is scheduled twice", r.id);
  r.step_stamp = step_stamp;
  plan.requests.push_back(&r);
  KVOFFLOAD_EXPECTS(e.num_computed_tokens >= 0 && e.num_scheduled_tokens >= 0,
                    "step: request \"{}\": negative num_computed_tokens ({}) or "
                    "num_scheduled_tokens ({})",
                    r.id, e.num_computed_tokens, e.num_scheduled_tokens);
  KVOFFLOAD_EXPECTS(e.new_block_ids.size() == G,
                    "step: request \"{}\": new_block_ids has {} groups, the model has {}", r.id,
                    e.new_block_ids.size(), G);
  const std::int64_t offloadable =
      std::min({e.num_computed_tokens + e.num_scheduled_tokens, r.num_tokens, r.store_limit});
  // Most decode entries: no new block and no offloaded block newly complete in any group
  // (the request's idle window), found without reading its groups.
  if (!e.resumed && r.idle_lo <= offloadable && offloadable < r.idle_hi &&
      std::all_of(e.new_block_ids.begin(), e.new_block_ids.end(),
                  [](const std::vector<GpuBlockId>& v) { return v.empty(); })) {
#ifndef NDEBUG
    for (std::size_t g = 0; g < G; ++g) {
      if (offloadable / layouts[g].offloaded_block_size != r.groups[g].next_stored) {
        throw std::logic_error("scheduler: request \"" + r.id + "\": stale idle window");
      }
    }
#endif
    plan.blocks.insert(plan.blocks.end(), G, -1);  // build_store skips idle entries
    plan.idle.push_back(1);
    return;
  }
  bool idle = !e.resumed;  // no new block, nothing newly offloadable: build_store is a no-op
  for (std::size_t g = 0; g < G; ++g) {
    const std::vector<GpuBlockId>& fresh = e.new_block_ids[g];
    if (!fresh.empty()) {
      const GpuBlockId lowest = *std::min_element(fresh.begin(), fresh.end());
      KVOFFLOAD_EXPECTS(lowest >= 0, "step: request \"{}\" group {}: negative block id {}", r.id, g,
                        lowest);
    }
    const std::vector<GpuBlockId>& old = r.groups[g].block_ids;
    const std::size_t base = e.resumed ? 0 : old.size();
    // Offloaded blocks complete after this step; build_store reuses it (divisions are a
    // large part of a decode step's cost).
    const std::int64_t n = offloadable / layouts[g].offloaded_block_size;
    plan.blocks.push_back(n);
    const std::int64_t s = r.groups[g].next_stored;
    idle = idle && fresh.empty() && n == s;
    if (n <= s) continue;
    KVOFFLOAD_EXPECTS(num_keys(r, g) >= n,
                      "step: request \"{}\" group {}: {} offloaded blocks are computed but "
                      "only {} have block hashes",
                      r.id, g, n, num_keys(r, g));
    KVOFFLOAD_EXPECTS(static_cast<std::int64_t>(base + fresh.size()) >= n * f,
                      "step: request \"{}\" group {}: {} GPU blocks, {} offloaded blocks need {}",
                      r.id, g, base + fresh.size(), n, n * f);
    // Nulls may stand anywhere in the range (vLLM's align-mode mamba tables, window blocks
    // freed while the request runs): build_store stores what was written (SEMANTICS 6.3).
  }
  plan.idle.push_back(idle ? 1 : 0);
}

void Scheduler::Impl::validate_reports(std::span<const JobReport> reports) {
  report_sums.clear();
  for (const JobReport& report : reports) {
    std::int64_t remaining = 0;
    if (report.job < stale_below && report.job >= 0) {
      // Issued before reset_cache(): a transfer's is ignored; an orphan tier job's counts.
      remaining = tiers ? tiers->orphan_remaining(report.job) : -1;
      if (remaining < 0) continue;
    } else if (auto it = jobs.find(report.job); it != jobs.end()) {
      remaining = it->second.remaining;
    } else {
      KVOFFLOAD_EXPECTS(false, "complete: unknown job {}", report.job);
    }
    KVOFFLOAD_EXPECTS(report.count > 0, "complete: job {}: count must be positive, got {}",
                      report.job, report.count);
    auto [sum, inserted] = report_sums.insert(report.job, 0);
    *sum += report.count;
    KVOFFLOAD_EXPECTS(*sum <= remaining,
                      "complete: job {}: {} reports, but only {} of {} workers have not reported",
                      report.job, *sum, remaining, config.num_workers);
  }
}

Scheduler::IdleWindow Scheduler::idle_window(std::string_view request_id) const {
  const Impl& s = *impl_;
  const RequestState* r = s.requests.find(request_id);
  if (r == nullptr || r->finished) return {};
  // validate_step's idle test: for every group, floor(min(x, n) / obs) equals
  // next_stored, i.e. L <= min(x, num_tokens) < H with L the largest start and H the smallest
  // end of the groups' current offloaded blocks (n: num_tokens, or the store limit if lower):
  // the request's idle window (Impl::refresh_idle).
  const std::int64_t lo = r->idle_lo;
  const std::int64_t hi = r->idle_hi;
  const std::int64_t n = std::min(r->num_tokens, r->store_limit);
  if (n < lo || lo >= hi) return {};  // min(x, n) <= n < lo: never idle
  if (n < hi) return {lo, std::numeric_limits<std::int64_t>::max()};  // min(x, n) < hi always
  return {lo, hi};
}

}  // namespace kvoffload
