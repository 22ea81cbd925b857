#pragma once

// One engine of `kvoffload-bench trace` (trace_bench.hpp): a real Scheduler and Worker (host
// backend: the "GPU" cache is ordinary memory) with the tiers the options ask for, a disk tier
// and a shared tier on a Valkey cluster, replaying the trace's requests one at a time.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvoffload/scheduler.hpp"
#include "kvoffload/worker.hpp"
#include "trace_bench.hpp"

namespace kvbench {

/// What one request found.
struct Replayed {
  std::size_t hit_blocks = 0;  ///< its leading blocks that were hits
  std::vector<char> host;      ///< host[i]: block i was in host memory before the request
  /// Blocks promoted for it, per tier (disk, shared: the order of TraceEngine::tier_names).
  std::vector<std::uint64_t> promoted;
  /// First lookup until the end of the step that loads its hit blocks (its store is
  /// submitted in the same step).
  double seconds_to_loaded = 0;
};

class TraceEngine {
 public:
  /// Requests of up to `max_blocks` blocks. Throws invalid_argument naming the option for a
  /// tier that cannot start.
  TraceEngine(const TraceOptions& o, std::size_t max_blocks);
  ~TraceEngine();
  TraceEngine(const TraceEngine&) = delete;
  TraceEngine& operator=(const TraceEngine&) = delete;

  /// Replays one request: lookups until one answers (a tier's existence check and promotion
  /// run meanwhile; at most kLookupSeconds), allocation, its load and store, the
  /// write-through of what it stored.
  /// `continues`: the request's hint for policy reuse (1, 0; -1 none).
  Replayed replay(const std::string& id, const TraceRequest& r, std::int8_t continues = -1);

  kvoffload::Scheduler& scheduler() { return *scheduler_; }
  [[nodiscard]] const kvoffload::Worker& worker() const { return *worker_; }
  /// "disk", "shared": the tiers below host memory, nearest first.
  [[nodiscard]] const std::vector<std::string>& tier_names() const { return tier_names_; }
  [[nodiscard]] double scheduler_seconds() const { return scheduler_seconds_; }

  static constexpr double kLookupSeconds = 30;

 private:
  template <class F>
  void timed(F&& f);
  /// One engine step: build, run every job on the worker, wait, report. Returns the jobs run.
  std::size_t step(std::span<const kvoffload::ScheduledRequest> scheduled);

  std::int64_t block_tokens_;
  std::vector<std::byte> gpu_;
  std::unique_ptr<kvoffload::Worker> worker_;
  std::unique_ptr<kvoffload::Scheduler> scheduler_;
  std::vector<std::string> tier_names_;
  std::vector<kvoffload::GpuBlockId> ids_;
  std::vector<kvoffload::BlockHash> hashes_;
  double scheduler_seconds_ = 0;
};

}  // namespace kvbench
