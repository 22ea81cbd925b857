#include "kvoffload/detail/flat_hash_map.hpp"
#include "synthetic_engine.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "kvoffload/error.hpp"
#include "kvoffload/host_backend.hpp"
#include "kvoffload/scheduler.hpp"
#include "kvoffload/testing/faulty_backend.hpp"
#include "kvoffload/tiers/shared_presence.hpp"
#include "kvoffload/worker.hpp"

namespace kvsim {

using namespace kvoffload;

namespace {

// The same finalizer the library's hash tables use.
std::uint64_t mix(std::uint64_t x) {
  return kvoffload::detail::mix64(x);
}

std::uint64_t fingerprint(const BlockHash& h) {
  std::uint64_t x = 0;
  std::memcpy(&x, h.data(), std::min<std::size_t>(8, h.size()));
  return x;
}

/// Page content: 8-byte words of mix(seed + i).
void fill(std::uint8_t* p, std::int64_t bytes, std::uint64_t seed) {
  for (std::int64_t i = 0; i + 8 <= bytes; i += 8) {
    const std::uint64_t w = mix(seed + static_cast<std::uint64_t>(i));
    std::memcpy(p + i, &w, 8);
  }
}

bool holds(const std::uint8_t* p, std::int64_t bytes, std::uint64_t seed) {
  for (std::int64_t i = 0; i + 8 <= bytes; i += 8) {
    const std::uint64_t w = mix(seed + static_cast<std::uint64_t>(i));
    if (std::memcmp(p + i, &w, 8) != 0) return false;
  }
  return true;
}

enum class Phase { waiting, loading, running, done };

struct Request {
  std::string id;
  std::uint64_t uid = 0;
  std::vector<BlockHash> hashes;  // for the whole final length
  std::int64_t prompt = 0, max_len = 0, num_tokens = 0, computed = 0, cached = 0;
  std::size_t hashes_sent = 0;
  bool registered = false;
  bool resumed = false;
  Phase phase = Phase::waiting;
  std::vector<std::vector<GpuBlockId>> table;
  std::vector<std::size_t> sent;
  /// Blocks of a GPU prefix-cache hit (group, block index, id): they get their data when the
  /// request is first scheduled, after that step's flushed stores ran (the id may be reused).
  std::vector<std::tuple<std::size_t, std::int64_t, GpuBlockId>> local_data;
};

/// Reports still owed for a finished transfer (staggered_reports).
struct OwedReports {
  std::int64_t count = 0;
  bool ok = true;
};

}  // namespace

struct SyntheticEngine::Impl {
  explicit Impl(const SimConfig& c) : config(c), rng(c.seed) {
    if (c.check_invariants && (c.reset_probability > 0 || c.report_failure_probability > 0)) {
      // The shadow cache follows the copies; a reset or a worker's failed report would make
      // the scheduler's (correct) view differ from it.
      throw kvoffload::invalid_argument(
          "synthetic engine: check_invariants excludes reset_probability and "
          "report_failure_probability");
    }
    SchedulerConfig sc;
    sc.groups = c.groups;
    sc.block_size_factor = c.block_size_factor;
    sc.hash_block_size = c.hash_block_size;
    sc.num_workers = c.num_workers;
    sc.prefix_caching = c.prefix_caching;
    sc.manager.host_blocks = c.host_blocks;
    sc.manager.policy = parse_eviction_policy(c.policy, "policy");
    sc.manager.store_threshold = c.store_threshold;
    // Events accumulate until take_events(); only the invariant checks and the observer read
    // them.
    sc.manager.enable_events = c.check_invariants || static_cast<bool>(c.observer);
    const auto G = c.groups.size();
    // Per group, per layer, K and V: separate tensors in "GPU" memory (host RAM here).
    WorkerConfig wc;
    wc.groups.resize(G);
    for (std::size_t g = 0; g < G; ++g) {
      for (int t = 0; t < 2 * c.layers; ++t) {
        gpu.emplace_back(static_cast<std::size_t>(c.gpu_blocks * c.page_bytes));
        wc.tensors.push_back({reinterpret_cast<std::uintptr_t>(gpu.back().data()), c.gpu_blocks,
                              c.page_bytes, c.page_bytes});
        wc.groups[g].push_back({static_cast<std::int32_t>(wc.tensors.size() - 1), c.page_bytes});
      }
    }
    wc.block_size_factor = c.block_size_factor;
    wc.host_blocks = c.host_blocks;
    wc.defer_stores = c.defer_stores;
    HostBackendConfig bc;
    bc.threads = c.copy_threads;
    std::unique_ptr<Backend> backend = std::make_unique<HostBackend>(bc);
    if (c.faulty) {
      auto faulty_backend = std::make_unique<FaultyBackend>(std::move(backend), c.faults);
      faulty = faulty_backend.get();
      backend = std::move(faulty_backend);
    }
    if (!c.disk_dir.empty()) {
      DiskTierConfig dc;
      dc.path = c.disk_dir;
      dc.capacity_bytes = c.disk_capacity;
      dc.model = "kvoffload-demo synthetic";
      dc.dtype = "uint8";
      wc.disk_tiers.push_back(dc);
    }
    SharedTierConfig shared;
    shared.nodes = c.shared_nodes;
    shared.name = c.shared_name;
    shared.reply_timeout_ms = c.shared_reply_timeout_ms;
    if (!c.shared_nodes.empty()) wc.shared_tiers.push_back(shared);
    engine = std::make_unique<Worker>(wc, std::move(backend));
    if (!c.disk_dir.empty()) {
      TierConfig tier;
      tier.medium = Medium::disk;
      tier.blocks = engine->tier(0).num_slots();
      tier.store_threshold = c.disk_store_threshold;
      tier.write_back = c.disk_write_back;
      sc.tiers.push_back(tier);
    }
    if (!c.shared_nodes.empty()) {
      shared_tier = sc.tiers.size();
      TierConfig tier;
      tier.medium = Medium::shared;
      tier.blocks = 1 << 20;  // keys remembered as present
      tier.store_threshold = c.shared_store_threshold;
      tier.presence = make_cluster_presence(shared, sc.block_size_factor);
      sc.tiers.push_back(tier);
    }
    scheduler = std::make_unique<Scheduler>(sc);
    if (!c.disk_dir.empty()) {
      report.disk_slots = engine->tier(0).num_slots();
      report.disk_restored = scheduler->restore_tier(0, engine->tier(0).scanned());
      if (c.check_invariants) {
        for (const auto& k : engine->tier(0).scanned()) {
          if (k) disk_ok.insert(*k);
        }
      }
    }
    for (GpuBlockId id = static_cast<GpuBlockId>(c.gpu_blocks - 1); id >= 1; --id) {
      free_ids.push_back(id);
    }
    for (int f = 0; f < c.prefix_families; ++f) families.push_back(random_hashes(64));
    max_obs = 0;
    for (const GroupLayout& l : scheduler->layouts()) {
      max_obs = std::max(max_obs, l.offloaded_block_size);
      gbs_lcm = std::lcm(gbs_lcm, l.gpu_block_size);
    }
    start = std::chrono::steady_clock::now();
  }

  std::int64_t rand(std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }

  std::vector<BlockHash> random_hashes(std::size_t n) {
    std::vector<BlockHash> out;
    for (std::size_t i = 0; i < n; ++i) {
      std::uint8_t bytes[16];
      const std::uint64_t a = rng(), b = rng();
      std::memcpy(bytes, &a, 8);
      std::memcpy(bytes + 8, &b, 8);
      out.push_back(BlockHash::from_bytes(bytes));
    }
    return out;
  }

  /// Chains block hashes as engines do (each one covers its predecessors), so a key names
  /// the whole prefix before it: the same key means the same content, also across runs whose
  /// random draws diverged (a disk tier keeps blocks from an earlier run).
  static void chain(std::vector<BlockHash>& hashes) {
    std::uint64_t a = 0, b = 0;
    for (BlockHash& h : hashes) {
      std::uint64_t ra = 0, rb = 0;
      std::memcpy(&ra, h.data(), 8);
      std::memcpy(&rb, h.data() + 8, 8);
      a = mix(a ^ ra);
      b = mix(b ^ rb ^ a);
      std::uint8_t bytes[16];
      std::memcpy(bytes, &a, 8);
      std::memcpy(bytes + 8, &b, 8);
      h = BlockHash::from_bytes(bytes);
    }
  }

  /// The content seed of tensor k of group g's GPU block `k_block` of request r once complete:
  /// it depends only on the tokens (the chain hash), so equal prefixes give equal pages.
  std::uint64_t seed_of(const Request& r, std::size_t g, std::size_t k, std::int64_t block) const {
    const std::int64_t gbs = config.groups[g].gpu_block_size;
    const auto idx = static_cast<std::size_t>((block + 1) * gbs / config.hash_block_size - 1);
    return mix(fingerprint(r.hashes[idx]) ^ ((g + 1) << 40) ^ ((k + 1) << 48));
  }

  std::uint8_t* page(std::size_t g, std::size_t k, GpuBlockId id) {
    const std::size_t t = g * static_cast<std::size_t>(2 * config.layers) + k;
    return gpu[t].data() +
           static_cast<std::size_t>(id) * static_cast<std::size_t>(config.page_bytes);
  }

  GpuBlockId alloc_block() {
    if (free_ids.empty()) throw std::runtime_error("synthetic engine: out of GPU blocks");
    const GpuBlockId id = free_ids.back();
    free_ids.pop_back();
    return id;
  }

  void free_blocks(Request& r) {
    for (auto& t : r.table) {
      for (const GpuBlockId id : t) {
        if (id != null_block) free_ids.push_back(id);
      }
      t.clear();
    }
  }

  void admit() {
    Request r;
    r.id = "req" + std::to_string(next_request++);
    r.uid = static_cast<std::uint64_t>(next_request);
    r.prompt = rand(1, 6) * max_obs + rand(0, max_obs);
    r.max_len = r.prompt + rand(1, 2 * max_obs);
    r.num_tokens = r.prompt;
    const auto n = static_cast<std::size_t>(r.max_len / config.hash_block_size + 1);
    const auto& family = families[static_cast<std::size_t>(rand(0, config.prefix_families - 1))];
    const auto shared = std::min<std::size_t>(
        family.size(), static_cast<std::size_t>(rand(0, static_cast<std::int64_t>(n))));
    r.hashes.assign(family.begin(), family.begin() + static_cast<std::ptrdiff_t>(shared));
    const auto own = random_hashes(n - shared);
    r.hashes.insert(r.hashes.end(), own.begin(), own.end());
    chain(r.hashes);
    r.table.resize(config.groups.size());
    r.sent.assign(config.groups.size(), 0);
    waiting.push_back(r.id);
    requests.emplace(r.id, std::move(r));
  }

  void send_hashes(Request& r) {
    const auto want = static_cast<std::size_t>(r.num_tokens / config.hash_block_size);
    if (!r.registered) {
      scheduler->update_request(r.id, r.num_tokens, std::span(r.hashes).first(want));
      r.registered = true;
    } else {
      scheduler->extend_request(r.id, r.num_tokens,
                                std::span(r.hashes).subspan(r.hashes_sent, want - r.hashes_sent));
    }
    r.hashes_sent = want;
  }

  /// Lookup and allocation; true if the request computes this step. Now and then the request
  /// starts from a prefix in the GPU prefix cache (num_computed_tokens > 0).
  bool try_start(Request& r) {
    // SEMANTICS 8b: no load while the request still has jobs in flight (a preempted request's
    // stores whose reports are still owed): it waits.
    if (const auto it = jobs_of.find(r.id); it != jobs_of.end() && it->second > 0) return false;
    if (!r.registered) send_hashes(r);
    std::int64_t nct = 0;
    if (chance(config.local_hit_probability)) nct = rand(0, r.prompt / gbs_lcm) * gbs_lcm;
    nct = std::min(nct, r.num_tokens - 1);
    nct -= nct % gbs_lcm;
    const auto hit = scheduler->lookup(r.id, nct);
    if (!hit) return false;
    const std::int64_t h = *hit;
    if (h > 0) ++report.lookup_hits;
    if (nct > 0) ++report.local_hits;
    const std::int64_t cached = nct + h;
    std::vector<AllocatedGroup> groups(config.groups.size());
    const auto& layouts = scheduler->layouts();
    r.local_data.clear();
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const GroupLayout& L = layouts[g];
      const std::int64_t n_gpu = (cached + L.gpu_block_size - 1) / L.gpu_block_size;
      // Like vLLM, window groups hold only the blocks the next token reads: those wholly
      // before the window (mamba: before its last state) are null, with or without a load.
      // A local GPU hit not aligned to the host block thus leaves a host block's leading
      // sub-blocks null when it is stored (SEMANTICS 6.8).
      std::int64_t local = nct / L.gpu_block_size;
      std::int64_t null_below = 0;
      if (L.windowed()) {
        const std::int64_t back =
            L.kind == GroupKind::sliding_window ? config.groups[g].sliding_window - 1 : 1;
        null_below = std::min(std::max<std::int64_t>(0, cached - back) / L.gpu_block_size, n_gpu);
        local = std::max(local, null_below);
        // SEMANTICS 5: a window group loads at most window_blocks host blocks' worth.
        if (h > 0) local = std::max(local, n_gpu - L.window_blocks * config.block_size_factor);
        local = std::min(local, n_gpu);
        null_below = h > 0 ? local : null_below;
      }
      r.table[g].clear();
      for (std::int64_t k = 0; k < n_gpu; ++k) {
        const bool null = k < null_below;
        r.table[g].push_back(null ? null_block : alloc_block());
        if (!null && k < nct / L.gpu_block_size) r.local_data.emplace_back(g, k, r.table[g].back());
      }
      groups[g].block_ids = r.table[g];
      groups[g].num_computed_blocks = h > 0 ? local : 0;
    }
    scheduler->on_allocated(r.id, groups, h);
    r.sent.assign(groups.size(), 0);
    r.computed = nct;
    if (h > 0) {
      r.phase = Phase::loading;
      r.cached = cached;
      return false;
    }
    r.phase = Phase::running;
    return true;
  }

  void restart(Request& r) {
    r.prompt = std::max(r.prompt, r.num_tokens - 1);  // recompute everything known
    free_blocks(r);
    r.local_data.clear();
    r.phase = Phase::waiting;
    r.computed = 0;
    r.resumed = true;
    waiting.push_back(r.id);
  }

  /// Which sub-blocks of each of a store's host blocks it writes: a window block stored with
  /// leading null sub-blocks leaves them unwritten, and a GPU block that a load filled from
  /// such a sub-block passes the gap on.
  void record_written(const TransferJob& job) {
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

  void verify_load(const TransferJob& job) {
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
                                    std::to_string(g) + ", GPU block index " +
                                    std::to_string(block) + ": a host sub-block no store wrote";
          }
          gpu_unwritten.insert(job.gpu.block_ids[at]);
          continue;
        }
        gpu_unwritten.erase(job.gpu.block_ids[at]);
        for (std::size_t k = 0; k < static_cast<std::size_t>(2 * config.layers); ++k) {
          if (!holds(page(g, k, job.gpu.block_ids[at]), config.page_bytes,
                     seed_of(r, g, k, block))) {
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

  void violation(const std::string& what) {
    if (report.invariant_violations++ == 0) {
      report.first_violation = "step " + std::to_string(report.steps) + ": " + what;
    }
  }

  /// Loads planned by this step load only keys whose store succeeded and that were not
  /// evicted since; then this step's evictions leave the shadow cache.
  std::vector<ManagerEvent> take_events() { return scheduler->take_events(); }

  void after_build(const StepResult& out, const std::vector<ManagerEvent>& events) {
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
  void transfer_finished(const FinishedTransfer& t) {
    if (t.tier) {
      auto it = tier_keys.find(t.job);
      if (it == tier_keys.end()) {
        return violation("tier job " + std::to_string(t.job) + " finished twice");
      }
      // A promotion puts its keys in host memory; a write puts them on disk.
      const bool shared_write = shared_writes.erase(t.job) > 0;
      if (t.ok && !shared_write) {
        auto& shadow = t.tier_kind == TierJobKind::promote ? stored_ok : disk_ok;
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

  void completed(const CompletedJob& c) {
    if (c.kind != JobKind::load) return;
    const bool failed = failed_loads.erase(c.job) > 0;
    if (failed != !c.ok) {
      violation("load job " + std::to_string(c.job) + " was reported " +
                (c.ok ? "ok although its transfer failed" : "failed although it succeeded"));
    }
    if (!c.ok) ++report.failed_loads_reported;
  }

  void submit_tier_jobs(const StepResult& out) {
    for (const TierJob& job : out.tier_jobs) {
      // Which sub-blocks hold written data travels with the bytes (record_written).
      for (std::size_t i = 0; i < job.keys.size(); ++i) {
        if (job.kind == TierJobKind::write) {
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
      if (config.check_invariants && job.medium == Medium::shared &&
          job.kind == TierJobKind::write) {
        shared_writes.insert(job.id);
      }
    }
  }

  /// The host cache's ready keys are exactly the shadow cache.
  void check_cache() {
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

  /// Finished transfers go back to the scheduler (successful loads verified first), with
  /// every worker's report at once or (staggered_reports) one or two of them a step; returns
  /// the jobs that completed.
  std::vector<CompletedJob> report_finished(bool all_owed = false) {
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
      const SharedTierStats ws = engine->shared_tier(shared_tier).stats();
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

  void drain() {
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

  /// The GPU blocks a step writes: local prefix-cache data, the forward pass, the loads.
  std::unordered_set<GpuBlockId> blocks_written(const std::vector<ScheduledRequest>& entries,
                                                const StepResult& out) const {
    std::unordered_set<GpuBlockId> written;
    const auto& layouts = scheduler->layouts();
    for (const ScheduledRequest& e : entries) {
      const Request& r = requests.at(e.request_id);
      for (const auto& [g, k, id] : r.local_data) written.insert(id);
      const std::int64_t end = e.num_computed_tokens + e.num_scheduled_tokens;
      for (std::size_t g = 0; g < layouts.size(); ++g) {
        const std::int64_t gbs = layouts[g].gpu_block_size;
        for (std::int64_t k = e.num_computed_tokens / gbs; k < (end + gbs - 1) / gbs; ++k) {
          written.insert(r.table[g][static_cast<std::size_t>(k)]);
        }
      }
    }
    for (const TransferJob& job : out.load_jobs) {
      written.insert(job.gpu.block_ids.begin(), job.gpu.block_ids.end());
    }
    return written;
  }

  void step() {
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
      const auto i =
          static_cast<std::size_t>(rand(0, static_cast<std::int64_t>(running.size()) - 1));
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
    const auto& layouts = scheduler->layouts();
    for (const std::string& id : running) {
      Request& r = requests.at(id);
      const std::int64_t left = r.prompt - r.computed;
      const std::int64_t nst = left > 0 ? std::min(left, rand(1, 2 * max_obs)) : 1;
      ScheduledRequest e;
      e.request_id = id;
      e.num_computed_tokens = r.computed;
      e.num_scheduled_tokens = nst;
      e.resumed = r.resumed;
      for (std::size_t g = 0; g < layouts.size(); ++g) {
        const std::int64_t gbs = layouts[g].gpu_block_size;
        const auto need = static_cast<std::size_t>((r.computed + nst + gbs - 1) / gbs);
        while (r.table[g].size() < need) r.table[g].push_back(alloc_block());
        e.new_block_ids.emplace_back(r.table[g].begin() + static_cast<std::ptrdiff_t>(r.sent[g]),
                                     r.table[g].end());
        r.sent[g] = r.table[g].size();
      }
      r.resumed = false;
      entries.push_back(std::move(e));
    }

    // reset_cache now and then: the cache empties without per-key events (the engine that
    // resets knows), every job in flight is flushed, and their reports become stale.
    std::vector<ManagerEvent> events_before;
    const bool reset = chance(config.reset_probability);
    if (reset) {
      events_before = take_events();
      if (config.check_invariants) after_build(StepResult{}, events_before);
      scheduler->reset_cache();
      stored_ok.clear();
      disk_ok.clear();
      jobs_of.clear();  // every job is stale now
      ++report.resets;
    }
    const StepResult out = scheduler->build_step(entries, preempted);
    const std::vector<ManagerEvent> events =
        config.check_invariants || config.observer ? take_events() : std::vector<ManagerEvent>{};
    if (config.check_invariants) after_build(out, events);
    if (config.observer) {
      const std::unordered_set<GpuBlockId> written = blocks_written(entries, out);
      config.observer(StepObservation{*scheduler, entries, out, events_before, events, reset,
                                      written, stores_running});
    }
    engine->wait(out.flush);  // the fence: stores still reading reused blocks finish first
    // Their copies are done (a FaultyBackend may still hold their results back a few polls).
    for (const JobId id : out.flush) stores_running.erase(id);
    if (reset) {
      // Jobs from before the reset have all run (flushed): verify and report them (the
      // scheduler ignores the stale reports); requests waiting for a load start over.
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
    for (const ScheduledRequest& e : entries) {
      Request& r = requests.at(e.request_id);
      const std::int64_t end = e.num_computed_tokens + e.num_scheduled_tokens;
      for (std::size_t g = 0; g < layouts.size(); ++g) {
        const std::int64_t gbs = layouts[g].gpu_block_size;
        for (std::int64_t k = e.num_computed_tokens / gbs; k < (end + gbs - 1) / gbs; ++k) {
          const GpuBlockId id = r.table[g][static_cast<std::size_t>(k)];
          gpu_unwritten.erase(id);
          for (std::size_t t = 0; t < static_cast<std::size_t>(2 * config.layers); ++t) {
            const std::uint64_t seed = (k + 1) * gbs <= end
                                           ? seed_of(r, g, t, k)
                                           : mix(r.uid * 1000003 + static_cast<std::uint64_t>(k));
            fill(page(g, t, id), config.page_bytes, seed);
          }
        }
      }
      r.computed = end;
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
    report.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  SimConfig config;
  std::mt19937_64 rng;
  std::unique_ptr<Scheduler> scheduler;
  std::vector<std::vector<std::uint8_t>> gpu;
  std::unique_ptr<Worker> engine;  // layout, host pool and transfer engine
  std::vector<GpuBlockId> free_ids;
  std::vector<std::vector<BlockHash>> families;
  std::int64_t max_obs = 0;
  int next_request = 0;
  std::map<std::string, Request> requests;
  std::deque<std::string> waiting;
  std::set<std::string> loading;
  std::vector<std::string> running;
  std::unordered_map<JobId, TransferJob> load_jobs;
  // Invariant checking (check_invariants): the keys whose store succeeded and that were not
  // evicted since, by the worker's account; each in-flight store's keys; failed loads not yet
  // reported to the engine.
  FaultyBackend* faulty = nullptr;
  std::unordered_set<Key, KeyHash> stored_ok;
  std::unordered_map<JobId, std::vector<Key>> store_keys;
  std::unordered_set<JobId> failed_loads;
  std::unordered_set<JobId> submitted;  // jobs given to the engine and not yet finished
  // check_invariants with a disk tier: the keys on disk by the worker's account, and each
  // tier job's keys.
  std::unordered_set<Key, KeyHash> disk_ok;
  std::unordered_map<Key, std::vector<bool>, KeyHash> disk_written;  // per key on disk
  std::unordered_map<JobId, std::vector<Key>> tier_keys;
  std::unordered_set<JobId> shared_writes;  // tier_keys' writes to the shared tier
  std::size_t shared_tier = 0;              // its index in SchedulerConfig::tiers
  // Store jobs whose copy may still run (not flushed, not reported finished): their sources.
  std::unordered_map<JobId, std::vector<GpuBlockId>> stores_running;
  std::map<JobId, OwedReports> owed;  // reports not yet given to the scheduler
  std::unordered_map<HostBlockId, std::vector<bool>> host_written;  // record_written
  std::unordered_set<GpuBlockId> gpu_unwritten;  // loaded from a sub-block no store wrote
  std::int64_t gbs_lcm = 1;
  std::unordered_map<std::string, std::int64_t> jobs_of;  // jobs in flight per request
  std::unordered_map<JobId, std::string>
      store_req;  // a local prefix hit covers whole blocks of every group
  SimReport report;
  std::chrono::steady_clock::time_point start;
};

SyntheticEngine::SyntheticEngine(const SimConfig& config) : impl_(std::make_unique<Impl>(config)) {}
SyntheticEngine::~SyntheticEngine() = default;

const SimReport& SyntheticEngine::step() {
  impl_->step();
  return impl_->report;
}

SimReport SyntheticEngine::run(const std::function<void(const SimReport&)>& progress,
                               std::int64_t every) {
  for (std::int64_t i = 0; i < impl_->config.steps; ++i) {
    impl_->step();
    if (progress && every > 0 && (i + 1) % every == 0) progress(impl_->report);
  }
  if (impl_->config.check_invariants) impl_->drain();
  return impl_->report;
}

void SyntheticEngine::drain() {
  impl_->drain();
}

}  // namespace kvsim
