// The synthetic engine's step: schedule, build, copy, report, as an engine's loop does.
#include "synthetic_engine_impl.hpp"

namespace kvsim {

void SyntheticEngine::Impl::submit_tier_jobs(const StepResult& out) {
  for (const TierJob& job : out.tier_jobs) {
    // Which sub-blocks hold written data travels with the bytes (record_written).
    for (std::size_t i = 0; i < job.keys.size(); ++i) {
      if (job.kind == JobKind::write) {
        auto it = host_written.find(job.host_block_ids[i]);
        if (it != host_written.end()) disk_written[job.keys[i]] = it->second;
      } else if (auto it = disk_written.find(job.keys[i]); it != disk_written.end()) {
        host_written[job.host_block_ids[i]] = it->second;
      } else {
        host_written.erase(job.host_block_ids[i]);  // from an earlier run: all written
      }
    }
    engine->submit_tier(job);
    submitted.insert(job.id);
    if (config.check_invariants) tier_keys.emplace(job.id, job.keys);
    if (config.check_invariants && !config.shared_nodes.empty() && job.tier == shared_tier &&
        job.kind == JobKind::write) {
      shared_writes.insert(job.id);
    }
  }
}

/// Finished transfers go back to the scheduler (successful loads verified first), with
/// every worker's report at once or (staggered_reports) one or two of them a step; returns
/// the jobs that completed.
std::vector<CompletedJob> SyntheticEngine::Impl::report_finished(bool all_owed) {
  std::vector<JobReport> reports;
  for (const FinishedTransfer& t : engine->get_finished()) {
    submitted.erase(t.job);
    stores_running.erase(t.job);
    if (config.check_invariants) transfer_finished(t);
    if (t.kind == JobKind::load) {
      auto it = load_jobs.find(t.job);
      if (it != load_jobs.end()) {
        if (t.ok && config.verify) verify_load(it->second);
        load_jobs.erase(it);
      }
    }
    owed[t.job] = {config.num_workers, t.ok};
  }
  for (auto it = owed.begin(); it != owed.end();) {
    OwedReports& o = it->second;
    if (!all_owed && config.staggered_reports && chance(0.5)) {
      ++it;
      continue;
    }
    const std::int64_t count = all_owed || !config.staggered_reports
                                   ? o.count
                                   : std::min<std::int64_t>(o.count, rand(1, 2));
    const bool ok = o.ok && !chance(config.report_failure_probability);
    reports.push_back({it->first, count, ok});
    o.count -= count;
    it = o.count == 0 ? owed.erase(it) : std::next(it);
  }
  std::vector<CompletedJob> done = scheduler->on_completed(reports);
  if (!config.disk_dir.empty()) {
    const TierStats ts = scheduler->tier_stats(0);
    report.disk_promotions = ts.promotions;
    report.disk_failed_promotions = ts.failed_promotions;
    report.disk_blocks_written = ts.blocks_written;
    report.disk_failed_writes = ts.failed_writes;
    report.disk_evictions = ts.evictions;
  }
  if (!config.shared_nodes.empty()) {
    const TierStats ts = scheduler->tier_stats(shared_tier);
    report.shared_checks = ts.presence_checks;
    report.shared_found = ts.presence_hits;
    report.shared_promotions = ts.promotions;
    report.shared_failed_promotions = ts.failed_promotions;
    report.shared_blocks_written = ts.blocks_written;
    report.shared_failed_writes = ts.failed_writes;
    const SharedTierStats ws = engine->shared_tier(shared_tier).shared_stats();
    report.shared_bad_values = ws.bad_values;
    report.shared_read_errors = ws.read_errors;
  }
  for (const CompletedJob& c : done) {
    if (auto it = jobs_of.find(c.request_id); it != jobs_of.end() && --it->second == 0) {
      jobs_of.erase(it);
    }
  }
  if (config.check_invariants) {
    for (const CompletedJob& c : done) completed(c);
  }
  return done;
}

void SyntheticEngine::Impl::drain() {
  // No new work: emit the planned loads, start deferred stores, then wait for everything
  // and report it, until the scheduler has nothing in flight.
  for (int round = 0; round < 100000 && scheduler->num_jobs_in_flight() > 0; ++round) {
    const StepResult out = scheduler->build_step({});
    if (config.check_invariants) after_build(out, take_events());
    for (const TransferJob& job : out.load_jobs) {
      engine->submit(job);
      submitted.insert(job.id);
      load_jobs.emplace(job.id, job);
    }
    submit_tier_jobs(out);
    engine->start_step();
    engine->wait(std::vector<JobId>(submitted.begin(), submitted.end()));
    (void)report_finished(/*all_owed=*/true);
  }
  const HostBlockManager& m = scheduler->manager();
  if (scheduler->num_jobs_in_flight() != 0) violation("jobs still in flight after draining");
  if (m.num_writing() != 0) violation(std::to_string(m.num_writing()) + " blocks left writing");
  if (m.num_being_read() != 0)
    violation(std::to_string(m.num_being_read()) + " blocks left being read");
  for (HostBlockId id = 0; id < m.capacity(); ++id) {
    if (m.readers(id) != 0) violation("host block " + std::to_string(id) + " has readers left");
  }
  if (!failed_loads.empty())
    violation(std::to_string(failed_loads.size()) + " failed loads never reported");
  check_cache();
  report.drained = true;
}

void SyntheticEngine::Impl::step() {
  engine->start_step();
  // Arrivals, with a bounded backlog: an open queue that grows forever would be the
  // simulated engine's leak, not the library's (the soak run measures memory).
  if ((chance(0.3) || running.empty()) &&
      static_cast<int>(waiting.size()) < 2 * config.max_running) {
    admit();
  }
  std::size_t started = 0;
  for (std::size_t n = waiting.size();
       n > 0 && static_cast<int>(running.size() + loading.size() + started) < config.max_running;
       --n) {
    const std::string id = waiting.front();
    waiting.pop_front();
    Request& r = requests.at(id);
    if (try_start(r)) {
      running.push_back(id);
      ++started;
    } else if (r.phase == Phase::waiting) {
      waiting.push_back(id);
    } else {
      loading.insert(id);
    }
  }
  std::vector<std::string> preempted;
  if (!running.empty() && chance(config.preempt_probability)) {
    const auto i = static_cast<std::size_t>(rand(0, static_cast<std::int64_t>(running.size()) - 1));
    preempted.push_back(running[i]);
    running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
    ++report.preemptions;
  }

  // A real engine's idle step still takes time; the shared tier's existence checks answer
  // asynchronously, so a run whose every request waits on one must let time pass, or a
  // loaded machine ends the run before the first answer (a two-process test saw 1500 steps
  // in 0.1 s with every lookup still "retry later").
  if (!config.shared_nodes.empty() && running.empty() && loading.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  std::vector<ScheduledRequest> entries;
  std::vector<std::int64_t> accepted;  // per entry: the decode step's accepted draft tokens
  const auto& layouts = scheduler->layouts();
  // vLLM frees window blocks (and retired mamba states) of running requests before it
  // allocates: the ids go to whoever allocates next, in this step (issue 54 (c)).
  if (config.vllm_tables) {
    for (const std::string& id : running) free_skipped(requests.at(id));
  }
  for (const std::string& id : running) {
    Request& r = requests.at(id);
    const std::int64_t left = r.prompt - r.computed;
    // A decode step: the sampled token and, under speculative decoding, 0-3 drafts, of which
    // the forward pass accepts some (never past the request's end).
    const std::int64_t drafts = left <= 0 && config.spec_decode ? rand(0, 3) : 0;
    std::int64_t nst = left > 0 ? std::min(left, rand(1, 2 * max_obs)) : 1 + drafts;
    // Align mode: a prefill chunk that is not the prompt's last ends at a block boundary.
    if (config.final_states && left > nst && (r.computed + nst) / gbs_lcm * gbs_lcm > r.computed) {
      nst = (r.computed + nst) / gbs_lcm * gbs_lcm - r.computed;
    }
    accepted.push_back(
        std::min(rand(0, drafts), std::max<std::int64_t>(0, r.max_len - r.computed - 1)));
    ScheduledRequest e;
    e.request_id = id;
    e.num_computed_tokens = r.computed;
    e.num_scheduled_tokens = nst;
    e.resumed = r.resumed;
    for (std::size_t g = 0; g < layouts.size(); ++g) {
      const std::int64_t gbs = layouts[g].gpu_block_size;
      const auto need = static_cast<std::size_t>((r.computed + nst + gbs - 1) / gbs);
      // vLLM's align-mode mamba: the state lands in the step's last block; the positions it
      // passes over are null pads (a table like [0, 0, hit, 0, state]).
      const bool pads = config.mamba_pads && layouts[g].kind == GroupKind::mamba;
      while (r.table[g].size() < need) {
        r.table[g].push_back(pads && r.table[g].size() + 1 < need ? null_block : alloc_block());
      }
      e.new_block_ids.emplace_back(r.table[g].begin() + static_cast<std::ptrdiff_t>(r.sent[g]),
                                   r.table[g].end());
      r.sent[g] = r.table[g].size();
    }
    r.resumed = false;
    entries.push_back(std::move(e));
  }

  // reset_cache now and then: the cache empties without per-key events (the engine that
  // resets knows), every transfer in flight is flushed, and their reports become stale.
  std::vector<ManagerEvent> events_before;
  const bool reset = chance(config.reset_probability);
  if (reset) {
    events_before = take_events();
    if (config.check_invariants) after_build(StepResult{}, events_before);
    // New weights each time (what a reset means with tiers; harmless without).
    scheduler->reset_cache("synthetic weights " + std::to_string(report.resets + 1));
    stored_ok.clear();
    disk_ok.clear();
    for (const auto& [id, keys] : tier_keys) stale_tier_jobs.insert(id);
    jobs_of.clear();  // every job is stale now
    ++report.resets;
  }
  const StepResult out = scheduler->build_step(entries, preempted);
  const std::vector<ManagerEvent> events =
      config.check_invariants || config.observer ? take_events() : std::vector<ManagerEvent>{};
  if (config.check_invariants) after_build(out, events);
  if (config.observer) {
    const std::unordered_set<GpuBlockId> written = blocks_written(entries, out);
    config.observer(StepObservation{*scheduler, entries, out, events_before, events, reset, written,
                                    stores_running});
  }
  engine->wait(out.flush);  // the fence: stores still reading reused blocks finish first
  // Their copies are done (a FaultyBackend may still hold their results back a few polls).
  for (const JobId id : out.flush) stores_running.erase(id);
  if (reset) {
    // Transfers from before the reset have all run (flushed): verify and report them (the
    // scheduler ignores their stale reports; a tier job still running reports when it ends,
    // its blocks held meanwhile); requests waiting for a load start over.
    (void)report_finished(/*all_owed=*/true);
    // A load whose result a FaultyBackend still holds back is not verified: its request
    // starts over now and its blocks go to others.
    for (auto it = load_jobs.begin(); it != load_jobs.end();) {
      it = loading.count(it->second.request_id) != 0 ? load_jobs.erase(it) : std::next(it);
    }
    for (const std::string& id : std::vector<std::string>(loading.begin(), loading.end())) {
      restart(requests.at(id));
    }
    loading.clear();
  }
  for (const std::string& id : preempted) restart(requests.at(id));
  // Local prefix-cache blocks get their data once the stores that still read them ran.
  for (const ScheduledRequest& e : entries) {
    Request& r = requests.at(e.request_id);
    for (const auto& [g, k, id] : r.local_data) {
      gpu_unwritten.erase(id);
      for (std::size_t t = 0; t < static_cast<std::size_t>(2 * config.layers); ++t) {
        fill(page(g, t, id), config.page_bytes, seed_of(r, g, t, k));
      }
    }
    r.local_data.clear();
  }
  for (const TransferJob& job : out.load_jobs) {
    engine->submit(job);
    submitted.insert(job.id);
    load_jobs.emplace(job.id, job);
    ++jobs_of[job.request_id];
    ++report.load_jobs;
  }
  submit_tier_jobs(out);
  // The forward pass writes the scheduled tokens' blocks.
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const ScheduledRequest& e = entries[i];
    Request& r = requests.at(e.request_id);
    const std::int64_t end = e.num_computed_tokens + e.num_scheduled_tokens;
    // What the step computed for good: a decode step keeps its sampled token and the drafts
    // it accepted; the KV of rejected drafts is garbage until rewritten.
    const bool decode = e.num_computed_tokens >= r.prompt;
    const std::int64_t valid = decode ? e.num_computed_tokens + 1 + accepted[i] : end;
    for (std::size_t g = 0; g < layouts.size(); ++g) {
      const bool decode_state = decode && config.spec_decode && layouts[g].kind == GroupKind::mamba;
      const std::int64_t gbs = layouts[g].gpu_block_size;
      for (std::int64_t k = e.num_computed_tokens / gbs; k < (end + gbs - 1) / gbs; ++k) {
        const GpuBlockId id = r.table[g][static_cast<std::size_t>(k)];
        if (id == null_block) continue;  // a mamba pad
        gpu_unwritten.erase(id);
        for (std::size_t t = 0; t < static_cast<std::size_t>(2 * config.layers); ++t) {
          std::uint64_t seed = (k + 1) * gbs <= valid
                                   ? seed_of(r, g, t, k)
                                   : mix(r.uid * 1000003 + static_cast<std::uint64_t>(k));
          // A decode-time mamba state: not the one a prefill of the same tokens computes.
          if (decode_state) seed = mix(seed ^ 0xdec0de5747e00000ull);
          fill(page(g, t, id), config.page_bytes, seed);
        }
      }
    }
    r.computed = valid;
    if (r.computed >= r.prompt) r.num_tokens = std::min(r.computed + 1, r.max_len + 1);
  }
  for (const TransferJob& job : out.store_jobs) {
    record_written(job);
    engine->submit(job);
    submitted.insert(job.id);
    stores_running.emplace(job.id, job.gpu.block_ids);
    ++jobs_of[job.request_id];
    ++report.store_jobs;
    if (config.check_invariants) store_keys.emplace(job.id, job.keys);
  }

  // Lockstep: this step's jobs (and any still running) finish before the step reports.
  if (config.lockstep) engine->wait(std::vector<JobId>(submitted.begin(), submitted.end()));
  for (const CompletedJob& c : report_finished()) {
    if (c.kind != JobKind::load) continue;
    auto found = requests.find(c.request_id);
    if (found == requests.end() || found->second.phase != Phase::loading) continue;
    Request& r = found->second;
    loading.erase(r.id);
    if (c.ok) {
      r.phase = Phase::running;
      r.computed = r.cached;
      running.push_back(r.id);
    } else {
      restart(r);
    }
  }

  for (auto it = running.begin(); it != running.end();) {
    Request& r = requests.at(*it);
    if (r.computed >= r.max_len) {
      scheduler->on_finished(r.id);
      free_blocks(r);
      r.phase = Phase::done;
      requests.erase(*it);
      ++report.requests_finished;
      it = running.erase(it);
    } else {
      send_hashes(r);
      ++it;
    }
  }
  ++report.steps;
  if (config.check_invariants) check_cache();
  const TransferStats ts = engine->stats();
  report.bytes_stored = ts.bytes_stored;
  report.bytes_loaded = ts.bytes_loaded;
  report.evictions = scheduler->cache_stats().evictions;
  report.partial_stores = scheduler->cache_stats().partial_stores;
  report.partial_misses = scheduler->cache_stats().partial_misses;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace kvsim
