// Internal to the synthetic engine: its state, shared by the files that implement it
// (synthetic_engine.cpp: set-up, tier wiring and the workload; synthetic_engine_step.cpp:
// one engine step and the worker's reports; synthetic_engine_oracle.cpp: the byte and
// invariant checks).
#pragma once

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
#include "kvoffload/detail/flat_hash_map.hpp"
#include "kvoffload/error.hpp"
#include "kvoffload/host_backend.hpp"
#include "kvoffload/scheduler.hpp"
#include "kvoffload/testing/faulty_backend.hpp"
#include "kvoffload/tiers/shared_presence.hpp"
#include "kvoffload/worker.hpp"
#include "synthetic_engine.hpp"

namespace kvsim {

using namespace kvoffload;

namespace detail {

// The same finalizer the library's hash tables use.
inline std::uint64_t mix(std::uint64_t x) {
  return kvoffload::detail::mix64(x);
}

inline std::uint64_t fingerprint(const BlockHash& h) {
  std::uint64_t x = 0;
  std::memcpy(&x, h.data(), std::min<std::size_t>(8, h.size()));
  return x;
}

/// Page content: 8-byte words of mix(seed + i).
inline void fill(std::uint8_t* p, std::int64_t bytes, std::uint64_t seed) {
  for (std::int64_t i = 0; i + 8 <= bytes; i += 8) {
    const std::uint64_t w = mix(seed + static_cast<std::uint64_t>(i));
    std::memcpy(p + i, &w, 8);
  }
}

inline bool holds(const std::uint8_t* p, std::int64_t bytes, std::uint64_t seed) {
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

}  // namespace detail

using detail::fill;
using detail::fingerprint;
using detail::holds;
using detail::mix;
using detail::OwedReports;
using detail::Phase;
using detail::Request;

struct SyntheticEngine::Impl {
  explicit Impl(const SimConfig& c);

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

  /// vllm_tables: vLLM's remove_skipped_blocks for a running request before this step's
  /// allocations (SimConfig::vllm_tables).
  void free_skipped(Request& r);

  void admit();

  void send_hashes(Request& r);

  /// Lookup and allocation; true if the request computes this step. Now and then the request
  /// starts from a prefix in the GPU prefix cache (num_computed_tokens > 0).
  bool try_start(Request& r);

  void restart(Request& r);

  /// Which sub-blocks of each of a store's host blocks it writes: a window block stored with
  /// leading null sub-blocks leaves them unwritten, and a GPU block that a load filled from
  /// such a sub-block passes the gap on.
  void record_written(const TransferJob& job);

  void verify_load(const TransferJob& job);

  void violation(const std::string& what);

  /// Loads planned by this step load only keys whose store succeeded and that were not
  /// evicted since; then this step's evictions leave the shadow cache.
  std::vector<ManagerEvent> take_events() { return scheduler->take_events(); }

  void after_build(const StepResult& out, const std::vector<ManagerEvent>& events);

  /// The worker's view: a successful store puts its keys in the shadow cache; a failed load
  /// must come back from the scheduler as failed.
  void transfer_finished(const FinishedTransfer& t);

  void completed(const CompletedJob& c);

  void submit_tier_jobs(const StepResult& out);

  /// The host cache's ready keys are exactly the shadow cache.
  void check_cache();

  /// Finished transfers go back to the scheduler (successful loads verified first), with
  /// every worker's report at once or (staggered_reports) one or two of them a step; returns
  /// the jobs that completed.
  std::vector<CompletedJob> report_finished(bool all_owed = false);

  void drain();

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
          const GpuBlockId id = r.table[g][static_cast<std::size_t>(k)];
          if (id != null_block) written.insert(id);  // a mamba pad holds nothing
        }
      }
    }
    for (const TransferJob& job : out.load_jobs) {
      written.insert(job.gpu.block_ids.begin(), job.gpu.block_ids.end());
    }
    return written;
  }

  void step();

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
  // Tier jobs in flight at a reset_cache: they may finish later (the step does not wait), and
  // their keys are then under the old weights, in no shadow.
  std::unordered_set<JobId> stale_tier_jobs;
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

}  // namespace kvsim
