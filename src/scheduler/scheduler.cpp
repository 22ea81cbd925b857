// SEMANTICS 3, 5-8: requests, load planning, store jobs with exact block counting,
// completion, finish and reset. Lookup is in scheduler_lookup.cpp, input checks in
// scheduler_validate.cpp.

#include "kvoffload/scheduler.hpp"

#include <algorithm>
#include <cmath>

#include "common/block_math.hpp"
#include "common/expects.hpp"
#include "common/logging.hpp"
#include "kvoffload/detail/single_thread_guard.hpp"
#include "kvoffload/tiers/shared_keys.hpp"
#include "scheduler/scheduler_impl.hpp"

namespace kvoffload {

// Debug builds check the single-threaded contract at every mutating call.
#ifndef NDEBUG
#define KVOFFLOAD_ONE_THREAD(impl, what) \
  const detail::SingleThreadGuard::Scope one_thread_scope_((impl).one_thread, what)
#else
#define KVOFFLOAD_ONE_THREAD(impl, what) (void)0
#endif

Scheduler::Impl::Impl(const SchedulerConfig& cfg, SchedulerServices services)
    : config(cfg),
      layouts(derive_layouts(cfg)),
      f(cfg.block_size_factor),
      manager(cfg.manager),
      epoch(weights_epoch(cfg.weights)) {
  policy_context = cfg.manager.policy == EvictionPolicyKind::reuse;
  tier_policy_time = std::any_of(cfg.tiers.begin(), cfg.tiers.end(), [](const TierConfig& t) {
    return t.policy == EvictionPolicyKind::reuse;
  });
  for (std::size_t g = 0; g < layouts.size(); ++g) {
    if (!layouts[g].windowed()) lookup_order.push_back(g);
  }
  std::vector<std::size_t> windowed;
  for (std::size_t g = 0; g < layouts.size(); ++g) {
    if (layouts[g].windowed()) windowed.push_back(g);
  }
  std::stable_sort(windowed.begin(), windowed.end(), [this](std::size_t a, std::size_t b) {
    return layouts[a].window_blocks > layouts[b].window_blocks;
  });
  any_windowed = !windowed.empty();
  // A shared tier keys blocks by hash across a fleet: a short hash lets whoever writes to it
  // look for a colliding prompt.
  for (const TierConfig& t : cfg.tiers) {
    if (t.medium == Medium::shared) min_hash_bytes = shared_hash_min_bytes;
  }
  // Up to 16 M blocks up front (128 MiB); a larger cache grows the table as ids appear.
  fence.reserve(static_cast<std::size_t>(std::min<std::int64_t>(cfg.gpu_blocks, 1 << 24)));
  store_scratch.first_candidate.resize(layouts.size());
  if (!cfg.tiers.empty()) {
    tiers = std::make_unique<TierCoordinator>(*this, cfg, std::move(services));
  } else {
    KVOFFLOAD_EXPECTS(services.presence.empty(), "services.presence: {} entries for 0 tier(s)",
                      services.presence.size());
  }
  lookup_order.insert(lookup_order.end(), windowed.begin(), windowed.end());
}

void Scheduler::Impl::check([[maybe_unused]] const TransferJob& job) const {
#ifndef NDEBUG
  check_job_invariants(job, static_cast<std::int64_t>(layouts.size()), f);
#endif
}

void Scheduler::Impl::touch(const RequestState& r) {
  // One call with the groups from last to first: the policy walks it from the back, so this
  // equals touching group 0, then group 1, ... (what vLLM does, one call per group), and
  // leaves the last group's first key the most recent of the request.
  touch_keys.clear();
  for (std::size_t g = layouts.size(); g-- > 0;) {
    const std::int64_t nk = num_keys(r, g);
    const std::int64_t skip = touch_skip(r, g);
    for (std::int64_t i = skip; i < nk; ++i) touch_keys.push_back(key(r, g, i));
  }
  const PolicyScope scope(*this, r);
  manager.touch(touch_keys);
}

void Scheduler::Impl::touch_stored(RequestState& r, StoreScratch& scratch) {
  std::vector<HostBlockId>& touch_ids = scratch.touch_ids;
  const std::vector<HostBlockId>& candidate_blocks = scratch.prepared.key_blocks;
  touch_ids.clear();
  for (std::size_t g = layouts.size(); g-- > 0;) {
    const std::int64_t nk = num_keys(r, g);
    const std::int64_t skip = touch_skip(r, g);
    // The group's candidates, by increasing block index: their blocks are known already.
    std::size_t c = scratch.first_candidate[g];
    const std::size_t c_end = scratch.first_candidate[g + 1];
    std::vector<HostBlockId>& known = r.groups[g].known_blocks;
    if (static_cast<std::int64_t>(known.size()) < nk)
      known.resize(static_cast<std::size_t>(nk), -1);
    for (std::int64_t i = skip; i < nk; ++i) {
      HostBlockId& block = known[static_cast<std::size_t>(i)];
      while (c < c_end && scratch.candidate_block[c] < i) ++c;
      if (c < c_end && scratch.candidate_block[c] == i) {
        block = candidate_blocks[c];
      } else {
        const Key k = key(r, g, i);
        const Key* held = block >= 0 ? manager.key_of(block) : nullptr;
        if (held == nullptr || !(*held == k)) block = manager.block_of(k);
      }
      touch_ids.push_back(block);
    }
  }
  manager.touch_blocks(touch_ids);
}

void Scheduler::Impl::on_allocated(RequestState& r, std::span<const AllocatedGroup> groups,
                                   std::int64_t num_external_tokens) {
  // The blocks past the computed ones are new allocations (the load's destination and the
  // tokens to compute), possibly blocks another request held a moment ago: a pending store of
  // that request must no longer read them (SEMANTICS 6.9). A request waiting for its load is
  // not in a step's entries until the load is done, so this is where its blocks are seen.
  // A store still reading one of them (a window block freed by its request, a finished
  // request's block) must finish before the new owner writes it: the load, or the forward pass
  // of this step (SEMANTICS 6.7).
  for (const AllocatedGroup& group : groups) {
    const auto first = static_cast<std::size_t>(std::clamp<std::int64_t>(
        group.num_computed_blocks, 0, static_cast<std::int64_t>(group.block_ids.size())));
    const std::span<const GpuBlockId> fresh = std::span(group.block_ids).subspan(first);
    for (const GpuBlockId id : fresh) bump_generation(id);
    fence.collect(fresh, flush);
  }
  if (num_external_tokens == 0) return;
  const std::int64_t cached = r.num_local_tokens + num_external_tokens;
  TransferJob job;
  job.id = next_job;
  job.kind = JobKind::load;
  job.request_id = r.id;
  job.gpu.group_sizes.assign(layouts.size(), 0);
  job.gpu.block_indices.assign(layouts.size(), 0);
  for (std::size_t g = 0; g < layouts.size(); ++g) {
    const GroupLayout& layout = layouts[g];
    const auto [n_gpu, local, pending, n_off] = detail::allocated_counts(
        cached, layout.gpu_block_size, layout.offloaded_block_size, groups[g].num_computed_blocks);
    if (pending > 0) {
      // A mamba load copies only what its block's store wrote (SEMANTICS 5).
      const std::int64_t from =
          layout.kind == GroupKind::mamba
              ? mamba_load_from(r, g, local, n_off, n_gpu, groups[g].block_ids)
              : local;
      for (std::int64_t i = from / f; i < n_off; ++i) job.keys.push_back(key(r, g, i));
      const auto& ids = groups[g].block_ids;
      job.gpu.block_ids.insert(job.gpu.block_ids.end(), ids.begin() + from, ids.begin() + n_gpu);
      job.gpu.group_sizes[g] = n_gpu - from;
      job.gpu.block_indices[g] = from;
    }
    if (!r.remote_decode) r.groups[g].next_stored = n_off;
  }
  refresh_idle(r);
  if (job.keys.empty()) return;  // every group had its blocks locally: nothing to load

  ++next_job;
  manager.prepare_load(job.keys, job.host_block_ids);
  fence.collect(job.gpu.block_ids, flush);
  if (config.prefix_caching) {
    for (const Key& k : job.keys) ++*being_loaded.insert(k, 0).first;
  }
  check(job);
  JobState& state = add_job(job.id, JobKind::load, r);
  state.keys = job.keys;
  r.jobs.push_back(job.id);
  r.load_in_flight = true;
  ++stats.load_jobs;
  pending_loads.push_back(std::move(job));
}

void Scheduler::Impl::append_new_blocks(RequestState& r, const ScheduledRequest& e) {
  for (std::size_t g = 0; g < layouts.size(); ++g) {
    GroupState& state = r.groups[g];
    if (e.resumed) {
      state.block_ids.clear();
      state.block_gens.clear();
    }
    const std::vector<GpuBlockId>& fresh = e.new_block_ids[g];
    if (!fresh.empty()) {  // most decode steps bring none
      state.block_ids.insert(state.block_ids.end(), fresh.begin(), fresh.end());
      // Only window and mamba blocks are freed while their request runs (collect_candidates).
      if (layouts[g].windowed()) {
        for (const GpuBlockId id : fresh) state.block_gens.push_back(generation(id));
      }
      // A new block still read by a store flushes it (SEMANTICS 6.7), including a store built
      // earlier in this step: with prefix caching requests share GPU blocks.
      fence.collect(fresh, flush);
    }
  }
}

void Scheduler::Impl::bump_generations(std::span<const ScheduledRequest> scheduled,
                                       const StepPlan& plan) {
  for (std::size_t i = 0; i < scheduled.size(); ++i) {
    if (plan.idle[i] != 0) continue;  // an idle entry brings no new block (validate_entry)
    for (const std::vector<GpuBlockId>& fresh : scheduled[i].new_block_ids) {
      for (const GpuBlockId id : fresh) bump_generation(id);
    }
  }
}

bool Scheduler::Impl::collect_candidates(RequestState& r, std::span<const std::int64_t> blocks,
                                         StoreScratch& scratch) {
  // SEMANTICS 6.3: a block is a candidate when its last sub-block was written (else there is
  // nothing at its end: outside the window, or a mamba state never materialised there); it is
  // stored from the first sub-block of the written run that ends there. A hole inside a
  // full-attention block cannot be loaded as a prefix: skipped and counted. On the way, each
  // window or mamba sub-block handed out again since the request got it becomes null
  // (SEMANTICS 6.9; vLLM's table has a null there too): one pass over the range.
  scratch.candidates.clear();
  scratch.candidate_block.clear();
  scratch.candidate_from.clear();
  scratch.first_candidate.resize(layouts.size() + 1);
  const std::uint32_t* const gen = block_gen.data();
  const std::size_t num_gen = block_gen.size();
  for (std::size_t g = 0; g < layouts.size(); ++g) {
    scratch.first_candidate[g] = scratch.candidates.size();
    GroupState& state = r.groups[g];
    GpuBlockId* ids = state.block_ids.data();
    const std::uint32_t* gens = state.block_gens.data();  // windowed groups only
    const bool windowed = layouts[g].windowed();
    // SEMANTICS 6.10: a mamba block holds a state worth storing only up to the tokens the
    // engine finalised (its prefill); past them, decode and draft-advanced states.
    std::int64_t end = blocks[g];
    if (layouts[g].kind == GroupKind::mamba && r.state_limit != kNoLimit &&
        end * layouts[g].offloaded_block_size > r.state_limit) {
      const std::int64_t final_blocks = r.state_limit / layouts[g].offloaded_block_size;
      const std::int64_t from = std::max(state.next_stored, final_blocks);
      if (end > from) stats.unfinal_state_skips += static_cast<std::uint64_t>(end - from);
      end = std::max(state.next_stored, final_blocks);
    }
    for (std::int64_t i = state.next_stored; i < end; ++i) {
      GpuBlockId* sub = ids + i * f;
      const std::uint32_t* sub_gen = windowed ? gens + i * f : nullptr;
      std::int64_t j = f;  // where the written run ending at the last sub-block starts
      bool in_run = true;  // walking that run down from the last sub-block
      bool below = false;  // a written sub-block below the run (a hole)
      for (std::int64_t k = f - 1; k >= 0 && !below; --k) {
        GpuBlockId id = sub[k];
        // Only window and mamba blocks are freed while their request runs: an engine keeps a
        // running request's full-attention blocks (it reads them every step).
        if (windowed && id != null_block) {
          const auto at = static_cast<std::size_t>(id);
          if (sub_gen[k] != (at < num_gen ? gen[at] : 0)) {
            sub[k] = null_block;  // another owner's block now
            ++stats.reused_sub_blocks;
            id = null_block;
          }
        }
        if (id == null_block) {
          // Nothing at the block's end, or below a window or mamba run: nothing more matters.
          if (j == f || windowed) break;
          in_run = false;
        } else if (in_run) {
          j = k;
        } else {
          below = true;
        }
      }
      if (j == f) continue;  // the last sub-block is null: nothing at the block's end
      // Full attention: leading nulls only (stored from j, a miss for the prefix scan as
      // ever); a written sub-block before a null is a hole no load could ever serve.
      if (!windowed && below) {
        ++stats.unsafe_skips;
        continue;
      }
      scratch.candidates.push_back(key(r, g, i));
      scratch.candidate_block.push_back(i);
      scratch.candidate_from.push_back(static_cast<std::uint16_t>(j));
    }
  }
  scratch.first_candidate[layouts.size()] = scratch.candidates.size();
  return !scratch.candidates.empty();
}

void Scheduler::Impl::emit_store_job(RequestState& r, StoreScratch& scratch, std::size_t first,
                                     std::size_t last, StepResult& out) {
  const std::size_t G = layouts.size();
  TransferJob job;
  job.id = next_job++;
  job.kind = JobKind::store;
  job.request_id = r.id;
  job.gpu.group_sizes.assign(G, 0);
  job.gpu.block_indices.assign(G, 0);
  job.gpu.block_ids.reserve((last - first) * static_cast<std::size_t>(f));
  job.keys.assign(scratch.prepared.keys_to_store.begin() + static_cast<std::ptrdiff_t>(first),
                  scratch.prepared.keys_to_store.begin() + static_cast<std::ptrdiff_t>(last));
  job.host_block_ids.assign(scratch.prepared.block_ids.begin() + static_cast<std::ptrdiff_t>(first),
                            scratch.prepared.block_ids.begin() + static_cast<std::ptrdiff_t>(last));
  std::size_t g = 0;
  for (std::size_t k = first; k < last; ++k) {
    const std::size_t c = scratch.stored[k];
    while (c >= scratch.first_candidate[g + 1]) ++g;
    const std::int64_t i = scratch.candidate_block[c];
    const std::int64_t j = scratch.candidate_from[c];
    const GpuBlockId* sub = r.groups[g].block_ids.data() + i * f;
    job.gpu.block_ids.insert(job.gpu.block_ids.end(), sub + j, sub + f);
    if (job.gpu.group_sizes[g] == 0) job.gpu.block_indices[g] = i * f + j;
    job.gpu.group_sizes[g] += f - j;
    // SEMANTICS 6.8: its leading sub-blocks keep what the host block held before; the lookup
    // never serves them.
    if (j > 0) {
      manager.set_valid_from(job.host_block_ids[k - first], static_cast<std::uint16_t>(j));
      ++stats.partial_stores;
    }
  }
  JobState& state = add_job(job.id, JobKind::store, r);
  state.source_ids = job.gpu.block_ids;
  state.group_sizes = job.gpu.group_sizes;
  state.host_ids = job.host_block_ids;
  register_window_sources(state);
  r.jobs.push_back(job.id);
  ++stats.store_jobs;
  check(job);
  out.store_jobs.push_back(std::move(job));
}

void Scheduler::Impl::register_window_sources(JobState& state) {
  std::size_t at = 0;
  for (std::size_t g = 0; g < layouts.size(); ++g) {
    const auto size = static_cast<std::size_t>(state.group_sizes[g]);
    if (layouts[g].windowed())
      fence.add_all(std::span(state.source_ids).subspan(at, size), state.id);
    at += size;
  }
}

void Scheduler::Impl::build_store(RequestState& r, const ScheduledRequest& e,
                                  std::span<const std::int64_t> blocks, StepResult& out) {
  append_new_blocks(r, e);
  const auto advance = [&] {
    for (std::size_t g = 0; g < layouts.size(); ++g) r.groups[g].next_stored = blocks[g];
    refresh_idle(r);
  };
  StoreScratch& scratch = store_scratch;
  if (!collect_candidates(r, blocks, scratch)) return advance();
  if (store_pressure) {
    // The workers' stores are behind: these blocks are skipped for good (not retried), so the
    // backlog shrinks and no GPU block waits for a store (issue 30, back-pressure).
    for (const Key& k : scratch.candidates) {  // those a store would have written
      std::uint16_t valid_from = 0;
      if (manager.peek(k, valid_from) == LookupResult::miss) ++stats.pressure_skips;
    }
    return advance();
  }
  const PolicyScope scope(*this, r);
  if (!manager.prepare_store(scratch.candidates, scratch.prepared)) {
    if (no_room_warnings++ % 1000 == 0) {
      detail::logger().warn(
          "request \"{}\": no room in the host cache for {} block(s); will retry next step "
          "({} such skips so far)",
          r.id, scratch.candidates.size(), no_room_warnings);
    }
    return;  // next_stored stays: retried next step
  }
  if (scratch.prepared.keys_to_store.empty()) return advance();

  touch_stored(r, scratch);
  scratch.stored.clear();
  for (std::size_t c = 0; c < scratch.candidates.size(); ++c) {
    if (scratch.prepared.key_stored[c] != 0) scratch.stored.push_back(c);
  }
  KVOFFLOAD_ASSERT(scratch.stored.size() == scratch.prepared.keys_to_store.size(),
                   "request \"{}\": {} of {} keys to store placed", r.id, scratch.stored.size(),
                   scratch.prepared.keys_to_store.size());
  // A job's group may start inside its first host block only (SEMANTICS 6.6): a block stored
  // from a sub-block > 0 after another block of its group starts a new job.
  std::size_t first = 0;
  std::vector<std::uint8_t>& seen = scratch.group_seen;
  seen.assign(layouts.size(), 0);
  for (std::size_t k = 0; k < scratch.stored.size(); ++k) {
    const std::size_t c = scratch.stored[k];
    std::size_t g = 0;
    while (c >= scratch.first_candidate[g + 1]) ++g;
    if (scratch.candidate_from[c] > 0 && seen[g] != 0) {
      emit_store_job(r, scratch, first, k, out);
      first = k;
      seen.assign(layouts.size(), 0);
    }
    seen[g] = 1;
  }
  emit_store_job(r, scratch, first, scratch.stored.size(), out);
  advance();
}

void Scheduler::Impl::complete(JobState& job, std::vector<CompletedJob>& done) {
  RequestState& r = *job.request;
  if (job.kind == JobKind::store) {
    manager.complete_store_blocks(job.host_ids, job.ok);
    if (!job.ok) ++stats.failed_stores;
    if (job.ok && tiers) tiers->queue_writes(job.host_ids);  // write-through
    for_each_source(job, true, [&](GpuBlockId id) { fence.remove(id, job.id); });
    if (job.full_registered) {
      for_each_source(job, false, [&](GpuBlockId id) { fence.remove(id, job.id); });
    }
  } else {
    manager.complete_load(job.keys);
    if (config.prefix_caching) {
      for (const Key& k : job.keys) {
        std::int32_t* count = being_loaded.find(k);
        if (count != nullptr && --*count == 0) being_loaded.erase(k);
      }
    }
    if (!job.ok) ++stats.failed_loads;
    r.load_in_flight = false;
  }
  done.push_back(CompletedJob{job.id, job.kind, r.id, job.ok});
  r.jobs.erase(std::find(r.jobs.begin(), r.jobs.end(), job.id));
  retire_job(job.id);
  if (r.finished && r.jobs.empty()) forget(r);
}

JobState& Scheduler::Impl::add_tier_job(JobId id, JobKind kind, std::uint32_t tier) {
  JobState& state = new_job(id, kind);
  state.tier = tier;
  return state;
}

JobState& Scheduler::Impl::add_job(JobId id, JobKind kind, RequestState& r) {
  JobState& state = new_job(id, kind);
  state.request = &r;
  return state;
}

JobState& Scheduler::Impl::new_job(JobId id, JobKind kind) {
  JobState* state = nullptr;
  if (spare_jobs.empty()) {
    state = &jobs[id];
  } else {
    Jobs::node_type node = std::move(spare_jobs.back());
    spare_jobs.pop_back();
    node.key() = id;
    state = &jobs.insert(std::move(node)).position->second;
  }
  state->id = id;
  state->kind = kind;
  state->remaining = config.num_workers;
  return *state;
}

void Scheduler::Impl::retire_job(JobId id) {
  constexpr std::size_t kMaxSpare = 4096;
  Jobs::node_type node = jobs.extract(id);
  if (node.empty() || spare_jobs.size() >= kMaxSpare) return;
  node.mapped().recycle();
  spare_jobs.push_back(std::move(node));
}

void Scheduler::Impl::forget(RequestState& r) {
  requests.erase(r);
}

// ---- public API ----------------------------------------------------------------------------

Scheduler::Scheduler(const SchedulerConfig& config, SchedulerServices services)
    : impl_(std::make_unique<Impl>(config, std::move(services))) {}
Scheduler::~Scheduler() = default;
Scheduler::Scheduler(Scheduler&&) noexcept = default;
Scheduler& Scheduler::operator=(Scheduler&&) noexcept = default;

void Scheduler::update_request(std::string_view request_id, std::int64_t num_tokens,
                               std::span<const BlockHash> block_hashes, bool remote_decode) {
  KVOFFLOAD_ONE_THREAD(*impl_, "update_request");
  KVOFFLOAD_EXPECTS(!request_id.empty(), "request: the request id is empty");
  KVOFFLOAD_EXPECTS(num_tokens >= 0, "request \"{}\": num_tokens is negative ({})", request_id,
                    num_tokens);
  RequestState* found = impl_->requests.find(request_id);
  if (found == nullptr) {
    impl_->check_new_hashes(request_id, block_hashes, 0);
    auto r = std::make_unique<RequestState>();
    r->id = std::string(request_id);
    r->serial = impl_->next_serial++;
    r->groups.resize(impl_->layouts.size());
    impl_->refresh_idle(*r);
    found = &impl_->requests.add(std::move(r));
  } else {
    impl_->validate_hashes(*found, block_hashes);
  }
  RequestState& r = *found;
  r.num_tokens = num_tokens;
  r.remote_decode = remote_decode;
  r.hashes.insert(r.hashes.end(),
                  block_hashes.begin() + static_cast<std::ptrdiff_t>(r.hashes.size()),
                  block_hashes.end());
}

void Scheduler::extend_request(std::string_view request_id, std::int64_t num_tokens,
                               std::span<const BlockHash> new_hashes) {
  KVOFFLOAD_ONE_THREAD(*impl_, "extend_request");
  RequestState& r = impl_->find_record(request_id, "request");
  KVOFFLOAD_EXPECTS(!r.finished, "request \"{}\" is finished and cannot be updated", r.id);
  KVOFFLOAD_EXPECTS(num_tokens >= 0, "request \"{}\": num_tokens is negative ({})", request_id,
                    num_tokens);
  impl_->check_new_hashes(request_id, new_hashes, r.hashes.size());
  r.num_tokens = num_tokens;
  r.hashes.insert(r.hashes.end(), new_hashes.begin(), new_hashes.end());
}

void Scheduler::limit_stores(std::string_view request_id, std::int64_t max_tokens) {
  KVOFFLOAD_ONE_THREAD(*impl_, "limit_stores");
  RequestState& r = impl_->find_record(request_id, "request");
  KVOFFLOAD_EXPECTS(max_tokens >= 0, "request \"{}\": limit_stores({}) is negative", r.id,
                    max_tokens);
  r.store_limit = max_tokens;
}

void Scheduler::limit_state_stores(std::string_view request_id, std::int64_t final_tokens) {
  KVOFFLOAD_ONE_THREAD(*impl_, "limit_state_stores");
  RequestState& r = impl_->find_record(request_id, "request");
  KVOFFLOAD_EXPECTS(final_tokens >= 0, "request \"{}\": limit_state_stores({}) is negative", r.id,
                    final_tokens);
  r.state_limit = final_tokens;
}

void Scheduler::limit_loads(std::string_view request_id, std::int64_t max_tokens) {
  KVOFFLOAD_ONE_THREAD(*impl_, "limit_loads");
  RequestState& r = impl_->find_record(request_id, "request");
  r.load_limit = max_tokens < 0 ? -1 : max_tokens;
}

void Scheduler::hint_continues(std::string_view request_id, bool continues) {
  KVOFFLOAD_ONE_THREAD(*impl_, "hint_continues");
  RequestState& r = impl_->find_record(request_id, "hint_continues");
  r.continues = continues ? 1 : 0;
}

void Scheduler::set_time(double seconds) {
  KVOFFLOAD_ONE_THREAD(*impl_, "set_time");
  KVOFFLOAD_EXPECTS(std::isfinite(seconds) && seconds >= 0,
                    "set_time: seconds must be finite and not negative, got {}", seconds);
  impl_->time_set = std::max(impl_->time_set, seconds);
}

std::optional<std::int64_t> Scheduler::lookup(std::string_view request_id,
                                              std::int64_t num_computed_tokens) {
  KVOFFLOAD_ONE_THREAD(*impl_, "lookup");
  RequestState& r = impl_->find_record(request_id, "lookup");
  KVOFFLOAD_EXPECTS(!r.finished, "lookup: request \"{}\" is finished", request_id);
  KVOFFLOAD_EXPECTS(num_computed_tokens >= 0,
                    "lookup: request \"{}\": num_computed_tokens is negative ({})", request_id,
                    num_computed_tokens);
  return impl_->lookup(r, num_computed_tokens);
}

void Scheduler::on_allocated(std::string_view request_id, std::span<const AllocatedGroup> groups,
                             std::int64_t num_external_tokens) {
  KVOFFLOAD_ONE_THREAD(*impl_, "on_allocated");
  RequestState& r = impl_->find_looked_up(request_id, "alloc");
  impl_->validate_allocated(r, groups, num_external_tokens);
  impl_->on_allocated(r, groups, num_external_tokens);
}

void Scheduler::handed_out(std::span<const GpuBlockId> block_ids) {
  KVOFFLOAD_ONE_THREAD(*impl_, "handed_out");
  for (const GpuBlockId id : block_ids) impl_->bump_generation(id);
  impl_->fence.collect(block_ids, impl_->flush);  // stores still reading them finish first
}

StepResult Scheduler::build_step(std::span<const ScheduledRequest> scheduled,
                                 std::span<const std::string> preempted) {
  KVOFFLOAD_ONE_THREAD(*impl_, "build_step");
  Impl& s = *impl_;
  StepPlan& plan = s.step_plan;
  s.validate_step(scheduled, plan);
  // Every block this step hands out starts a new generation before any store is built, so a
  // store of a request that held one of them before never reads it (SEMANTICS 6.9).
  s.bump_generations(scheduled, plan);
  StepResult out;
  for (const std::string& id : preempted) {
    const RequestState* r = s.requests.find(id);
    if (r == nullptr) continue;  // finished and forgotten since vLLM preempted it
    for (const JobId job : r->jobs) {
      // Its stores read blocks the engine frees; a load planned after the preemption (the
      // request looked up again before vLLM reported it) writes its new blocks: not flushed.
      if (s.jobs.at(job).kind == JobKind::store) s.flush.push_back(job);
    }
  }
  out.load_jobs.swap(s.pending_loads);
  if (s.tiers && s.tier_policy_time) s.tiers->set_policy_time(s.now());
  if (s.tiers) s.tiers->build_step(out);
  for (std::size_t i = 0; i < scheduled.size(); ++i) {
    if (plan.idle[i] != 0) continue;  // most requests of a decode step
    s.build_store(*plan.requests[i], scheduled[i], plan.blocks_of(i), out);
  }
  std::sort(s.flush.begin(), s.flush.end());
  s.flush.erase(std::unique(s.flush.begin(), s.flush.end()), s.flush.end());
  out.flush.swap(s.flush);
  return out;
}

std::vector<CompletedJob> Scheduler::on_completed(std::span<const JobReport> reports) {
  KVOFFLOAD_ONE_THREAD(*impl_, "on_completed");
  Impl& s = *impl_;
  s.validate_reports(reports);
  std::vector<CompletedJob> done;
  for (const JobReport& report : reports) {
    auto it = s.jobs.find(report.job);
    if (it == s.jobs.end()) {  // issued before reset_cache(): an orphan's, or forgotten
      if (s.tiers) s.tiers->orphan_reported(report);
      continue;
    }
    JobState& job = it->second;
    job.remaining -= report.count;
    job.ok = job.ok && report.ok;
    if (job.remaining > 0) continue;
    if (is_tier_job(job.kind)) {
      s.tiers->complete(job);
      s.retire_job(job.id);
    } else {
      s.complete(job, done);
    }
  }
  return done;
}

void Scheduler::on_finished(std::string_view request_id) {
  KVOFFLOAD_ONE_THREAD(*impl_, "on_finished");
  Impl& s = *impl_;
  RequestState* found = s.requests.find(request_id);
  if (found == nullptr || found->finished) return;
  RequestState& r = *found;
  r.finished = true;
  if (r.jobs.empty()) return s.forget(r);
  // The engine may free and reuse these blocks at once: a later allocation of them must
  // flush the stores still reading them.
  for (const JobId id : r.jobs) {
    JobState& job = s.jobs.at(id);
    if (job.kind != JobKind::store || job.full_registered) continue;
    s.for_each_source(job, false, [&](GpuBlockId block) { s.fence.add(block, id); });
    job.full_registered = true;
  }
}

void Scheduler::set_store_pressure(bool on) noexcept {
  impl_->store_pressure = on;
}

bool Scheduler::store_pressure() const noexcept {
  return impl_->store_pressure;
}

void Scheduler::reset_cache() {
  KVOFFLOAD_ONE_THREAD(*impl_, "reset_cache");
  // With tiers, dropping the index is not enough: their blocks outlive this process (a
  // restart scans the disk; other engines read the cluster), so only a new weights identity
  // keeps every tier from serving the old KV, also after a crash.
  KVOFFLOAD_EXPECTS(impl_->tiers == nullptr,
                    "reset_cache: this scheduler has tiers: give the new weights' identity, "
                    "reset_cache(weights) (C: kvoffload_scheduler_reset_weights), so that no tier "
                    "serves KV of the old weights, also after a crash or in another engine");
  impl_->reset(impl_->epoch);
}

void Scheduler::reset_cache(std::string_view weights) {
  KVOFFLOAD_ONE_THREAD(*impl_, "reset_cache");
  KVOFFLOAD_EXPECTS(!weights.empty(),
                    "reset_cache: weights is empty: give the new weights' identity (a checkpoint "
                    "digest, a training step); the empty one is the config's default");
  impl_->config.weights = std::string(weights);
  impl_->reset(weights_epoch(weights));
}

std::uint64_t Scheduler::epoch() const noexcept {
  return impl_->epoch;
}

void Scheduler::Impl::reset(std::uint64_t new_epoch) {
  Impl& s = *this;
  s.epoch = new_epoch;
  // Every transfer in flight is flushed by the next step. A tier job is not: a stalled disk
  // or a slow node would stall that step. It becomes an orphan instead, whose host blocks and
  // slots stay held (never handed out) until the workers report it.
  for (const auto& [id, job] : s.jobs) {
    if (!is_tier_job(job.kind)) {
      s.flush.push_back(id);
    } else {
      s.tiers->adopt_orphan(job);
    }
  }
  // The tiers are dropped too: reset_cache means the cached KV is no longer valid (new
  // weights, say), wherever it is.
  std::vector<HostBlockId> held;
  if (s.tiers) held = s.tiers->reset();
  if (!s.pending_loads.empty()) {
    detail::logger().warn("reset_cache: dropping {} planned load job(s) before they ran",
                          s.pending_loads.size());
  }
  s.pending_loads.clear();
  s.jobs.clear();
  s.manager.reset(held);
  s.being_loaded.clear();
  s.fence.clear();
  s.stale_below = s.next_job;
  std::vector<RequestState*> finished;
  s.requests.for_each([&](RequestState& r) {
    r.jobs.clear();
    r.load_in_flight = false;
    for (GroupState& g : r.groups) g.next_stored = 0;
    s.refresh_idle(r);
    if (r.finished) finished.push_back(&r);
  });
  for (RequestState* r : finished) s.requests.erase(*r);
}

std::vector<ManagerEvent> Scheduler::take_events() {
  KVOFFLOAD_ONE_THREAD(*impl_, "take_events");
  std::vector<ManagerEvent> events = impl_->manager.take_events();
  if (impl_->tiers) impl_->tiers->take_events(events);
  return events;
}
const SchedulerStats& Scheduler::stats() const noexcept {
  return impl_->stats;
}
const HostBlockManager& Scheduler::manager() const noexcept {
  return impl_->manager;
}
const std::vector<GroupLayout>& Scheduler::layouts() const noexcept {
  return impl_->layouts;
}
const SchedulerConfig& Scheduler::config() const noexcept {
  return impl_->config;
}
std::size_t Scheduler::num_requests() const noexcept {
  return impl_->requests.size();
}
std::size_t Scheduler::num_jobs_in_flight() const noexcept {
  return impl_->jobs.size();
}

CacheStats Scheduler::cache_stats() const noexcept {
  const HostBlockManager& m = impl_->manager;
  const ManagerStats& ms = m.stats();
  const auto block_bytes = static_cast<std::uint64_t>(m.block_bytes());
  CacheStats c;
  c.blocks_total = m.capacity();
  c.blocks_used = m.num_used();
  c.blocks_free = m.capacity() - m.num_used() - m.num_held();  // held: an orphan tier job's
  c.blocks_writing = m.num_writing();
  c.blocks_being_read = m.num_being_read();
  c.hits = ms.hits;
  c.misses = ms.misses;
  c.deferrals = impl_->stats.deferrals;
  c.evictions = ms.evictions;
  c.stores_skipped = ms.stores_skipped;
  c.stores_without_room = ms.store_rejections;
  c.blocks_stored = ms.stores;
  c.blocks_loaded = ms.loads;
  c.bytes_stored = ms.stores * block_bytes;
  c.bytes_loaded = ms.loads * block_bytes;
  const SchedulerStats& s = impl_->stats;
  c.lookups = s.lookups;
  c.hit_tokens = s.hit_tokens;
  c.load_jobs = s.load_jobs;
  c.store_jobs = s.store_jobs;
  c.failed_loads = s.failed_loads;
  c.failed_stores = s.failed_stores;
  c.partial_stores = s.partial_stores;
  c.partial_misses = s.partial_misses;
  c.pressure_skips = s.pressure_skips;
  c.reused_sub_blocks = s.reused_sub_blocks;
  c.unsafe_skips = s.unsafe_skips;
  c.unfinal_state_skips = s.unfinal_state_skips;
  return c;
}

}  // namespace kvoffload
