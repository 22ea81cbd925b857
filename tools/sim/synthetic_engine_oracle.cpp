// The synthetic engine's oracle: every loaded byte against what was written, and the
// scheduler's invariants (SEMANTICS) after every step.
#include "synthetic_engine_impl.hpp"

namespace kvsim {

/// Which sub-blocks of each of a store's host blocks it writes: a window block stored with
/// leading null sub-blocks leaves them unwritten, and a GPU block that a load filled from
/// such a sub-block passes the gap on.
void SyntheticEngine::Impl::record_written(const TransferJob& job) {
  const std::int64_t f = config.block_size_factor;
  std::size_t key = 0, pos = 0;
  for (std::size_t g = 0; g < job.gpu.group_sizes.size(); ++g) {
    const std::size_t first_key = key;
    while (key < job.keys.size() && job.keys[key].group == g) {
      host_written[job.host_block_ids[key]].assign(static_cast<std::size_t>(f), false);
      ++key;
    }
    const std::int64_t skip = job.gpu.block_indices[g] % f;
    for (std::int64_t p = 0; p < job.gpu.group_sizes[g]; ++p, ++pos) {
      const HostBlockId host =
          job.host_block_ids[first_key + static_cast<std::size_t>((skip + p) / f)];
      host_written[host][static_cast<std::size_t>((skip + p) % f)] =
          gpu_unwritten.count(job.gpu.block_ids[pos]) == 0;
    }
  }
}

void SyntheticEngine::Impl::verify_load(const TransferJob& job) {
  const Request& r = requests.at(job.request_id);
  const std::int64_t f = config.block_size_factor;
  std::size_t at = 0, key = 0;
  for (std::size_t g = 0; g < config.groups.size(); ++g) {
    const std::size_t first_key = key;
    while (key < job.keys.size() && job.keys[key].group == g) ++key;
    const std::int64_t skip = job.gpu.block_indices[g] % f;
    for (std::int64_t p = 0; p < job.gpu.group_sizes[g]; ++p, ++at) {
      const std::int64_t block = job.gpu.block_indices[g] + p;
      const HostBlockId host =
          job.host_block_ids[first_key + static_cast<std::size_t>((skip + p) / f)];
      const auto written = host_written.find(host);
      if (written != host_written.end() &&
          !written->second[static_cast<std::size_t>((skip + p) % f)]) {
        // A sub-block no store wrote (SEMANTICS 6.8 forbids it, in every group kind): a
        // mismatch. The GPU block now holds that gap (a store of it passes it on).
        ++report.unwritten_reads;
        if (report.mismatches++ == 0) {
          report.first_mismatch = "step " + std::to_string(report.steps) + ", load job " +
                                  std::to_string(job.id) + " (" + r.id + "), group " +
                                  std::to_string(g) + ", GPU block index " + std::to_string(block) +
                                  ": a host sub-block no store wrote";
        }
        gpu_unwritten.insert(job.gpu.block_ids[at]);
        continue;
      }
      gpu_unwritten.erase(job.gpu.block_ids[at]);
      for (std::size_t k = 0; k < static_cast<std::size_t>(2 * config.layers); ++k) {
        if (!holds(page(g, k, job.gpu.block_ids[at]), config.page_bytes, seed_of(r, g, k, block))) {
          if (report.mismatches++ == 0) {
            report.first_mismatch = "step " + std::to_string(report.steps) + ", load job " +
                                    std::to_string(job.id) + " (" + r.id + "), group " +
                                    std::to_string(g) + ", GPU block index " +
                                    std::to_string(block) + ", tensor " + std::to_string(k);
          }
        }
      }
      ++report.blocks_verified;
    }
  }
}

void SyntheticEngine::Impl::violation(const std::string& what) {
  if (report.invariant_violations++ == 0) {
    report.first_violation = "step " + std::to_string(report.steps) + ": " + what;
  }
}

void SyntheticEngine::Impl::after_build(const StepResult& out,
                                        const std::vector<ManagerEvent>& events) {
  for (const TransferJob& job : out.load_jobs) {
    for (const Key& k : job.keys) {
      if (stored_ok.count(k) == 0) {
        violation("load job " + std::to_string(job.id) + " loads " + to_string(k) +
                  ", which no successful store put in the cache (or which was evicted)");
      }
    }
  }
  for (const ManagerEvent& e : events) {
    if (!e.removed) continue;  // "stored" comes from the scheduler: the truth is the worker's
    if (e.medium == Medium::shared) continue;  // the cluster's contents are not shadowed
    auto& shadow = e.medium == Medium::host ? stored_ok : disk_ok;
    for (const Key& k : e.keys) {
      if (shadow.erase(k) == 0) {
        violation("evicted " + to_string(k) + " from " + std::string(to_string(e.medium)) +
                  ", which was not ready there");
      }
    }
  }
}

/// The worker's view: a successful store puts its keys in the shadow cache; a failed load
/// must come back from the scheduler as failed.
void SyntheticEngine::Impl::transfer_finished(const FinishedTransfer& t) {
  if (is_tier_job(t.kind)) {
    auto it = tier_keys.find(t.job);
    if (it == tier_keys.end()) {
      return violation("tier job " + std::to_string(t.job) + " finished twice");
    }
    // A promotion puts its keys in host memory; a write puts them on disk.
    const bool shared_write = shared_writes.erase(t.job) > 0;
    const bool stale = stale_tier_jobs.erase(t.job) > 0;  // issued before a reset_cache
    if (t.ok && !shared_write && !stale) {
      auto& shadow = t.kind == JobKind::promote ? stored_ok : disk_ok;
      shadow.insert(it->second.begin(), it->second.end());
    }
    tier_keys.erase(it);
    return;
  }
  if (t.kind == JobKind::store) {
    auto it = store_keys.find(t.job);
    if (it == store_keys.end())
      return violation("store job " + std::to_string(t.job) + " finished twice");
    if (t.ok) {
      stored_ok.insert(it->second.begin(), it->second.end());
    } else {
      ++report.failed_stores;
    }
    store_keys.erase(it);
  } else if (!t.ok) {
    failed_loads.insert(t.job);
  }
}

void SyntheticEngine::Impl::completed(const CompletedJob& c) {
  if (c.kind != JobKind::load) return;
  const bool failed = failed_loads.erase(c.job) > 0;
  if (failed != !c.ok) {
    violation("load job " + std::to_string(c.job) + " was reported " +
              (c.ok ? "ok although its transfer failed" : "failed although it succeeded"));
  }
  if (!c.ok) ++report.failed_loads_reported;
}

/// The host cache's ready keys are exactly the shadow cache.
void SyntheticEngine::Impl::check_cache() {
  ++report.invariant_checks;
  // Write-through evicts from the tier when reports complete stores, after this step's
  // events were taken: account for those evictions before comparing.
  if (!config.disk_dir.empty()) after_build(StepResult{}, take_events());
  const HostBlockManager& m = scheduler->manager();
  std::size_t ready = 0;
  for (HostBlockId id = 0; id < m.capacity(); ++id) {
    const Key* k = m.key_of(id);
    if (k == nullptr || m.peek(*k) != LookupResult::hit) continue;
    ++ready;
    if (stored_ok.count(*k) == 0) {
      violation("host block " + std::to_string(id) + " serves " + to_string(*k) +
                " as a hit, but no successful store of it is known (or it was evicted)");
    }
  }
  if (ready != stored_ok.size()) {
    violation(std::to_string(stored_ok.size()) +
              " keys were stored successfully and not evicted, " + "but the cache has " +
              std::to_string(ready) + " ready blocks");
  }
  if (!config.disk_dir.empty()) {
    // The disk tier's ready slots are exactly the keys written (or found at start) and not
    // evicted or dropped since.
    const HostBlockManager& d = scheduler->tier_index(0);
    std::size_t on_disk = 0;
    for (HostBlockId id = 0; id < d.capacity(); ++id) {
      const Key* k = d.key_of(id);
      if (k == nullptr || d.peek(*k) != LookupResult::hit) continue;
      ++on_disk;
      if (disk_ok.count(*k) == 0) {
        violation("disk slot " + std::to_string(id) + " serves " + to_string(*k) +
                  " as a hit, but no successful write of it is known");
      }
    }
    if (on_disk != disk_ok.size()) {
      violation(std::to_string(disk_ok.size()) +
                " keys are on disk by the worker's account, "
                "but the tier index has " +
                std::to_string(on_disk) + " ready slots");
    }
  }
  report.stores_without_room = scheduler->cache_stats().stores_without_room;
  if (faulty != nullptr) {
    const FaultyBackend::Counts fc = faulty->counts();
    report.injected_failures = fc.failed;
    report.delayed_results = fc.delayed;
  }
}

}  // namespace kvsim
