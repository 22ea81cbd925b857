#pragma once

// Internal: the scheduler's state, shared by scheduler.cpp (steps, completion),
// scheduler_lookup.cpp (SEMANTICS 4) and scheduler_validate.cpp (SEMANTICS 8b). The tiers'
// state is a TierCoordinator's (tier_coordinator.hpp), absent without tiers.

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvoffload/detail/flat_hash_map.hpp"
#include "kvoffload/detail/single_thread_guard.hpp"
#include "kvoffload/scheduler.hpp"
#include "scheduler/block_reuse_fence.hpp"
#include "scheduler/request_table.hpp"
#include "scheduler/tier_coordinator.hpp"

namespace kvoffload {

struct GroupState {
  std::vector<GpuBlockId> block_ids;  // the request's GPU blocks of this group, nulls included
  // Window and mamba groups only (empty for full attention, whose blocks an engine never frees
  // while the request runs): per block id above, its allocation generation when the request got it
  // (Impl::block_gen). A different generation now means the engine freed the block and gave
  // it out again (a window or mamba block of a running request): it no longer holds this
  // request's tokens, and a store treats it as null (SEMANTICS 6.9).
  std::vector<std::uint32_t> block_gens;
  std::int64_t next_stored = 0;     // next offloaded block to store
  std::int64_t num_hit_blocks = 0;  // offloaded blocks hit at the first lookup
  // The host block each key was last seen in (-1: unknown). Every store touches all of the
  // request's keys; checking a remembered block (one compare) is much cheaper than finding
  // the key again in the manager's index. A stale entry is detected and refreshed.
  std::vector<HostBlockId> known_blocks;
};

inline constexpr std::int64_t kNoLimit = std::numeric_limits<std::int64_t>::max();

struct RequestState {
  // What a decode step reads of every scheduled request comes first, in its first 80 bytes
  // (validate_step prefetches them): id, token counts, the step stamp, flags, idle window.
  std::string id;
  std::int64_t num_tokens = 0;
  // Tokens past this are never stored (limit_stores: vLLM's max_offload_tokens).
  std::int64_t store_limit = std::numeric_limits<std::int64_t>::max();
  // Mamba blocks ending past this are never stored (limit_state_stores: SEMANTICS 6.10, the
  // states the engine finalised; past them decode and draft-advanced states).
  std::int64_t state_limit = kNoLimit;
  std::uint64_t step_stamp = 0;  // the last build_step that validated this request
  bool looked_up = false;        // "known" in SEMANTICS 4: state exists once looked up
  bool finished = false;
  bool remote_decode = false;
  bool load_in_flight = false;
  bool skip_tiers = false;  // its promotion found no host room: the next lookup is host-only
  // The shared tiers' existence check of its keys: none yet, in flight, or answered (keys the
  // answer did not find are misses for the rest of the request's life).
  enum class SharedCheck : std::uint8_t { none, in_flight, done } shared_check = SharedCheck::none;
  // A step leaves the request idle (nothing to store) when it brings no new block and
  // idle_lo <= min(computed + scheduled, num_tokens, store_limit) < idle_hi: the groups'
  // next_stored, condensed (Impl::refresh_idle) so idle decode entries never read `groups`.
  std::int64_t idle_lo = 0;
  std::int64_t idle_hi = 0;
  std::vector<GroupState> groups;
  // At most this many tokens beyond the computed ones are loaded, ending at an offloaded
  // block's end (limit_loads: vLLM's max_load_tokens); negative: no limit.
  std::int64_t load_limit = -1;
  std::vector<BlockHash> hashes;
  std::size_t slot = 0;        // RequestTable's bookkeeping
  std::uint64_t serial = 0;    // its number for the eviction policy (AccessContext::request)
  std::int8_t continues = -1;  // the engine's hint (Scheduler::hint_continues), -1 unknown
  std::int64_t num_local_tokens = 0;
  std::vector<JobId> jobs;  // in flight: one load, or any number of stores
};

/// A job in flight, of any kind (one record, one map: Impl::jobs): a transfer (load, store)
/// of a request, or a tier job (promote, write) of a tier.
struct JobState {
  JobId id = 0;
  JobKind kind = JobKind::store;
  RequestState* request = nullptr;    // transfers only
  std::vector<Key> keys;              // loads (the "being loaded" set needs them), tier jobs
  std::vector<HostBlockId> host_ids;  // stores (completed by block, without key lookups), tier
  std::int64_t remaining = 0;         // worker reports still expected
  bool ok = true;
  // A store's source ids and per-group counts: window-group ids are registered (fenced) at
  // once, full-attention ids when the request finishes.
  std::vector<GpuBlockId> source_ids;
  std::vector<std::int64_t> group_sizes;
  bool full_registered = false;
  // A tier job's tier and slots; a write-back write evicts its host blocks once written.
  std::uint32_t tier = 0;
  std::vector<std::int64_t> slots;
  bool write_back = false;

  /// Empties the job for reuse, keeping its vectors' capacity.
  void recycle() {
    request = nullptr;
    keys.clear();
    host_ids.clear();
    remaining = 0;
    ok = true;
    source_ids.clear();
    group_sizes.clear();
    full_registered = false;
    tier = 0;
    slots.clear();
    write_back = false;
  }
};

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};

/// validate_step's product, which build_step passes down: per scheduled entry, its request,
/// its groups' offloaded blocks complete after the step, and whether build_store would change
/// nothing. Reused across steps (no allocation per decode step).
struct StepPlan {
  std::vector<RequestState*> requests;   // per entry
  std::vector<std::int64_t> blocks;      // per entry, per group (entry * G + g)
  std::vector<std::uint8_t> idle;        // per entry: 1 if the step changes nothing for it
  std::vector<std::uint64_t> id_hashes;  // per entry: its id's RequestTable::hash
  std::size_t num_groups = 0;

  void clear(std::size_t groups) {
    requests.clear();
    id_hashes.clear();
    blocks.clear();
    idle.clear();
    num_groups = groups;
  }
  /// An entry's per-group offloaded block counts; -1s for an idle entry (never read).
  [[nodiscard]] std::span<const std::int64_t> blocks_of(std::size_t entry) const {
    return std::span(blocks).subspan(entry * num_groups, num_groups);
  }
};

/// build_store's working set for one request, reused across calls so steps do not allocate
/// per key: the candidates (offloaded blocks not yet stored and not entirely null, group by
/// group), the manager's answer for them, and the touch list built from it.
struct StoreScratch {
  std::vector<Key> candidates;
  std::vector<std::int64_t> candidate_block;  // per candidate: its offloaded block index
  std::vector<std::uint16_t> candidate_from;  // per candidate: its first sub-block to copy
  std::vector<std::size_t> first_candidate;   // per group (and one past): first in candidates
  std::vector<std::size_t> stored;            // candidates prepare_store took, in order
  std::vector<std::uint8_t> group_seen;       // build_store: groups in the job being cut
  PreparedStore prepared;                     // prepare_store(candidates)
  std::vector<HostBlockId> touch_ids;         // touch_stored's list, last group first
};

struct Scheduler::Impl {
  Impl(const SchedulerConfig& config, SchedulerServices services);

  // scheduler_validate.cpp: each throws invalid_argument, changing nothing.
  /// reset_cache: everything dropped, tier jobs from now on under `new_epoch`.
  void reset(std::uint64_t new_epoch);
  RequestState& find_record(std::string_view id, std::string_view op);
  RequestState& find_looked_up(std::string_view id, std::string_view op);
  void validate_hashes(const RequestState& r, std::span<const BlockHash> hashes) const;
  /// Refuses an empty hash, or one shorter than shared_hash_min_bytes with a shared tier (a
  /// fleet's writer could collide it); `first` is hashes[0]'s index in the request.
  void check_new_hashes(std::string_view id, std::span<const BlockHash> hashes,
                        std::size_t first) const;
  void validate_allocated(RequestState& r, std::span<const AllocatedGroup> groups,
                          std::int64_t num_external_tokens);
  /// Checks a whole step and fills `plan` for build_step.
  void validate_step(std::span<const ScheduledRequest> scheduled, StepPlan& plan);
  /// validate_step's check of one entry, its request found (hash h of its id).
  void validate_entry(const ScheduledRequest& e, std::uint64_t h, StepPlan& plan);
  void validate_reports(std::span<const JobReport> reports);

  // scheduler_lookup.cpp
  std::optional<std::int64_t> lookup(RequestState& r, std::int64_t num_computed_tokens);
  /// One pass of SEMANTICS 4. Fills `hit`; returns false for retry later. With tiers, `pass`
  /// (from TierCoordinator::begin_pass) collects what the tiers' phases need: keys found only
  /// in a tier count as hits and are listed there. Null without tiers.
  bool scan(RequestState& r, std::int64_t nct, std::int64_t& hit, LookupPass* pass);
  /// The key's answer for the scan: the host cache's, else (with tiers probed) a tier's.
  Probe probe(const RequestState& r, std::size_t g, std::int64_t i, LookupPass* pass);
  /// SEMANTICS 6.8: for a windowed group's key i at the front of a run of `run` keys, the
  /// first of its sub-blocks that the engine reads at the run's end (j0); a key stored from
  /// sub-block valid_from on may count as a hit only if valid_from <= j0.
  [[nodiscard]] std::int64_t first_needed_sub_block(std::size_t g, std::int64_t i, std::int64_t run,
                                                    std::int64_t nct,
                                                    std::int64_t max_hit) const noexcept;
  /// The offloaded blocks a windowed group reads for a hit ending at token `end`: its window,
  /// or for a sliding window one more when `end` is short of this group's block boundary (a
  /// group with smaller blocks ended the hit) and the window then reaches one block further
  /// back (vLLM 0.33's load window). The lookup, the load check and the tiers all use it.
  [[nodiscard]] std::int64_t load_window(std::size_t g, std::int64_t end) const noexcept;

  /// SEMANTICS 5: where a mamba load ending at offloaded block n_off - 1's end (GPU block
  /// n_gpu - 1) starts: the engine's first block to load, or the block's first written
  /// sub-block if that is later, and past any null destination before the last (the engine
  /// reads only the state in the last sub-block; vLLM's align mode may pad with nulls).
  [[nodiscard]] std::int64_t mamba_load_from(const RequestState& r, std::size_t g,
                                             std::int64_t local, std::int64_t n_off,
                                             std::int64_t n_gpu,
                                             std::span<const GpuBlockId> ids) const {
    std::uint16_t valid_from = 0;
    std::int64_t from = local;
    if (n_off > 0 && manager.peek(key(r, g, n_off - 1), valid_from) != LookupResult::miss)
      from = std::max(local, (n_off - 1) * f + valid_from);
    std::int64_t start = n_gpu - 1;  // the trailing run of real ids, within [from, n_gpu)
    while (start > from && ids[static_cast<std::size_t>(start - 1)] != null_block) --start;
    return ids[static_cast<std::size_t>(n_gpu - 1)] == null_block ? from : std::max(from, start);
  }

  // scheduler.cpp
  void on_allocated(RequestState& r, std::span<const AllocatedGroup> groups,
                    std::int64_t num_external_tokens);
  /// One scheduled entry's part of a step: appends its new blocks, then stores its offloaded
  /// blocks below `blocks[g]` (from the StepPlan) not stored yet.
  void build_store(RequestState& r, const ScheduledRequest& entry,
                   std::span<const std::int64_t> blocks, StepResult& out);
  void append_new_blocks(RequestState& r, const ScheduledRequest& entry);
  /// Fills scratch's candidates (SEMANTICS 6.3: each block's written trailing run; a
  /// full-attention block with a hole is skipped and counted), nulling on the way the
  /// sub-blocks the engine has given out again since the request got them (SEMANTICS 6.9,
  /// counted in reused_sub_blocks); false if there is none.
  bool collect_candidates(RequestState& r, std::span<const std::int64_t> blocks,
                          StoreScratch& scratch);
  /// Every id the engine allocated this step (or handed a load) starts a new generation.
  void bump_generations(std::span<const ScheduledRequest> scheduled, const StepPlan& plan);
  void bump_generation(GpuBlockId id) {
    if (id <= 0) return;
    const auto at = static_cast<std::size_t>(id);
    if (at >= block_gen.size()) block_gen.resize(std::max(at + 1, 2 * block_gen.size()), 0);
    ++block_gen[at];
  }
  [[nodiscard]] std::uint32_t generation(GpuBlockId id) const noexcept {
    const auto at = static_cast<std::size_t>(id);
    return id > 0 && at < block_gen.size() ? block_gen[at] : 0;
  }
  /// One store job of candidates scratch.stored[k] for k in [first, last) (SEMANTICS 6.6).
  void emit_store_job(RequestState& r, StoreScratch& scratch, std::size_t first, std::size_t last,
                      StepResult& out);
  /// Fences the job's window-group sources at once (full-attention ones at finish).
  void register_window_sources(JobState& state);
  void complete(JobState& job, std::vector<CompletedJob>& done);
  void forget(RequestState& r);
  /// A new entry in `jobs`, reusing a completed job's node and vectors when there is one:
  /// steady-state steps then allocate only the vectors handed to the worker.
  JobState& add_job(JobId id, JobKind kind, RequestState& r);
  /// A tier job of tier `tier` (kind promote or write), reported by every worker.
  JobState& add_tier_job(JobId id, JobKind kind, std::uint32_t tier);
  /// A recycled record (or a new one) in `jobs`, with id, kind and the workers' reports set.
  JobState& new_job(JobId id, JobKind kind);
  void retire_job(JobId id);
  void touch(const RequestState& r);
  /// Recomputes r.idle_lo and idle_hi from its groups' next_stored: call after changing any.
  void refresh_idle(RequestState& r) const noexcept {
    std::int64_t lo = 0;
    std::int64_t hi = std::numeric_limits<std::int64_t>::max();
    for (std::size_t g = 0; g < layouts.size(); ++g) {
      const std::int64_t obs = layouts[g].offloaded_block_size;
      const std::int64_t next = r.groups[g].next_stored;
      lo = std::max(lo, next * obs);
      hi = std::min(hi, (next + 1) * obs);
    }
    r.idle_lo = lo;
    r.idle_hi = hi;
  }
  /// touch() right after prepare_store, reusing the blocks it found for the candidates.
  void touch_stored(RequestState& r, StoreScratch& scratch);
  void check(const TransferJob& job) const;
  /// Calls f(block) for each source id of a store job in groups that are (windowed == true)
  /// or are not windowed.
  template <class F>
  void for_each_source(const JobState& job, bool windowed, F&& fn) const {
    std::size_t at = 0;
    for (std::size_t g = 0; g < job.group_sizes.size(); ++g) {
      const auto n = static_cast<std::size_t>(job.group_sizes[g]);
      if (layouts[g].windowed() == windowed) {
        for (std::size_t i = at; i < at + n; ++i) fn(job.source_ids[i]);
      }
      at += n;
    }
  }

  /// SEMANTICS 7: a windowed group does not touch its first num_hit_blocks - window keys.
  [[nodiscard]] std::int64_t touch_skip(const RequestState& r, std::size_t g) const noexcept {
    return layouts[g].windowed()
               ? std::max<std::int64_t>(0, r.groups[g].num_hit_blocks - layouts[g].window_blocks)
               : 0;
  }
  /// The offloaded blocks [first, stop) of group g that an answer of `hit` tokens after `nct`
  /// uses: the prefix for full attention, only the window's last blocks for windowed groups.
  [[nodiscard]] std::pair<std::int64_t, std::int64_t> used_blocks(std::size_t g, std::int64_t nct,
                                                                  std::int64_t hit) const noexcept {
    const GroupLayout& layout = layouts[g];
    const std::int64_t obs = layout.offloaded_block_size;
    const std::int64_t stop = (nct + hit + obs - 1) / obs;
    const std::int64_t first =
        layout.windowed() ? std::max(nct / obs, stop - load_window(g, nct + hit)) : nct / obs;
    return {first, stop};
  }
  [[nodiscard]] std::int64_t num_keys(const RequestState& r, std::size_t g) const noexcept {
    return static_cast<std::int64_t>(r.hashes.size()) / layouts[g].hash_factor;
  }
  [[nodiscard]] Key key(const RequestState& r, std::size_t g, std::int64_t i) const noexcept {
    return Key{r.hashes[static_cast<std::size_t>((i + 1) * layouts[g].hash_factor - 1)],
               static_cast<std::uint32_t>(g)};
  }

  SchedulerConfig config;
  std::size_t min_hash_bytes = 1;  // shared_hash_min_bytes with a shared tier
  std::vector<GroupLayout> layouts;
  std::vector<std::size_t> lookup_order;  // SEMANTICS 4.2
  bool any_windowed = false;
  std::int64_t f = 1;
  HostBlockManager manager;
  SchedulerStats stats;

  RequestTable<RequestState> requests;
  using Jobs = std::unordered_map<JobId, JobState>;
  Jobs jobs;
  std::vector<Jobs::node_type> spare_jobs;  // completed jobs kept for reuse (add_job)
  std::vector<TransferJob> pending_loads;   // planned by on_allocated, emitted by the next step
  std::vector<JobId> flush;                 // for the next step
  JobId next_job = 0;
  // The eviction policy's view of requests (AccessContext): only a policy that uses it gets
  // one (policy reuse), so the others pay nothing.
  bool policy_context = false;
  bool tier_policy_time = false;  // a tier's index has policy reuse: it gets the clock
  std::uint64_t next_serial = 1;
  double time_set = -1;  // Scheduler::set_time's last value; -1: seconds since construction
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  /// The policy sees request r's stores and touches while one lives (policy_context only).
  class PolicyScope {
   public:
    PolicyScope(Impl& impl, const RequestState& r) : impl_(impl) {
      if (impl_.policy_context) impl_.manager.set_context({r.serial, impl_.now(), r.continues});
    }
    ~PolicyScope() {
      if (impl_.policy_context) impl_.manager.set_context({});
    }
    PolicyScope(const PolicyScope&) = delete;
    PolicyScope& operator=(const PolicyScope&) = delete;

   private:
    Impl& impl_;
  };
  [[nodiscard]] double now() const {
    return time_set >= 0
               ? time_set
               : std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  }
  JobId stale_below = 0;    // reports of jobs below this id predate reset_cache()
  std::uint64_t epoch = 0;  // weights_epoch(config.weights), or reset_cache's
  detail::FlatHashMap<Key, std::int32_t, KeyHash> being_loaded;  // key -> loads in flight
  BlockReuseFence fence;  // GPU block id -> store jobs still reading it
  // GPU block id -> how often the engine has allocated it (bump_generation); grows on demand.
  std::vector<std::uint32_t> block_gen;

  // The tiers below the host cache: null without (and then never touched).
  std::unique_ptr<TierCoordinator> tiers;

  // Reused across calls so steps do not allocate per key or per request.
  StepPlan step_plan;
  std::uint64_t step_stamp = 0;  // validate_step: a request scheduled twice is refused
  StoreScratch store_scratch;
  std::vector<Key> touch_keys;
  detail::FlatHashMap<JobId, std::int64_t, detail::IntHash> report_sums;
  std::uint64_t no_room_warnings = 0;
  bool store_pressure = false;           // set_store_pressure: steps skip their stores
  detail::SingleThreadGuard one_thread;  // debug builds: concurrent calls throw
};

}  // namespace kvoffload
