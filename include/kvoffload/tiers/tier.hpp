#pragma once

// What every tier below host memory is to the worker: a queue of tier jobs (promote: slots
// into host blocks; write: host blocks into slots) that the tier runs on threads of its own and
// reports finished. DiskTier and SharedTier are the two kinds; the worker holds its tiers in
// the scheduler's order (SchedulerConfig::tiers) and talks to every one through this interface.
// The job bookkeeping (ids, per-block progress, finishing, waiting, stopping) is written once,
// here; a kind adds its checks of a job and its I/O loop.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvoffload/enums.hpp"
#include "kvoffload/export.hpp"
#include "kvoffload/job.hpp"
#include "kvoffload/types.hpp"

namespace kvoffload {

namespace detail {
class TierQueue;
}

/// A finished tier job: the worker reports it to the scheduler (on_completed).
struct FinishedTierJob {
  JobId job = 0;
  JobKind kind = JobKind::write;
  bool ok = true;
  std::int64_t failed_blocks = 0;
};

/// The blocks a worker's tier moved (each kind has finer counters of its own; the
/// scheduler's index of a tier has TierStats).
struct TierIoStats {
  std::uint64_t reads = 0;           ///< blocks promoted (read and verified)
  std::uint64_t read_failures = 0;   ///< promotions that failed: missing, refused or I/O error
  std::uint64_t writes = 0;          ///< blocks written
  std::uint64_t write_failures = 0;  ///< writes that failed
};

/// Thread-safe. Destruction finishes the jobs already submitted, then stops the tier's threads.
class KVOFFLOAD_EXPORT Tier {
 public:
  virtual ~Tier();
  Tier(const Tier&) = delete;
  Tier& operator=(const Tier&) = delete;

  [[nodiscard]] virtual Medium medium() const noexcept = 0;
  /// Starts a tier job. Throws invalid_argument naming the job for mismatched list lengths, a
  /// host block or slot out of range, or an id that is still running; nothing runs then.
  void submit(const TierJob& job);
  /// Jobs finished since the last call, each once.
  std::vector<FinishedTierJob> get_finished();
  /// Blocks until these jobs finished (ids not submitted here, or already finished, are
  /// ignored).
  void wait(std::span<const JobId> jobs);
  /// Whether `job` was submitted here and has not finished.
  [[nodiscard]] bool owns(JobId job) const;
  /// Forgets what this worker's tier holds (after Scheduler::reset_cache, so the old cache's
  /// blocks do not come back at the next start): a disk tier empties its slots; a shared tier
  /// holds nothing of its own (the fleet's values stay) and does nothing. Returns at once:
  /// the tier's own thread empties it (a truncate waits in the kernel for I/O in flight, on a
  /// stalled disk forever), and jobs submitted after wait for that. Never waits for the tier
  /// jobs still running (issued before the reset, on a slow or stalled disk): a write of
  /// theirs not started is skipped, one that lands after the clear is erased (both fail), so
  /// no old block survives it. A failure to empty is logged, never thrown.
  void clear();
  /// Returns once the clear() started before has finished (tests; a scan after a clear).
  void wait_cleared();

  /// Slots the tier holds (its capacity in blocks); 0 for a tier with no slots of its own (a
  /// shared tier: the cluster decides).
  [[nodiscard]] virtual std::int64_t num_slots() const noexcept = 0;
  /// What the tier found at start, slot by slot (for Scheduler::restore_tier); empty for a
  /// tier without slots.
  [[nodiscard]] virtual const std::vector<std::optional<Key>>& scanned() const noexcept = 0;
  [[nodiscard]] virtual TierIoStats stats() const = 0;
  /// Frees what scanned() holds (a disk tier: a key per slot, 44 bytes, 440 MB at 10M slots)
  /// once the scheduler has restored from it; scanned() is empty afterwards (a tier without
  /// slots: nothing to free). Call it where scanned() is read (the caller's side, like
  /// clear()).
  virtual void release_scan() {}

 protected:
  /// `name` is for logs ("disk tier"); failures of a kind that expects them (a shared tier's
  /// misses) are logged at debug level, others as warnings.
  Tier(std::string name, bool failures_expected);
  /// Throws invalid_argument naming the job for one this tier cannot run.
  virtual void check(const TierJob& job) const = 0;
  /// Run by clear() on a thread of its own while no block is handed out (blocks handed out
  /// before may still be in I/O). A kind with slots calls join_clear() in its destructor
  /// before its members go.
  virtual void clear_contents() = 0;
  /// Called by clear() on the caller's thread first: what scanned() gives is forgotten.
  virtual void forget_scan() {}
  /// For the tier's I/O threads: the blocks to run, and where to report them.
  [[nodiscard]] detail::TierQueue& queue() const noexcept { return *queue_; }
  /// Lets every submitted block finish, then makes the queue's take() return false: a kind's
  /// destructor calls it, then joins its threads, then join_clear().
  void stop() noexcept;
  /// Waits for a clear() still running and joins its thread (before the kind's members go).
  void join_clear();

 private:
  std::unique_ptr<detail::TierQueue> queue_;
};

}  // namespace kvoffload
