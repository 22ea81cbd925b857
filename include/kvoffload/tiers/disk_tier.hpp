#pragma once

// The worker side of a disk tier (a Tier, tier.hpp): runs the scheduler's tier jobs (promote:
// slots into host blocks; write: host blocks into slots) on a pool of I/O threads over
// DiskSlots, and reports them finished. Each tensor-parallel worker has its own (its rows, its
// files: the layout digest includes the rank), and its layout directory is locked while the
// tier lives (a second DiskTier on it, in any process, throws io_error at construction).
//
// A failed promotion erases its slot only when the slot is verifiably bad (a torn or corrupt
// header, a payload that fails its checksum: SlotRead::corrupt); a read that failed (an I/O
// error, a short read) or a slot holding another key or weights' epoch is left as it is. With
// io_uring, operations the kernel does not take are retried (bounded) and, if it still
// refuses, fail their blocks at once (no wait for completions that cannot come).

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kvoffload/enums.hpp"
#include "kvoffload/export.hpp"
#include "kvoffload/job.hpp"
#include "kvoffload/tiers/disk_slots.hpp"
#include "kvoffload/tiers/tier.hpp"
#include "kvoffload/tiers/tier_config.hpp"

namespace kvoffload {

namespace detail {
class UringIo;
}

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

/// The disk tier of one worker: runs tier jobs on a pool of I/O threads (io_uring, or
/// pread/pwrite threads) over DiskSlots.
class KVOFFLOAD_EXPORT DiskTier final : public Tier {
 public:
  /// `host_block(id)` gives the bytes of host block `id` (the worker's pool, payload_bytes
  /// each). Opens (creating if needed) and scans the slab files, keeping the slots written
  /// under the weights' epoch `epoch` (weights_epoch of the scheduler's weights; a job's own
  /// TierJob::epoch governs its reads and writes); throws invalid_argument naming the field
  /// for a bad config, kvoffload::error naming the path if a file cannot be opened.
  DiskTier(const DiskTierConfig& config, std::string_view layout, std::uint64_t payload_bytes,
           std::function<std::span<std::byte>(HostBlockId)> host_block, std::uint64_t epoch = 0);
  /// Finishes the jobs already submitted, then stops the threads.
  ~DiskTier() override;

  [[nodiscard]] Medium medium() const noexcept override { return Medium::disk; }
  [[nodiscard]] std::int64_t num_slots() const noexcept override { return slots_.num_slots(); }
  [[nodiscard]] const std::vector<std::optional<Key>>& scanned() const noexcept override {
    return slots_.scanned();
  }
  void release_scan() override { slots_.release_scanned(); }
  [[nodiscard]] TierIoStats stats() const override;
  [[nodiscard]] const DiskSlots& slots() const noexcept { return slots_; }
  /// The engine in use: DiskIo::io_uring or DiskIo::threads.
  [[nodiscard]] DiskIo io() const noexcept { return io_; }

  // Test seams (C++ only), for the tests of what the tier does when the disk or the kernel
  // fails; production code never calls them.
  /// The next `count` slot reads fail as if the read had returned -`err` (nothing is read).
  void fail_reads_for_test(int count, int err) noexcept;
  /// io_uring engine: the next `count` submissions fail with -`err` before the kernel sees
  /// them (EAGAIN, EBUSY: retried; another errno: their blocks fail). No-op for threads.
  void fail_submits_for_test(int count, int err) noexcept;
  /// While on, the I/O threads take blocks but start no I/O: a stalled device (a write after
  /// its check against a clear(), so a clear() meanwhile sees it land late). Jobs then stay
  /// in flight until it is turned off (the destructor turns it off).
  void stall_io_for_test(bool on);

 private:
  void check(const TierJob& job) const override;
  void clear_contents() override { slots_.clear(); }
  void forget_scan() override { slots_.forget_scanned(); }
  void start_threads(int n, const std::function<void()>& body);
  void run_threads();
  void run_uring();
  [[nodiscard]] std::span<std::uint8_t> host_bytes(const TierJob& job, std::size_t i) const;
  /// An injected read failure's errno (fail_reads_for_test), or 0.
  int take_read_fault() noexcept;
  /// Erases `slot` if `r` says it is corrupt (only then: SlotRead).
  void settle_read(SlotRead r, std::int64_t slot);
  /// Returns once stall_io_for_test is off.
  void wait_while_stalled();
  /// A write of `job` that landed in `slot` after a clear(): erased, or an error logged.
  void erase_late_write(const TierJob& job, std::int64_t slot);

  DiskSlots slots_;  // clear() changes it: not const after construction
  DiskIo io_ = DiskIo::threads;
  std::unique_ptr<detail::UringIo> uring_;
  std::function<std::span<std::byte>(HostBlockId)> host_block_;
  std::vector<std::thread> threads_;
  std::atomic<int> read_faults_{0};
  std::atomic<int> read_fault_errno_{0};
  std::mutex stall_mutex_;
  std::condition_variable stall_cv_;
  bool stalled_ = false;
};

}  // namespace kvoffload
