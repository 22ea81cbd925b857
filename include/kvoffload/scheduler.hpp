#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvoffload/config.hpp"
#include "kvoffload/export.hpp"
#include "kvoffload/host_block_manager.hpp"
#include "kvoffload/job.hpp"
#include "kvoffload/types.hpp"

namespace kvoffload {

class PresenceCheck;

/// What a scheduler uses beside its configuration: live services, started by the caller
/// (make_scheduler_services starts the ones a config describes) and shared with the scheduler.
/// A configuration stays a plain value that front ends can build, copy and check.
struct SchedulerServices {
  /// Per tier of SchedulerConfig::tiers (missing entries are null): how lookups learn which
  /// keys a shared tier holds (make_cluster_presence, or the engine's own). A shared tier
  /// needs one; other tiers take none. The tier's `blocks` bound the keys the scheduler
  /// remembers as present.
  std::vector<std::shared_ptr<PresenceCheck>> presence;
};

/// The GPU blocks the engine allocated for one group of a request (on_allocated).
struct AllocatedGroup {
  std::vector<GpuBlockId> block_ids;     ///< the request's blocks of this group, nulls included
  std::int64_t num_computed_blocks = 0;  ///< leading blocks that need no load
};

/// One request the engine scheduled this step (build_step).
struct ScheduledRequest {
  std::string request_id;
  std::int64_t num_computed_tokens = 0;
  std::int64_t num_scheduled_tokens = 0;
  std::vector<std::vector<GpuBlockId>> new_block_ids;  ///< one list per group
  bool resumed = false;  ///< resumed after preemption: its block list starts over
};

struct StepResult {
  std::vector<TransferJob> load_jobs;
  std::vector<TransferJob> store_jobs;
  std::vector<JobId> flush;  ///< in-flight jobs that must finish first, ascending
  /// Promotions from and writes to the tiers (empty without tiers), reported through
  /// on_completed like the others; a worker runs them on its host pool.
  std::vector<TierJob> tier_jobs;
};

/// A worker's report on a job (on_completed). With several workers a job completes once the
/// counts reach num_workers; it fails if any report failed.
struct JobReport {
  JobId job = 0;
  std::int64_t count = 1;
  bool ok = true;
};

struct CompletedJob {
  JobId job = 0;
  JobKind kind = JobKind::store;
  std::string request_id;
  bool ok = true;  ///< a failed load means the engine must recompute those tokens
};

/// The scheduler's own counters (the host cache's are in ManagerStats; CacheStats has both).
struct SchedulerStats {
  std::uint64_t lookups = 0;
  std::uint64_t hit_tokens = 0;
  std::uint64_t deferrals = 0;  ///< lookups answered "retry later"
  std::uint64_t load_jobs = 0;
  std::uint64_t store_jobs = 0;
  std::uint64_t failed_loads = 0;    ///< load jobs
  std::uint64_t failed_stores = 0;   ///< store jobs
  std::uint64_t partial_stores = 0;  ///< blocks stored without their leading sub-blocks
  std::uint64_t partial_misses = 0;  ///< present keys refused: a sub-block needed was not written
  std::uint64_t pressure_skips = 0;  ///< blocks not stored: the workers' stores were behind
  std::uint64_t reused_sub_blocks = 0;    ///< GPU blocks left out of a store: given out again
  std::uint64_t unsafe_skips = 0;         ///< blocks not stored: a hole no lookup could serve
  std::uint64_t unfinal_state_skips = 0;  ///< mamba blocks not stored: past the final tokens
};

/// One tier's counters (Scheduler::tier_stats): its index and the jobs the scheduler made.
struct TierStats {
  std::int64_t blocks_total = 0;
  std::int64_t blocks_used = 0;
  std::int64_t blocks_writing = 0;
  std::int64_t blocks_being_read = 0;   ///< promotions in flight
  std::uint64_t hits = 0;               ///< keys a lookup missed in host memory and found here
  std::uint64_t misses = 0;             ///< keys missed in host memory and here
  std::uint64_t promotions = 0;         ///< blocks promoted into host memory
  std::uint64_t failed_promotions = 0;  ///< blocks whose promotion failed (a miss, then)
  std::uint64_t promotions_without_room = 0;  ///< lookups whose promotion found no host room
  std::uint64_t blocks_written = 0;           ///< blocks written to the tier
  std::uint64_t failed_writes = 0;            ///< blocks whose write failed (ENOSPC, I/O)
  std::uint64_t writes_skipped = 0;           ///< below the tier's store_threshold
  std::uint64_t writes_queue_full = 0;        ///< skipped: the write queue was full
  std::uint64_t writes_without_room = 0;      ///< skipped: no slot could be freed
  std::uint64_t writes_partial = 0;  ///< skipped: a block stored without its leading sub-blocks
  std::uint64_t evictions = 0;
  std::uint64_t promote_jobs = 0;
  std::uint64_t write_jobs = 0;
  // Shared tiers: existence checks asked (one per request), keys they found and did not find,
  // checks that could not start (their keys were misses).
  std::uint64_t presence_checks = 0;
  std::uint64_t presence_hits = 0;
  std::uint64_t presence_misses = 0;
  std::uint64_t presence_failures = 0;
  /// Keys whose check got no usable answer (an outage: the cluster down, a timeout, AUTH or
  /// TLS refused), apart from presence_misses; they are misses for the request too.
  std::uint64_t presence_errors = 0;
  /// Blocks of promotions that passed the tier's promote_timeout_ms: lookups stopped waiting
  /// for them (misses), their host blocks held until the workers reported the job.
  std::uint64_t promotions_overdue = 0;
};

/// The complete snapshot of the host cache and the scheduler's counters: what the C API's
/// kvoffload_scheduler_stats_t, Python's Scheduler.stats() and the replay tool's "stats" op
/// report, field for field (kvoffload/detail/stats_fields.hpp lists them once).
struct CacheStats {
  std::int64_t blocks_total = 0;
  std::int64_t blocks_used = 0;
  std::int64_t blocks_free = 0;
  std::int64_t blocks_writing = 0;
  std::int64_t blocks_being_read = 0;
  std::uint64_t hits = 0;       ///< key lookups that hit
  std::uint64_t misses = 0;     ///< key lookups that missed
  std::uint64_t deferrals = 0;  ///< request lookups answered "retry later"
  std::uint64_t evictions = 0;
  std::uint64_t stores_skipped = 0;       ///< keys below the store threshold
  std::uint64_t stores_without_room = 0;  ///< store attempts refused: no room could be made
  std::uint64_t blocks_stored = 0;
  std::uint64_t blocks_loaded = 0;
  std::uint64_t bytes_stored = 0;  ///< blocks_stored x block_bytes (0 if unknown)
  std::uint64_t bytes_loaded = 0;
  std::uint64_t lookups = 0;     ///< request lookups
  std::uint64_t hit_tokens = 0;  ///< tokens those lookups found
  std::uint64_t load_jobs = 0;
  std::uint64_t store_jobs = 0;
  std::uint64_t failed_loads = 0;   ///< load jobs that failed
  std::uint64_t failed_stores = 0;  ///< store jobs that failed
  /// SEMANTICS 6.8: blocks stored with valid_from > 0 (leading sub-blocks null, unwritten),
  /// and key lookups that found such a block but treated it as a miss because the answer
  /// would have needed one of its unwritten sub-blocks.
  std::uint64_t partial_stores = 0;
  std::uint64_t partial_misses = 0;
  /// Blocks a step did not store because the workers reported store back-pressure
  /// (set_store_pressure): never stored for that request, so a later lookup misses there.
  std::uint64_t pressure_skips = 0;
  /// SEMANTICS 6.9: window and mamba GPU blocks of a request's store range that the engine
  /// freed and handed out again (to another request, or the same one) before the store was
  /// built; the store leaves them out (a window block freed by vLLM's remove_skipped_blocks,
  /// say). And blocks not stored because what was written of them could never be served: a
  /// full-attention block with a hole (a null sub-block before a written one; a block whose
  /// last sub-block is null holds nothing to store and is not counted).
  std::uint64_t reused_sub_blocks = 0;
  std::uint64_t unsafe_skips = 0;
  /// SEMANTICS 6.10: mamba blocks not stored because they end past the tokens the engine
  /// finalised (limit_state_stores): their state was computed by decode steps, draft tokens
  /// included, not by the prefill a later request would otherwise run.
  std::uint64_t unfinal_state_skips = 0;
};

/// The offloading scheduler of SEMANTICS 3-8: decides which KV blocks of which requests are
/// stored to host memory and loaded back, for models with full-attention, sliding-window and
/// mamba groups, and counts exactly the GPU blocks it emits.
///
/// Errors: every public function throws kvoffload::invalid_argument for bad input (the list
/// of SEMANTICS 8b and a few more), with a message naming the request, group, job or field;
/// the scheduler is then unchanged.
/// Thread-safety: single-threaded by contract; one thread (the engine's scheduler) calls it,
/// or the engine holds a lock around every call. Debug builds check it: a call made while
/// another thread is inside throws kvoffload::error saying so.
class KVOFFLOAD_EXPORT Scheduler {
 public:
  /// Throws invalid_argument naming the field for a bad config, or a service missing or
  /// extra ("services.presence[1]: ...").
  explicit Scheduler(const SchedulerConfig& config, SchedulerServices services = {});
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;
  Scheduler(Scheduler&&) noexcept;
  Scheduler& operator=(Scheduler&&) noexcept;

  /// Tells the scheduler a request's token count and its block hashes so far (the full list:
  /// it must extend the previous one). Creates the request's record on first sight.
  void update_request(std::string_view request_id, std::int64_t num_tokens,
                      std::span<const BlockHash> block_hashes, bool remote_decode = false);
  /// Like update_request, but `new_hashes` are appended to the ones already known.
  void extend_request(std::string_view request_id, std::int64_t num_tokens,
                      std::span<const BlockHash> new_hashes);

  /// Its lookups load at most `max_tokens` beyond the computed ones, ending at an offloaded
  /// block's end, with every group checked at that shorter end (vLLM 0.33's max_load_tokens,
  /// SEMANTICS 4 step 3); negative: no limit again. Throws invalid_argument for an unknown
  /// request.
  void limit_loads(std::string_view request_id, std::int64_t max_tokens);

  /// The engine's hint that the request's conversation will go on (a chat front end or router
  /// knows; vLLM: kv_transfer_params "kvoffload_continues") or not. Only policy reuse reads
  /// it: its blocks are kept longer, or given up first. Throws invalid_argument for an
  /// unknown request.
  void hint_continues(std::string_view request_id, bool continues);
  /// The clock policy reuse ages requests by, in seconds (a replay's trace time); never
  /// going back. Without a call: seconds since the scheduler was made (so call it before the
  /// first request or never: the policy's clock does not go back to an earlier time).
  void set_time(double seconds);

  /// Stores none of the request's tokens past the first `max_tokens` (0: stores nothing of
  /// it): vLLM's per-request max_offload_tokens. Blocks it already stored stay. Throws
  /// invalid_argument for an unknown request or a negative limit.
  void limit_stores(std::string_view request_id, std::int64_t max_tokens);

  /// SEMANTICS 6.10: mamba groups store no block of the request that ends past its first
  /// `final_tokens` tokens: those whose states the engine finalised as a prefill computes
  /// them (vLLM: the prompt, or what a resumed request recomputes). Past them a block holds a
  /// decode-time state, advanced over draft tokens under speculative decoding, which a later
  /// request's prefill would not compute (counted in unfinal_state_skips). Other groups are
  /// unaffected. No limit until called; call again to move it. Throws invalid_argument for an
  /// unknown request or a negative count.
  void limit_state_stores(std::string_view request_id, std::int64_t final_tokens);

  /// SEMANTICS 4: tokens that can be loaded from host memory (0: nothing), or nullopt: retry
  /// later (keys are being stored or loaded right now).
  std::optional<std::int64_t> lookup(std::string_view request_id, std::int64_t num_computed_tokens);

  /// SEMANTICS 5: the engine allocated GPU blocks; with external tokens this plans the load
  /// job that the next build_step emits.
  void on_allocated(std::string_view request_id, std::span<const AllocatedGroup> groups,
                    std::int64_t num_external_tokens);

  /// SEMANTICS 6.9: GPU blocks the engine handed out or overwrites this step without listing
  /// them in any request's new block ids (vLLM's kv_cache_block_copies destinations). A store
  /// built from now on leaves them out of every request that held them before in a window or
  /// mamba group (a running request's full-attention blocks are never handed out), and stores
  /// still reading them are flushed first. Call it before the step's build_step; new block ids
  /// and on_allocated need no such call.
  void handed_out(std::span<const GpuBlockId> block_ids);

  /// SEMANTICS 6: the load jobs planned since the last step, the store jobs of this step (in
  /// the order of `scheduled`), and the stores to flush first.
  StepResult build_step(std::span<const ScheduledRequest> scheduled,
                        std::span<const std::string> preempted = {});

  /// SEMANTICS 8: worker reports. Returns the jobs that completed with this call, in report
  /// order. Reports of jobs issued before the last reset_cache() are ignored.
  std::vector<CompletedJob> on_completed(std::span<const JobReport> reports);

  /// SEMANTICS 8: the request is finished. Unknown or already finished requests are ignored,
  /// so the engine may call it for every request it ends.
  void on_finished(std::string_view request_id);

  /// SEMANTICS 8: drops the host cache; in-flight jobs go to the next flush set and their
  /// reports will be ignored. Throws invalid_argument if the scheduler has tiers: their
  /// blocks outlive the call, so it needs reset_cache(weights).
  void reset_cache();
  /// reset_cache() for new weights, with or without tiers: every tier's index is dropped too,
  /// and tier jobs and existence checks from now on use the epoch weights_epoch(weights), so
  /// the tiers' old blocks are unreachable from this call on (a restart under `weights`, or
  /// another engine that gives it, finds only blocks stored under it). Throws
  /// invalid_argument for an empty `weights`.
  void reset_cache(std::string_view weights);
  /// The epoch tier jobs carry now (TierJob::epoch).
  [[nodiscard]] std::uint64_t epoch() const noexcept;

  /// Where build_step has nothing to do for a request (SEMANTICS 6: no store) when its entry
  /// brings no new block and is not resumed: for num_computed_tokens + num_scheduled_tokens in
  /// [lo, hi). Empty (lo >= hi) for an unknown or finished request. It changes only with the
  /// request's build_step entries that do something, its lookups, allocations, new hashes and
  /// limit_stores, and reset_cache, so a binding that remembers it may leave such entries out of a
  /// step (most of a decode step's requests) and get the same jobs.
  struct IdleWindow {
    std::int64_t lo = 0;
    std::int64_t hi = 0;
  };
  [[nodiscard]] IdleWindow idle_window(std::string_view request_id) const;

  /// Back-pressure from the workers (Worker::store_pressure(), any worker's): while on, steps
  /// build no store jobs; the blocks they would have stored are skipped for good (counted in
  /// pressure_skips) and the requests move on, so no step waits and no GPU block is held
  /// for a store. Loads, lookups and tier jobs are unaffected. Off by default; the engine
  /// sets it from its workers' latest report before each build_step.
  void set_store_pressure(bool on) noexcept;
  [[nodiscard]] bool store_pressure() const noexcept;

  /// The events since the last call: the host cache's, oldest first, then each tier's
  /// (ManagerEvent::medium), oldest first.
  std::vector<ManagerEvent> take_events();

  /// Rebuilds tier `tier`'s index from its slots' scan after a restart (slot i holds
  /// blocks[i]; see HostBlockManager::restore). Only before the tier holds anything. Returns
  /// the keys restored.
  std::int64_t restore_tier(std::size_t tier, std::span<const std::optional<Key>> blocks);
  /// Tier `tier`'s counters; throws invalid_argument for a tier that is not configured.
  [[nodiscard]] TierStats tier_stats(std::size_t tier) const;
  /// Tier `tier`'s index: which key is in which slot.
  [[nodiscard]] const HostBlockManager& tier_index(std::size_t tier) const;

  [[nodiscard]] const SchedulerStats& stats() const noexcept;
  [[nodiscard]] CacheStats cache_stats() const noexcept;
  [[nodiscard]] const HostBlockManager& manager() const noexcept;
  [[nodiscard]] const std::vector<GroupLayout>& layouts() const noexcept;
  [[nodiscard]] const SchedulerConfig& config() const noexcept;
  /// Requests with a record (looked up or only updated, and not yet forgotten).
  [[nodiscard]] std::size_t num_requests() const noexcept;
  /// Jobs created and not yet completed (load jobs not yet emitted included).
  [[nodiscard]] std::size_t num_jobs_in_flight() const noexcept;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvoffload
