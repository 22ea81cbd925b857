#pragma once

// The worker side of a disk tier: runs the scheduler's tier jobs (promote: slots into host
// blocks; write: host blocks into slots) on a pool of I/O threads over DiskSlots, and reports
// them finished. Each tensor-parallel worker has its own (its rows, its files: the layout
// digest includes the rank).

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kvoffload/enums.hpp"
#include "kvoffload/export.hpp"
#include "kvoffload/job.hpp"
#include "kvoffload/tiers/disk_slots.hpp"

namespace kvoffload {

namespace detail {
class UringIo;
}

/// A disk tier as the engine configures it.
struct DiskTierConfig {
  std::string path;                  ///< root directory (a directory per layout under it)
  std::uint64_t capacity_bytes = 0;  ///< bound on this worker's slab files
  /// What makes bytes incompatible beyond the host block layout, given by the engine: the
  /// model's name and revision, the KV dtype, the group specs. Part of the layout digest.
  std::string model;
  std::string dtype;
  int tp_rank = 0;
  int tp_size = 1;
  DiskIo io = DiskIo::automatic;
  int io_depth = 32;   ///< io_uring: slot reads/writes in flight at once
  int io_threads = 4;  ///< threads: parallel pread/pwrite calls
  bool direct_io = true;
  bool verify_payloads_on_scan = false;
};

/// The digest that names a layout's directory: of the config's model, dtype and
/// tensor-parallel rank and size, and of `layout` (the worker's host block layout: block size
/// factor, group tensors and their page sizes, host block bytes). Changing any of them gives
/// another directory, so incompatible bytes are never read.
KVOFFLOAD_EXPORT std::uint64_t disk_layout_digest(const DiskTierConfig& config,
                                                  std::string_view layout);

/// A tier's scan over several workers (one list per rank, slot by slot): a slot holds a key
/// only if every rank's slot holds that same key, valid. What Scheduler::restore_tier takes.
KVOFFLOAD_EXPORT std::vector<std::optional<Key>> merge_rank_scans(
    std::span<const std::vector<std::optional<Key>>> ranks);

/// A finished tier job: the worker reports it to the scheduler (on_completed).
struct FinishedTierJob {
  JobId job = 0;
  TierJobKind kind = TierJobKind::write;
  bool ok = true;
  std::int64_t failed_blocks = 0;
};

class KVOFFLOAD_EXPORT DiskTier {
 public:
  /// `host_block(id)` gives the bytes of host block `id` (the worker's pool, payload_bytes
  /// each). Opens (creating if needed) and scans the slab files; throws invalid_argument naming
  /// the field for a bad config, kvoffload::error naming the path if a file cannot be opened.
  DiskTier(const DiskTierConfig& config, std::string_view layout, std::uint64_t payload_bytes,
           std::function<std::span<std::byte>(HostBlockId)> host_block);
  /// Finishes the jobs already submitted, then stops the threads.
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  /// Starts a tier job. Throws invalid_argument naming the job for mismatched list lengths or
  /// a slot out of range; nothing runs then.
  void submit(const TierJob& job);
  /// Jobs finished since the last call, in finishing order.
  std::vector<FinishedTierJob> get_finished();
  /// Blocks until these jobs (if submitted here and not yet taken by get_finished) finished.
  void wait(std::span<const JobId> jobs);
  [[nodiscard]] bool owns(JobId job) const;
  /// Empties the tier on disk (after Scheduler::reset_cache: blocks of the old cache must not
  /// come back at the next start). Throws kvoffload::error if tier jobs are still running.
  void clear();

  [[nodiscard]] std::int64_t num_slots() const noexcept { return slots_.num_slots(); }
  [[nodiscard]] const std::vector<std::optional<Key>>& scanned() const noexcept {
    return slots_.scanned();
  }
  [[nodiscard]] const DiskSlots& slots() const noexcept { return slots_; }
  /// The engine in use: DiskIo::io_uring or DiskIo::threads.
  [[nodiscard]] DiskIo io() const noexcept { return io_; }

 private:
  struct Job {
    TierJob job;
    std::int64_t remaining = 0;
    std::int64_t failed = 0;
  };
  using Task = std::pair<Job*, std::size_t>;  // a job and one of its blocks
  void run_threads();
  void run_uring();
  /// Takes up to `max` tasks, waiting for one unless `busy`; false when stopping and idle.
  bool take(std::vector<Task>& out, std::size_t max, bool busy);
  /// Counts one block of a job done (ok or not), finishing the job after its last.
  void block_done(Job& j, bool ok);
  [[nodiscard]] std::span<std::uint8_t> host_bytes(const Job& j, std::size_t i) const;

  DiskSlots slots_;  // clear() changes it: not const after construction
  DiskIo io_ = DiskIo::threads;
  std::unique_ptr<detail::UringIo> uring_;
  std::function<std::span<std::byte>(HostBlockId)> host_block_;
  mutable std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable job_done_;
  std::unordered_map<JobId, std::unique_ptr<Job>> jobs_;  // submitted, not finished
  std::deque<std::pair<Job*, std::size_t>> queue_;        // (job, block index)
  std::vector<FinishedTierJob> finished_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kvoffload
