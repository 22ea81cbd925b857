#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvoffload/backend.hpp"
#include "kvoffload/copy_planner.hpp"
#include "kvoffload/export.hpp"
#include "kvoffload/job.hpp"

namespace kvoffload {

struct TransferEngineConfig {
  /// Submit a step's stores at the start of the next step (start_step), as vLLM does, so the
  /// offload copies begin after the step's own device-to-host copies (sampling).
  bool defer_stores = false;
  /// Back-pressure (issue 30): the bytes of stores copying in the backend at once (0: no
  /// bound). A store is judged when it starts (a deferred one at start_step or a flush): if
  /// it would pass the bound while others copy, it is not copied but finishes failed at once
  /// ("skipped: store back-pressure", counted in stores_shed, reported possibly before earlier
  /// stores), so its blocks never become hits and the GPU blocks it names are free at once.
  /// A store alone is always taken, whatever its size. Loads are never bounded by it.
  std::uint64_t max_store_bytes_in_flight = 0;
};

/// A job the engine (or, for a tier job, a tier) finished: the worker reports it to the
/// scheduler (on_completed). `kind` says which (is_tier_job: a tier job).
struct FinishedTransfer {
  JobId job = 0;
  JobKind kind = JobKind::store;
  bool ok = true;
  std::string error;
  std::uint64_t bytes = 0;
  double seconds = 0;
};

struct TransferStats {
  std::uint64_t store_jobs = 0, load_jobs = 0, failed_jobs = 0;
  std::uint64_t bytes_stored = 0, bytes_loaded = 0;
  double store_seconds = 0, load_seconds = 0;  ///< summed job durations
  std::uint64_t stores_shed = 0;  ///< store jobs not copied: max_store_bytes_in_flight reached
  [[nodiscard]] double store_bytes_per_second() const {
    return store_seconds > 0 ? static_cast<double>(bytes_stored) / store_seconds : 0;
  }
  [[nodiscard]] double load_bytes_per_second() const {
    return load_seconds > 0 ? static_cast<double>(bytes_loaded) / load_seconds : 0;
  }
};

/// The worker side of a job: plans it against the KV layout and host region, runs it on a
/// backend, and reports finished jobs in order. Thread-safety: submit_* and get_finished may be
/// called from different threads; calls are serialized internally.
class KVOFFLOAD_EXPORT TransferEngine {
 public:
  /// The layout must outlive the engine.
  TransferEngine(const KvLayout& layout, const HostRegion& host, std::unique_ptr<Backend> backend,
                 const TransferEngineConfig& config = {});
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  /// Plans and starts (or, with defer_stores, queues) a store job. Throws invalid_argument,
  /// naming the job and group, for a job that breaks the invariants or whose kind is not
  /// store; nothing is copied then.
  void submit_store(const TransferJob& job);
  /// Plans and starts a load job; throws like submit_store.
  void submit_load(const TransferJob& job);
  /// Starts the stores deferred from the previous step. One whose start throws (the backend
  /// refused it) is reported failed by get_finished, once; the others start.
  void start_step();
  /// Jobs finished since the last call: loads and stores each in submission order. Never
  /// blocks.
  std::vector<FinishedTransfer> get_finished();
  /// Blocks until these jobs (the scheduler's flush set) have finished; deferred ones among
  /// them start first. Unknown or already reported ids are ignored. Their results still come
  /// out of get_finished.
  void wait(std::span<const JobId> jobs);

  [[nodiscard]] TransferStats stats() const;
  /// The bytes of the stores copying in the backend now (deferred ones not yet started are
  /// not counted).
  [[nodiscard]] std::uint64_t store_bytes_in_flight() const;
  /// True while the stores copying reach half of max_store_bytes_in_flight: the scheduler
  /// should skip new stores (Scheduler::set_store_pressure) until it clears. Always false
  /// without a bound.
  [[nodiscard]] bool store_pressure() const;
  [[nodiscard]] Backend& backend() noexcept { return *backend_; }

 private:
  void submit(const TransferJob& job, JobKind kind);
  /// `mark`: a deferred store's compute mark (0 for the others); dropped if the store is shed.
  void start(const TransferJob& job, JobKind kind, ComputeMark mark = 0);
  /// A store waiting for start_step, with the backend's mark of the engine's work at its
  /// submission (the forward pass whose KV it reads).
  struct Deferred {
    TransferJob job;
    ComputeMark mark = 0;
  };
  /// A deferred store: started, or, if that throws, reported failed by the next get_finished
  /// (never lost, never started twice).
  void start_deferred(const Deferred& d) noexcept;

  CopyPlanner planner_;
  std::unique_ptr<Backend> backend_;
  TransferEngineConfig config_;
  mutable std::mutex mutex_;
  std::vector<Deferred> deferred_;
  std::vector<FinishedTransfer> start_failed_;  // deferred stores whose start threw
  /// Sheds a store over the bound: reported failed by the next get_finished. True if shed.
  bool shed_over_bound(const TransferJob& job, std::uint64_t bytes);
  /// Forgets a store's held bytes (it finished, or its start failed).
  void release_store(JobId job);
  std::unordered_map<JobId, Ticket> tickets_;             // in flight
  std::unordered_map<JobId, std::uint64_t> store_bytes_;  // stores copying in the backend
  std::uint64_t store_bytes_held_ = 0;                    // their sum
  std::vector<BackendResult> polled_;
  TransferStats stats_;
};

}  // namespace kvoffload
