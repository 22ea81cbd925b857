#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "kvoffload/byte_size.hpp"
#include "kvoffload/enums.hpp"
#include "kvoffload/export.hpp"
#include "kvoffload/types.hpp"

namespace kvoffload {

class DeviceRuntime;

struct PoolConfig {
  std::int64_t block_bytes = 0;  ///< bytes of one host block, a multiple of `alignment`
  /// Rows per block: several tensor-parallel workers share one region, each owning one row
  /// (block_bytes / num_rows bytes, also a multiple of `alignment`) of every block.
  std::int64_t num_rows = 1;
  std::int64_t host_blocks = 0;  ///< the pool's size in blocks, or
  std::uint64_t host_bytes = 0;  ///< a byte budget: as many whole blocks as fit
  std::int64_t alignment = 256;  ///< of every block and row; a power of two >= 64
  HugePages huge_pages = HugePages::prefer;
  int prefault_threads = 0;  ///< threads that first-touch the pages (0: all cores)
  Pinning pinning = Pinning::automatic;
  /// If registration fails: false (default) throws; true keeps plain memory and logs an error
  /// (copies then run at pageable speed).
  bool allow_unpinned = false;
  /// Registrations cover at most this many bytes, rounded down to whole blocks, so no block
  /// spans two registrations.
  std::uint64_t register_chunk_bytes = std::uint64_t{1} << 30;
  /// The device whose primary context registers (and unregisters) the pool; registered
  /// Portable, it serves every device. -1: the calling thread's current one, which on a thread
  /// that never chose a device creates a context on device 0.
  int device = -1;
  /// The device runtime that registers the pool (DeviceRuntime::host_register); null: the
  /// CUDA runtime in a CUDA build, none otherwise. A simulated device (testing/sim_device.hpp)
  /// registers it like CUDA would. The pool keeps it alive until it is unregistered.
  std::shared_ptr<DeviceRuntime> runtime;
};

/// How the pool was allocated, for logs and the benchmark.
struct PoolReport {
  double map_seconds = 0;
  double fault_seconds = 0;
  double register_seconds = 0;
  int fault_threads = 0;
  bool huge_pages = false;  ///< 2 MiB pages (hugetlb or transparent) were requested and given
  bool hugetlb = false;     ///< from the hugetlb pool (MAP_HUGETLB)
  bool pinned = false;      ///< registered with the device runtime
  std::size_t registrations = 0;
};

/// One memory region holding `num_blocks` host blocks of `block_bytes` each: the memory behind
/// the HostBlockManager's block ids. Allocation maps the region (huge pages when possible),
/// first-touches it with several threads (so faulting a large pool takes seconds, not
/// minutes), then registers it with CUDA in block-aligned chunks (one huge registration fails
/// on some machines). Block addresses are computed from the id. Destruction unregisters and
/// unmaps. Thread-safe for concurrent reads and writes of distinct blocks; the object itself
/// is immutable after construction.
class KVOFFLOAD_EXPORT PinnedHostPool {
 public:
  /// Throws invalid_argument naming the field for a bad config, out_of_memory if the region
  /// cannot be mapped, cuda_error if registration fails (unless allow_unpinned).
  explicit PinnedHostPool(const PoolConfig& config);
  ~PinnedHostPool();
  PinnedHostPool(const PinnedHostPool&) = delete;
  PinnedHostPool& operator=(const PinnedHostPool&) = delete;

  [[nodiscard]] std::byte* block(HostBlockId id) const noexcept {
    return base_ + static_cast<std::size_t>(id) * block_bytes_;
  }
  [[nodiscard]] std::byte* row(HostBlockId id, std::int64_t row) const noexcept {
    return block(id) + static_cast<std::size_t>(row) * row_bytes_;
  }
  [[nodiscard]] std::int64_t num_blocks() const noexcept { return num_blocks_; }
  [[nodiscard]] std::size_t block_bytes() const noexcept { return block_bytes_; }
  [[nodiscard]] std::size_t row_bytes() const noexcept { return row_bytes_; }
  [[nodiscard]] std::int64_t num_rows() const noexcept { return num_rows_; }
  [[nodiscard]] std::byte* data() const noexcept { return base_; }
  /// Bytes of the blocks (the mapping may be larger, rounded to the page size).
  [[nodiscard]] std::size_t size_bytes() const noexcept {
    return static_cast<std::size_t>(num_blocks_) * block_bytes_;
  }
  [[nodiscard]] const PoolReport& report() const noexcept { return report_; }
  /// Whole blocks per device registration (the last one may hold fewer); 0 when the pool is
  /// not registered. A device copy must not span two registrations (HostRegion).
  [[nodiscard]] std::int64_t blocks_per_registration() const noexcept {
    return blocks_per_registration_;
  }

 private:
  void map_region(const PoolConfig& config);
  void prefault(int threads);
  void register_region(const PoolConfig& config);
  void release() noexcept;

  std::byte* base_ = nullptr;
  std::byte* mapping_ = nullptr;
  std::size_t mapping_bytes_ = 0;
  std::size_t block_bytes_ = 0;
  std::size_t row_bytes_ = 0;
  std::int64_t num_rows_ = 1;
  std::int64_t num_blocks_ = 0;
  std::int64_t blocks_per_registration_ = 0;
  std::vector<std::pair<std::byte*, std::size_t>> registered_;
  std::shared_ptr<DeviceRuntime> runtime_;  // who registered registered_
  int device_ = -1;                         // in this device's context
  PoolReport report_;
};

}  // namespace kvoffload
