#pragma once

// The worker side of a disk tier (a Tier, tier.hpp): runs the scheduler's tier jobs (promote:
// slots into host blocks; write: host blocks into slots) on a pool of I/O threads over
// DiskSlots, and reports them finished. Each tensor-parallel worker has its own (its rows, its
// files: the layout digest includes the rank).

#include <cstdint>
#include <functional>
#include <memory>
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
  [[nodiscard]] TierIoStats stats() const override;
  [[nodiscard]] const DiskSlots& slots() const noexcept { return slots_; }
  /// The engine in use: DiskIo::io_uring or DiskIo::threads.
  [[nodiscard]] DiskIo io() const noexcept { return io_; }

 private:
  void check(const TierJob& job) const override;
  void clear_contents() override { slots_.clear(); }
  void start_threads(int n, const std::function<void()>& body);
  void run_threads();
  void run_uring();
  [[nodiscard]] std::span<std::uint8_t> host_bytes(const TierJob& job, std::size_t i) const;

  DiskSlots slots_;  // clear() changes it: not const after construction
  DiskIo io_ = DiskIo::threads;
  std::unique_ptr<detail::UringIo> uring_;
  std::function<std::span<std::byte>(HostBlockId)> host_block_;
  std::vector<std::thread> threads_;
};

}  // namespace kvoffload
