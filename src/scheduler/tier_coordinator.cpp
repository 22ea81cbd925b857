// TierCoordinator (tier_coordinator.hpp): promotion of the keys a lookup uses from a tier into
// host memory, write-through and write-back with admission and a bounded queue, the shared
// tiers' existence checks, and the completion of both kinds of tier job.

#include <algorithm>

#include "common/block_math.hpp"
#include "common/expects.hpp"
#include "common/logging.hpp"
#include "kvoffload/tiers/shared_presence.hpp"
#include "scheduler/tier_coordinator.hpp"

#include "scheduler/scheduler_impl.hpp"

namespace kvoffload {
namespace {

ManagerConfig index_config(const TierConfig& c, bool events) {
  ManagerConfig m;
  m.host_blocks = c.blocks;
  m.policy = c.policy;
  m.store_threshold = c.store_threshold;
  m.enable_events = events;
  m.medium = c.medium;
  return m;
}

constexpr std::int64_t kDefaultWriteQueueBlocks = 1024;
constexpr std::int64_t kDefaultPromoteTimeoutMs = 5000;

}  // namespace

TierState::TierState(const TierConfig& c, bool events)
    : config(c),
      index(index_config(c, events)),
      queue_limit(c.write_queue_blocks > 0 ? c.write_queue_blocks : kDefaultWriteQueueBlocks) {}

TierCoordinator::TierCoordinator(Scheduler::Impl& scheduler, const SchedulerConfig& cfg,
                                 SchedulerServices services)
    : s_(scheduler) {
  KVOFFLOAD_EXPECTS(services.presence.size() <= cfg.tiers.size(),
                    "services.presence: {} entries for {} tier(s)", services.presence.size(),
                    cfg.tiers.size());
  services.presence.resize(cfg.tiers.size());
  for (std::size_t i = 0; i < cfg.tiers.size(); ++i) {
    const TierConfig& tier = cfg.tiers[i];
    const bool shared = tier.medium == Medium::shared;
    KVOFFLOAD_EXPECTS(shared == (services.presence[i] != nullptr), "services.presence[{}]: {}", i,
                      shared ? "tier " + std::to_string(i) +
                                   " is a shared tier and needs one (make_scheduler_services)"
                             : "tier " + std::to_string(i) + " is a " +
                                   std::string(to_string(tier.medium)) +
                                   " tier; only a shared tier has one");
    auto& t = tiers_.emplace_back(std::make_unique<TierState>(tier, cfg.manager.enable_events));
    t->presence = std::move(services.presence[i]);
    t->free_target = tier.write_back_free_blocks > 0
                         ? tier.write_back_free_blocks
                         : std::max<std::int64_t>(1, cfg.manager.host_blocks / 16);
    if (shared) any_shared_ = true;
  }
}

TierJob& TierCoordinator::new_job(JobKind kind, std::uint32_t tier, std::string request_id) {
  TierJob& job = pending_jobs_.emplace_back();
  job.id = s_.next_job++;
  job.kind = kind;
  job.tier = tier;
  job.request_id = std::move(request_id);
  job.epoch = s_.epoch;
  return job;
}

LookupPass& TierCoordinator::begin_pass(bool probe_tiers, bool count_lookups) {
  pass_.probe_tiers = probe_tiers;
  pass_.count_lookups = count_lookups;
  pass_.tier_found.clear();
  pass_.shared_unknown.clear();
  pass_.catch_up_writes.clear();
  return pass_;
}

Probe TierCoordinator::probe(const RequestState& r, const Key& k, std::size_t g, std::int64_t i,
                             Probe host, LookupPass& pass) {
  // A promotion past its deadline (a stalled disk, a slow node): its keys are computed, not
  // waited for, and not looked up below (that would plan the same promotion again).
  if (host.result == LookupResult::pending && !promotion_clock_.empty() && overdue(k)) {
    return {LookupResult::miss, 0};
  }
  if (host.result != LookupResult::miss) {
    // Admission counts every request's first lookup of the key, also while the host cache
    // has it; a host hit that brings a key to a tier's threshold is written through now (it
    // was stored earlier).
    for (const auto& tier : tiers_) {
      if (tier->config.store_threshold == 0 || !pass.count_lookups) continue;
      tier->index.note_lookup(k);
      if (host.result == LookupResult::hit &&
          tier->index.lookup_count(k) == static_cast<std::uint32_t>(tier->config.store_threshold) &&
          tier->index.peek(k) == LookupResult::miss) {
        pass.catch_up_writes.push_back(s_.manager.block_of(k));
      }
    }
    return host;
  }
  if (!pass.probe_tiers) return {host.result, 0};
  // Below the host cache every block is whole (partly written ones are never written there).
  if (promoting_.contains(k)) return {LookupResult::pending, 0};  // promotion starts next step
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    if (tiers_[t]->stalled_promotions > 0) continue;  // stalled: a miss, not a wait
    HostBlockManager& index = tiers_[t]->index;
    if ((pass.count_lookups ? index.lookup(k) : index.lookup_again(k)) == LookupResult::hit) {
      pass.tier_found.push_back(
          TierFind{static_cast<std::uint32_t>(g), static_cast<std::uint32_t>(t), i});
      return {LookupResult::hit, 0};
    }
  }
  // Not known to be in a shared tier: asked once per request, "retry later" meanwhile.
  if (any_shared_ && r.shared_check != RequestState::SharedCheck::done) {
    if (r.shared_check == RequestState::SharedCheck::none) pass.shared_unknown.push_back(k);
    return {LookupResult::pending, 0};
  }
  return {LookupResult::miss, 0};
}

bool TierCoordinator::plan_promotion(const RequestState& r, std::int64_t nct, std::int64_t hit,
                                     LookupPass& pass) {
  std::vector<TierFind>& tier_found = pass.tier_found;
  // The keys the answer uses: a prefix; for windowed groups only the window's blocks.
  std::erase_if(tier_found, [&](const TierFind& found) {
    const auto [first, stop] = s_.used_blocks(found.group, nct, hit);
    return found.index < first || found.index >= stop;
  });
  if (tier_found.empty()) return false;
  // Group-major, each key once (a scan's second pass may have found a key again).
  std::sort(tier_found.begin(), tier_found.end(), [](const TierFind& x, const TierFind& y) {
    return x.group != y.group ? x.group < y.group : x.index < y.index;
  });
  tier_found.erase(std::unique(tier_found.begin(), tier_found.end(),
                               [](const TierFind& x, const TierFind& y) {
                                 return x.group == y.group && x.index == y.index;
                               }),
                   tier_found.end());
  PlannedPromotion& p = planned_.emplace_back();
  p.request_id = r.id;
  for (std::size_t g = 0; g < s_.layouts.size(); ++g) {
    const auto [first, stop] = s_.used_blocks(g, nct, hit);
    for (std::int64_t i = first; i < stop; ++i) {
      const Key k = s_.key(r, g, i);
      if (s_.manager.peek(k) == LookupResult::hit) p.protect.push_back(k);
    }
  }
  std::vector<SlotId> slot;
  for (const TierFind& found : tier_found) {
    const Key k = s_.key(r, found.group, found.index);
    slot.clear();
    // A reader on the slot: the tier cannot evict it before the promotion has run.
    tiers_[found.tier]->index.prepare_load(std::span(&k, 1), slot);
    p.keys.push_back(k);
    p.tier.push_back(found.tier);
    p.slots.push_back(slot[0]);
    ++*promoting_.insert(k, 0).first;
  }
  return true;
}

void TierCoordinator::build_step(StepResult& out) {
  // The tier jobs queued since the last step first (write-through, catch-up writes).
  out.tier_jobs.swap(pending_jobs_);
  write_back();
  start_promotions();
  for (TierJob& job : pending_jobs_) out.tier_jobs.push_back(std::move(job));
  pending_jobs_.clear();
}

void TierCoordinator::start_promotions() {
  for (PlannedPromotion& p : planned_) {
    // What the step before it changed: keys stored meanwhile need no promotion, protected
    // keys evicted meanwhile are not stored here (no job would fill them).
    promote_keys_.clear();
    promote_release_.clear();
    for (const Key& k : p.protect) {
      if (s_.manager.peek(k) != LookupResult::miss) promote_keys_.push_back(k);
    }
    std::vector<std::size_t> wanted;
    for (std::size_t i = 0; i < p.keys.size(); ++i) {
      if (s_.manager.peek(p.keys[i]) == LookupResult::miss) {
        promote_keys_.push_back(p.keys[i]);
        wanted.push_back(i);
      }
    }
    for (const Key& k : p.keys) {
      std::int32_t* count = promoting_.find(k);
      if (count != nullptr && --*count == 0) promoting_.erase(k);
    }
    const bool ok = wanted.empty() ||
                    s_.manager.prepare_store(promote_keys_, promote_prepared_, /*admit_all=*/true);
    if (!ok) {
      for (const std::size_t i : wanted) ++tiers_[p.tier[i]]->stats.promotions_without_room;
      if (RequestState* r = s_.requests.find(p.request_id)) r->skip_tiers = true;
    }
    // One job per tier, keys in group-major order; slots not promoted lose their reader.
    for (std::uint32_t t = 0; t < tiers_.size(); ++t) {
      TierJob* job = nullptr;
      std::size_t w = 0;
      promote_release_.clear();
      for (std::size_t i = 0; i < p.keys.size(); ++i) {
        const bool take = ok && w < wanted.size() && wanted[w] == i;
        if (w < wanted.size() && wanted[w] == i) ++w;
        if (p.tier[i] != t) continue;
        if (!take) {
          promote_release_.push_back(p.keys[i]);
          continue;
        }
        if (job == nullptr) job = &new_job(JobKind::promote, t, p.request_id);
        const HostBlockId host = s_.manager.block_of(p.keys[i]);
        KVOFFLOAD_ASSERT(host >= 0, "promotion of {}: no host block was prepared",
                         to_string(p.keys[i]));
        job->keys.push_back(p.keys[i]);
        job->host_block_ids.push_back(host);
        job->slots.push_back(p.slots[i]);
      }
      tiers_[t]->index.complete_load(promote_release_);
      if (job == nullptr) continue;
      JobState& state = s_.add_tier_job(job->id, JobKind::promote, t);
      state.keys = job->keys;
      state.host_ids = job->host_block_ids;
      state.slots = job->slots;
      ++tiers_[t]->stats.promote_jobs;
      const std::int64_t ms = tiers_[t]->config.promote_timeout_ms > 0
                                  ? tiers_[t]->config.promote_timeout_ms
                                  : kDefaultPromoteTimeoutMs;
      promotion_clock_[job->id] = PromotionClock{
          std::chrono::steady_clock::now() + std::chrono::milliseconds(ms), t, job->keys.size()};
      for (const HostBlockId h : job->host_block_ids) promoting_blocks_[h] = job->id;
    }
  }
  planned_.clear();
}

bool TierCoordinator::overdue(const Key& k) {
  const auto block = promoting_blocks_.find(s_.manager.block_of(k));
  if (block == promoting_blocks_.end()) return false;
  const auto it = promotion_clock_.find(block->second);
  if (it == promotion_clock_.end()) return false;
  PromotionClock& clock = it->second;
  if (clock.overdue) return true;
  if (std::chrono::steady_clock::now() < clock.deadline) return false;
  clock.overdue = true;
  TierState& tier = *tiers_[clock.tier];
  tier.stats.promotions_overdue += clock.blocks;
  ++tier.stalled_promotions;
  detail::logger().warn(
      "tier {} ({}): promotion job {} of {} block(s) is past promote_timeout_ms; lookups "
      "compute its keys instead of waiting and do not ask this tier until it answers; its "
      "host blocks stay in use until the workers report it",
      clock.tier, to_string(tier.config.medium), block->second, clock.blocks);
  return true;
}

namespace {

/// Why a block is not written to a tier now: it is there (or being written), not admitted,
/// or the write queue is full (counted in the tier's stats). nullopt: write it.
bool skip_write(TierState& tier, const Key& k, std::size_t batched) {
  if (tier.index.peek(k) != LookupResult::miss) return true;  // there, or being written
  if (tier.config.store_threshold > 0 &&
      tier.index.lookup_count(k) < static_cast<std::uint32_t>(tier.config.store_threshold)) {
    ++tier.stats.writes_skipped;
    return true;
  }
  if (tier.queued + static_cast<std::int64_t>(batched) >= tier.queue_limit) {
    ++tier.stats.writes_queue_full;
    return true;
  }
  return false;
}

}  // namespace

bool TierCoordinator::issue_write(std::uint32_t t, std::span<const Key> keys,
                                  std::span<const HostBlockId> sources, bool write_back) {
  TierState& tier = *tiers_[t];
  PreparedStore prepared;
  if (!tier.index.prepare_store(keys, prepared, /*admit_all=*/true)) {
    tier.stats.writes_without_room += keys.size();
    return false;
  }
  if (prepared.keys_to_store.empty()) return false;
  TierJob& job = new_job(JobKind::write, t, {});
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (prepared.key_stored[i] == 0) continue;  // a host block given twice
    job.keys.push_back(keys[i]);
    job.host_block_ids.push_back(sources[i]);
    job.slots.push_back(prepared.key_blocks[i]);
  }
  s_.manager.pin_blocks(job.host_block_ids);
  tier.queued += static_cast<std::int64_t>(job.keys.size());
  JobState& state = s_.add_tier_job(job.id, JobKind::write, t);
  state.keys = job.keys;
  state.host_ids = job.host_block_ids;
  state.slots = job.slots;
  state.write_back = write_back;
  ++tier.stats.write_jobs;
  return true;
}

void TierCoordinator::queue_writes(std::span<const HostBlockId> host_ids,
                                   std::uint32_t nearer_than) {
  for (std::uint32_t t = 0; t < tiers_.size() && t < nearer_than; ++t) {
    TierState& tier = *tiers_[t];
    if (tier.config.write_back) continue;  // written when evicted instead
    std::vector<Key> keys;
    std::vector<HostBlockId> sources;
    for (const HostBlockId id : host_ids) {
      const Key* k = s_.manager.key_of(id);
      if (k == nullptr || s_.manager.peek(*k) != LookupResult::hit) continue;
      if (s_.manager.valid_from(id) > 0) {  // partly written: host memory only (SEMANTICS 6.8)
        ++tier.stats.writes_partial;
        continue;
      }
      if (skip_write(tier, *k, keys.size())) continue;
      keys.push_back(*k);
      sources.push_back(id);
    }
    if (!keys.empty()) (void)issue_write(t, keys, sources, false);
  }
}

void TierCoordinator::write_back() {
  for (std::uint32_t t = 0; t < tiers_.size(); ++t) {
    TierState& tier = *tiers_[t];
    if (!tier.config.write_back) continue;
    const std::int64_t free_blocks =
        s_.manager.capacity() - s_.manager.num_used() - s_.manager.num_held();
    const std::int64_t want = tier.free_target - free_blocks - tier.queued;
    if (want <= 0) continue;
    std::vector<HostBlockId> candidates, evict_now, sources;
    std::vector<Key> keys;
    s_.manager.eviction_candidates(static_cast<std::size_t>(want), candidates);
    for (const HostBlockId id : candidates) {
      const Key k = *s_.manager.key_of(id);
      // Partly written (never below host memory), already in the tier, or not admitted or no
      // queue room: evicted at once (a full cache would evict it at the next store anyway).
      const bool partial = s_.manager.valid_from(id) > 0;
      if (partial) ++tier.stats.writes_partial;
      if (partial || skip_write(tier, k, keys.size())) {
        evict_now.push_back(id);
        continue;
      }
      keys.push_back(k);
      sources.push_back(id);
    }
    if (!keys.empty() && !issue_write(t, keys, sources, true)) {
      evict_now.insert(evict_now.end(), sources.begin(), sources.end());
    }
    (void)s_.manager.evict_blocks(evict_now);
  }
}

void TierCoordinator::complete(JobState& job) {
  TierState& tier = *tiers_[job.tier];
  const auto n = static_cast<std::uint64_t>(job.keys.size());
  const std::vector<SlotId> slots(job.slots.begin(), job.slots.end());
  if (job.kind == JobKind::promote) {
    if (const auto clock = promotion_clock_.find(job.id);
        clock != promotion_clock_.end() && clock->second.overdue) {
      end_stall(job.tier, job.id);
    }
    promotion_clock_.erase(job.id);
    for (const HostBlockId h : job.host_ids) {
      if (const auto it = promoting_blocks_.find(h);
          it != promoting_blocks_.end() && it->second == job.id) {
        promoting_blocks_.erase(it);
      }
    }
    s_.manager.complete_store_blocks(job.host_ids, job.ok);
    tier.index.complete_load(job.keys);
    if (job.ok) {
      tier.stats.promotions += n;
      // Promoted blocks are written through to the tiers nearer than their own: a shared hit
      // also goes to the local disk, so the next host miss (or the next start) is served
      // nearer. Farther tiers got the block when it was first stored.
      queue_writes(job.host_ids, job.tier);
    } else {
      // The slots could not be read back (a bad checksum, a truncated file, an I/O error):
      // they are forgotten, so the next lookup misses instead of failing again.
      tier.stats.failed_promotions += n;
      tier.index.erase(job.keys);
      detail::logger().warn(
          "tier {} ({}): promotion job {} of {} block(s) failed; the keys are "
          "dropped from the tier",
          job.tier, to_string(tier.config.medium), job.id, n);
    }
  } else {
    tier.index.complete_store_blocks(slots, job.ok);
    s_.manager.unpin_blocks(job.host_ids);
    tier.queued -= static_cast<std::int64_t>(n);
    // Write-back: written, so evicted now (unless a load reads it meanwhile: then a later
    // eviction loses nothing). A failed write leaves the block in host memory.
    if (job.ok && job.write_back) (void)s_.manager.evict_blocks(job.host_ids);
    if (job.ok) {
      tier.stats.blocks_written += n;
    } else {
      tier.stats.failed_writes += n;
    }
  }
}

void TierCoordinator::check_presence(RequestState& r, const LookupPass& pass) {
  r.shared_check = RequestState::SharedCheck::in_flight;
  // Each key once (a scan's second pass may meet a key again), in scan order.
  std::vector<Key> keys;
  keys.reserve(pass.shared_unknown.size());
  for (const Key& k : pass.shared_unknown) {
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  }
  bool asked = false;
  for (std::uint32_t t = 0; t < tiers_.size(); ++t) {
    TierState& tier = *tiers_[t];
    if (tier.config.medium != Medium::shared) continue;
    const std::uint64_t ticket = next_ticket_++;
    tickets_[ticket] = PresenceTicket{r.id, t, keys};
    ++tier.stats.presence_checks;
    try {
      tier.presence->submit(ticket, s_.epoch, keys);
      asked = true;
    } catch (const std::exception& e) {
      // The engine's check failed to start: the keys are misses, nothing waits for it.
      tickets_.erase(ticket);
      ++tier.stats.presence_failures;
      detail::logger().warn("tier {} (shared): existence check for request {} failed to start: {}",
                            t, r.id, e.what());
    }
  }
  if (!asked) r.shared_check = RequestState::SharedCheck::done;
}

void TierCoordinator::poll_presence() {
  for (std::uint32_t t = 0; t < tiers_.size(); ++t) {
    TierState& tier = *tiers_[t];
    if (tier.config.medium != Medium::shared) continue;
    for (PresenceAnswer& a : tier.presence->poll()) {
      const auto it = tickets_.find(a.ticket);
      if (it == tickets_.end() || it->second.tier != t) continue;  // not ours (reset)
      PresenceTicket ticket = std::move(it->second);
      tickets_.erase(it);
      std::vector<Key> present;
      for (std::size_t i = 0; i < ticket.keys.size() && i < a.present.size(); ++i) {
        if (a.present[i]) present.push_back(ticket.keys[i]);
      }
      tier.stats.presence_hits += present.size();
      tier.stats.presence_misses += ticket.keys.size() - present.size();
      tier.stats.presence_errors += std::min(a.errors, ticket.keys.size() - present.size());
      // Known present from now on (until the index evicts them, or a read finds them gone).
      PreparedStore prepared;
      if (!present.empty() && tier.index.prepare_store(present, prepared, /*admit_all=*/true)) {
        tier.index.complete_store(prepared.keys_to_store, true);
      }
      // The request's last outstanding check done: its next lookup answers.
      const bool more = std::any_of(tickets_.begin(), tickets_.end(), [&](const auto& p) {
        return p.second.request_id == ticket.request_id;
      });
      if (RequestState* r = s_.requests.find(ticket.request_id); r != nullptr && !more) {
        r->shared_check = RequestState::SharedCheck::done;
      }
    }
  }
}

void TierCoordinator::adopt_orphan(const JobState& job) {
  // A job not yet emitted (queued for the next step) never reaches a worker: reset drops it.
  if (std::any_of(pending_jobs_.begin(), pending_jobs_.end(),
                  [&](const TierJob& p) { return p.id == job.id; })) {
    return;
  }
  OrphanJob& o = orphans_[job.id];
  o.tier = job.tier;
  o.remaining = job.remaining;
  const auto clock = promotion_clock_.find(job.id);
  o.stalled = clock != promotion_clock_.end() && clock->second.overdue;
  o.write = job.kind == JobKind::write;
  o.host_ids = job.host_ids;
  o.slots.assign(job.slots.begin(), job.slots.end());
  for (const HostBlockId h : o.host_ids) ++held_host_[h];
  held_slots_.resize(tiers_.size());
  for (const SlotId slot : o.slots) ++held_slots_[o.tier][slot];
}

std::vector<HostBlockId> TierCoordinator::reset() {
  // Tier jobs not yet emitted never run; planned promotions are forgotten.
  pending_jobs_.clear();
  planned_.clear();
  promoting_.clear();
  promotion_clock_.clear();
  promoting_blocks_.clear();
  // Answers to checks asked before are ignored (they are about the old cache); requests ask
  // again.
  tickets_.clear();
  s_.requests.for_each([](RequestState& r) { r.shared_check = RequestState::SharedCheck::none; });
  // What the jobs in flight use stays held, here and in the host cache, until they report;
  // their writes still fill the write queue, so a dead disk takes no more than it allows.
  std::vector<HostBlockId> held_host;
  held_host.reserve(held_host_.size());
  for (const auto& [h, n] : held_host_) held_host.push_back(h);
  held_slots_.resize(tiers_.size());
  std::vector<SlotId> slots;
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    slots.clear();
    for (const auto& [slot, n] : held_slots_[t]) slots.push_back(slot);
    tiers_[t]->index.reset(slots);
    tiers_[t]->queued = 0;
  }
  for (const auto& [id, o] : orphans_) {
    if (o.write) tiers_[o.tier]->queued += static_cast<std::int64_t>(o.host_ids.size());
  }
  if (!orphans_.empty()) {
    detail::logger().info(
        "reset_cache: {} tier job(s) still running keep their {} host block(s) and their "
        "slots until the workers report them; no step waits for them",
        orphans_.size(), held_host.size());
  }
  return held_host;
}

void TierCoordinator::end_stall(std::uint32_t t, JobId job) {
  TierState& tier = *tiers_[t];
  if (--tier.stalled_promotions > 0) return;
  detail::logger().info(
      "tier {} ({}): overdue promotion job {} reported; lookups ask the tier again", t,
      to_string(tier.config.medium), job);
}

std::int64_t TierCoordinator::orphan_remaining(JobId job) const {
  const auto it = orphans_.find(job);
  return it == orphans_.end() ? -1 : it->second.remaining;
}

void TierCoordinator::orphan_reported(const JobReport& report) {
  const auto it = orphans_.find(report.job);
  if (it == orphans_.end()) return;
  it->second.remaining -= report.count;
  if (it->second.remaining > 0) return;
  const OrphanJob done = std::move(it->second);
  orphans_.erase(it);
  if (done.stalled) end_stall(done.tier, report.job);
  TierState& tier = *tiers_[done.tier];
  if (done.write) tier.queued -= static_cast<std::int64_t>(done.host_ids.size());
  // A host block two orphans use (one block written to two tiers) waits for both.
  std::vector<HostBlockId> host;
  for (const HostBlockId h : done.host_ids) {
    const auto held = held_host_.find(h);
    if (held != held_host_.end() && --held->second == 0) {
      held_host_.erase(held);
      host.push_back(h);
    }
  }
  std::vector<SlotId> slots;
  auto& held_slots = held_slots_[done.tier];
  for (const SlotId slot : done.slots) {
    const auto held = held_slots.find(slot);
    if (held != held_slots.end() && --held->second == 0) {
      held_slots.erase(held);
      slots.push_back(slot);
    }
  }
  s_.manager.release_held(host);
  tier.index.release_held(slots);
}

TierState& TierCoordinator::tier(std::size_t t, std::string_view op) {
  KVOFFLOAD_EXPECTS(t < tiers_.size(), "{}: tier {} is not configured ({} tiers)", op, t,
                    tiers_.size());
  return *tiers_[t];
}

void TierCoordinator::take_events(std::vector<ManagerEvent>& out) {
  for (auto& tier : tiers_) {
    for (ManagerEvent& e : tier->index.take_events()) out.push_back(std::move(e));
  }
}

// ---- public API ----------------------------------------------------------------------------

namespace {

/// Tier t of the scheduler, or invalid_argument naming `op` (a scheduler without tiers has
/// none).
TierState& tier_of(const std::unique_ptr<TierCoordinator>& tiers, std::size_t t,
                   std::string_view op) {
  KVOFFLOAD_EXPECTS(tiers != nullptr, "{}: tier {} is not configured (0 tiers)", op, t);
  return tiers->tier(t, op);
}

}  // namespace

std::int64_t Scheduler::restore_tier(std::size_t tier, std::span<const std::optional<Key>> blocks) {
  return tier_of(impl_->tiers, tier, "restore_tier").index.restore(blocks);
}

TierStats Scheduler::tier_stats(std::size_t tier) const {
  const TierState& t = tier_of(impl_->tiers, tier, "tier_stats");
  TierStats s = t.stats;
  const HostBlockManager& m = t.index;
  s.blocks_total = m.capacity();
  s.blocks_used = m.num_used();
  s.blocks_writing = m.num_writing();
  s.blocks_being_read = m.num_being_read();
  s.hits = m.stats().hits;
  s.misses = m.stats().misses;
  s.evictions = m.stats().evictions;
  return s;
}

const HostBlockManager& Scheduler::tier_index(std::size_t tier) const {
  return tier_of(impl_->tiers, tier, "tier_index").index;
}

}  // namespace kvoffload
