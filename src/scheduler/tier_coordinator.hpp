#pragma once

// Internal: the scheduler's side of the tiers below the host cache (docs/semantics.md,
// "Tiers"). A Scheduler without tiers has no TierCoordinator and never calls into one.
//
// The phases it takes part in, and the values they hand on:
//   lookup:      begin_pass -> (Impl::scan calls probe per key, filling the LookupPass) ->
//                plan_promotion(pass) or check_presence(pass) -> queue_writes(catch-up writes)
//   build_step:  build_step(out): write-back writes, then the promotions planned by lookups,
//                after the tier jobs queued since the last step
//   completion:  on_stored (write-through) and complete (a tier job's report)

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvoffload/detail/flat_hash_map.hpp"
#include "kvoffload/scheduler.hpp"

namespace kvoffload {

struct JobState;
struct RequestState;

/// A tier's index is a HostBlockManager over the tier's slots: the ids it calls host block
/// ids are slot ids (the slot a key is in, or a job reads or writes), never host blocks.
using SlotId = HostBlockId;

/// A key's answer for the lookup's scan, with the first sub-block its store wrote.
struct Probe {
  LookupResult result = LookupResult::miss;
  std::uint16_t valid_from = 0;
};

/// A key the lookup's scan missed in host memory and found in a tier.
struct TierFind {
  std::uint32_t group = 0;
  std::uint32_t tier = 0;
  std::int64_t index = 0;  // offloaded block index in the group
};

/// What one scan of a request's keys found besides its answer, handed from the scan to the
/// lookup's tier phases (TierCoordinator::begin_pass gives one, its vectors' capacity kept).
struct LookupPass {
  bool probe_tiers = false;  // look keys the host cache misses up in the tiers
  // Count the keys toward the tiers' admission (store_threshold): a request counts once, at
  // its first lookup, however often it is asked again ("retry later", a resumed request).
  bool count_lookups = true;
  std::vector<TierFind> tier_found;          // keys only a tier has
  std::vector<Key> shared_unknown;           // keys no tier is known to have, never checked
  std::vector<HostBlockId> catch_up_writes;  // host hits that just reached a tier's admission
};

/// One tier: its index (which key is in which slot), counters and write queue.
struct TierState {
  TierState(const TierConfig& c, bool events);
  TierConfig config;
  HostBlockManager index;  // over slots (SlotId)
  TierStats stats;
  std::shared_ptr<PresenceCheck> presence;  // shared tiers only (SchedulerServices)
  std::int64_t queue_limit = 0;
  std::int64_t queued = 0;       // blocks in write jobs not yet completed
  std::int64_t free_target = 0;  // write-back: host blocks kept free
  // Promotions past promote_timeout_ms still in flight (orphans included): while any is, the
  // tier is taken as stalled and lookups do not probe it, so no new request waits on it.
  std::int64_t stalled_promotions = 0;
};

/// An existence check in flight: whose, and which keys (PresenceAnswer::present's order).
struct PresenceTicket {
  std::string request_id;
  std::uint32_t tier = 0;
  std::vector<Key> keys;
};

/// A promotion a lookup planned: the tier's slots are reserved (readers) at once, the host
/// blocks are taken in the next build_step, where evictions happen (a lookup never evicts, so
/// a hit another lookup promised stays loadable until its on_allocated).
struct PlannedPromotion {
  std::string request_id;
  std::vector<Key> protect;  // host hits the answer uses: not evicted for the promoted keys
  std::vector<Key> keys;     // to promote, group-major
  std::vector<std::uint32_t> tier;
  std::vector<SlotId> slots;
};

/// A tier job in flight when reset_cache dropped the index (docs/semantics.md "Tiers"): the
/// workers may still read or write its host blocks and slots, so they stay held (neither
/// used nor handed out) until its last report; the step never waits for it.
struct OrphanJob {
  std::uint32_t tier = 0;
  std::int64_t remaining = 0;  // worker reports still expected
  bool stalled = false;        // a promotion past its deadline (TierState::stalled_promotions)
  bool write = false;          // its blocks count in its tier's write queue until it reports
  std::vector<HostBlockId> host_ids;
  std::vector<SlotId> slots;
};

/// A promotion in flight: when lookups stop waiting for it (the tier's promote_timeout_ms).
struct PromotionClock {
  std::chrono::steady_clock::time_point deadline;
  std::uint32_t tier = 0;
  std::size_t blocks = 0;
  bool overdue = false;  // passed, counted and logged
};

class TierCoordinator {
 public:
  /// The tiers of `config` (at least one), with their services; throws invalid_argument for
  /// a service missing or extra.
  TierCoordinator(Scheduler::Impl& scheduler, const SchedulerConfig& config,
                  SchedulerServices services);

  // ---- lookup -------------------------------------------------------------------------
  [[nodiscard]] bool any_shared() const noexcept { return any_shared_; }
  /// A cleared pass for one scan; `probe_tiers` false: the host cache alone answers.
  LookupPass& begin_pass(bool probe_tiers, bool count_lookups);
  /// The scan's answer for key k (group g, index i) given the host cache's: counts the
  /// lookup for the tiers' admission, and with pass.probe_tiers looks a host miss up below.
  Probe probe(const RequestState& r, const Key& k, std::size_t g, std::int64_t i, Probe host,
              LookupPass& pass);
  /// After a lookup found `hit` tokens: plans the promotion of the keys it uses that only a
  /// tier has (pass.tier_found). True if one was planned (the lookup answers retry later).
  bool plan_promotion(const RequestState& r, std::int64_t nct, std::int64_t hit, LookupPass& pass);
  /// Starts the check of pass.shared_unknown for request r on every shared tier.
  void check_presence(RequestState& r, const LookupPass& pass);
  /// Applies the shared tiers' finished existence checks: present keys enter the index.
  void poll_presence();

  // ---- step and completion -------------------------------------------------------------
  /// The step's tier jobs: those queued since the last step, write-back writes, then the
  /// planned promotions (their host blocks taken now).
  void build_step(StepResult& out);
  /// Write-through: queues tier writes of these ready host blocks to tiers
  /// 0..nearer_than-1 (default: every tier), subject to admission and the write queue.
  void queue_writes(std::span<const HostBlockId> host_ids, std::uint32_t nearer_than = UINT32_MAX);
  /// A tier job's last report arrived.
  void complete(JobState& job);
  /// reset_cache, before reset(): tier job `job` (in flight) becomes an orphan.
  void adopt_orphan(const JobState& job);
  /// reset_cache: every tier emptied but the slots orphans use (held), nothing planned or
  /// queued, checks' answers ignored. Returns the host blocks orphans use, for the host
  /// cache's reset to hold.
  [[nodiscard]] std::vector<HostBlockId> reset();
  /// The reports an orphan still expects, or -1 for a job that is none (a stale transfer's).
  [[nodiscard]] std::int64_t orphan_remaining(JobId job) const;
  /// An orphan's report: with its last, its host blocks and slots no other orphan uses are
  /// released.
  void orphan_reported(const JobReport& report);
  [[nodiscard]] std::size_t num_orphans() const noexcept { return orphans_.size(); }

  // ---- the public API's views ----------------------------------------------------------
  [[nodiscard]] std::size_t size() const noexcept { return tiers_.size(); }
  /// The clock for the tiers' indexes whose policy is reuse (no request is behind a tier's
  /// writes: their blocks go by recency, in write batches).
  void set_policy_time(double now) {
    for (auto& t : tiers_) t->index.set_context({0, now, -1});
  }
  /// Tier t; throws invalid_argument naming `op` for a tier not configured.
  [[nodiscard]] TierState& tier(std::size_t t, std::string_view op);
  void take_events(std::vector<ManagerEvent>& out);

 private:
  /// One write job of `keys` (from host blocks `sources`) to tier t; false if the tier had
  /// no room or nothing to write.
  bool issue_write(std::uint32_t t, std::span<const Key> keys, std::span<const HostBlockId> sources,
                   bool write_back);
  /// Write-back tiers: writes the blocks the host policy would evict next, so free_target
  /// host blocks stay free.
  void write_back();
  void start_promotions();
  /// Whether key k (pending in the host cache) is being filled by a promotion past its tier's
  /// promote_timeout_ms; counts and logs each such promotion once.
  bool overdue(const Key& k);
  /// An overdue promotion of tier t (job) reported: the tier is probed again once none is left.
  void end_stall(std::uint32_t t, JobId job);
  TierJob& new_job(JobKind kind, std::uint32_t tier, std::string request_id);

  Scheduler::Impl& s_;  // the host cache, the job records, the requests, the keys
  std::vector<std::unique_ptr<TierState>> tiers_;
  bool any_shared_ = false;
  std::vector<TierJob> pending_jobs_;  // for the next step
  std::vector<PlannedPromotion> planned_;
  detail::FlatHashMap<Key, std::int32_t, KeyHash> promoting_;  // keys of planned promotions
  std::unordered_map<std::uint64_t, PresenceTicket> tickets_;  // checks in flight
  std::uint64_t next_ticket_ = 1;
  std::unordered_map<JobId, OrphanJob> orphans_;  // jobs issued before a reset
  // How many orphans use each held host block, and each held slot (per tier): released at 0.
  std::unordered_map<HostBlockId, std::int32_t> held_host_;
  std::vector<std::unordered_map<SlotId, std::int32_t>> held_slots_;
  std::unordered_map<JobId, PromotionClock> promotion_clock_;  // promotions in flight
  std::unordered_map<HostBlockId, JobId> promoting_blocks_;    // host blocks they fill
  LookupPass pass_;                                            // begin_pass's, reused
  // start_promotions' working set, reused.
  std::vector<Key> promote_keys_;
  PreparedStore promote_prepared_;
  std::vector<Key> promote_release_;
};

}  // namespace kvoffload
