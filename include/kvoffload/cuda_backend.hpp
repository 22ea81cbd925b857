#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include <span>

#include "kvoffload/backend.hpp"
#include "kvoffload/export.hpp"
#include "kvoffload/kv_layout.hpp"

namespace kvoffload {

/// How a plan's descriptors are copied between GPU and pinned host memory.
enum class CopyMode : std::uint8_t {
  automatic,  ///< pick per job from piece size and count (thresholds below)
  batch,      ///< one cuMemcpyBatchAsync per job (driver 12.8+), else memcpy
  memcpy,     ///< one cudaMemcpyAsync per descriptor
  kernel,     ///< gather/scatter kernel over mapped pinned memory, a few CTAs
  staged,     ///< stores: a kernel packs the pieces on the device, one large copy moves them
};

KVOFFLOAD_EXPORT std::string_view to_string(CopyMode mode) noexcept;
/// Throws invalid_argument naming `field` for an unknown name.
KVOFFLOAD_EXPORT CopyMode parse_copy_mode(std::string_view name, std::string_view field);

struct CudaBackendConfig {
  int device = 0;
  CopyMode mode = CopyMode::automatic;
  int store_streams = 2;  ///< device-to-host streams (lowest priority)
  int load_streams = 2;   ///< host-to-device streams (highest priority)
  int kernel_ctas = 8;    ///< CTAs of the copy kernels: few, so the forward pass keeps its SMs
  int kernel_threads = 256;
  std::uint64_t staging_bytes = std::uint64_t{64} << 20;  ///< per backend, device and host
  // automatic mode: pieces averaging under small_piece_bytes go to the kernel (or, for stores
  // of at least staged_min_pieces pieces, staged); larger ones to batch. `calibrate` measures
  // small_piece_bytes on the current device.
  std::uint64_t small_piece_bytes = std::uint64_t{64} << 10;
  std::uint64_t staged_min_pieces = 256;
};

/// The automatic mode's decision, as a pure function (tested on the CPU).
KVOFFLOAD_EXPORT CopyMode choose_copy_mode(const CopyPlan& plan, const CudaBackendConfig& config,
                                           bool batch_available, bool kernel_available);

/// The production backend: a pool of CUDA streams (stores and loads apart, so both copy engines
/// work at once; loads at higher priority), copies per the mode, completion polled through
/// events without blocking, results per direction in submission order. Stores wait for the
/// engine's compute stream (set_compute_stream) because the KV they read is still being
/// written. A failed CUDA call fails its job with the error's name: never silent wrong data. A
/// bad pointer in kernel mode corrupts the CUDA context; every later job then fails too.
/// Thread-safety: submit and poll may be called from different threads.
class KVOFFLOAD_EXPORT CudaBackend final : public Backend {
 public:
  /// A CUDA build and at least one device.
  static bool available() noexcept;

  /// Throws cuda_error without a device (or a CUDA build), invalid_argument for a bad config.
  explicit CudaBackend(const CudaBackendConfig& config = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Ticket submit(CopyPlan plan) override;
  void poll(std::vector<BackendResult>& finished) override;
  void wait(Ticket ticket) override;
  void shutdown(bool drain) override;

  /// The device-table path, for engines whose block table is already on the GPU: `table`
  /// (device memory) holds the job's GPU block ids per offloaded block with the null blocks
  /// still in, group g's at [offsets[g], offsets[g + 1]) (offsets on the host). On one stream
  /// and with no host round trip, the backend drops the nulls (CUB), checks each group's count
  /// against job.gpu.group_sizes (a mismatch fails the job), builds the copy pieces from the
  /// layout and the job's host blocks, and copies them with the kernel. job.gpu.block_ids is
  /// not read. Needs mapped pinned memory (kernel_available); at most 8 groups of 8 tensors.
  Ticket submit_device_table(const TransferJob& job, Direction direction, const KvLayout& layout,
                             const HostRegion& host, const std::int32_t* table,
                             std::span<const std::int64_t> offsets);

  /// Stores submitted from now on first wait for the work queued on this cudaStream_t (the
  /// engine's compute stream) at their submission. 0 turns it off.
  void set_compute_stream(std::uintptr_t stream);
  [[nodiscard]] bool batch_available() const noexcept;
  [[nodiscard]] bool kernel_available() const noexcept;
  /// The mode the backend would use for `plan`.
  [[nodiscard]] CopyMode mode_for(const CopyPlan& plan) const noexcept;
  [[nodiscard]] const CudaBackendConfig& config() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Measures, on the current device, the piece size below which the kernel mode beats batch
/// copies, and returns `config` with small_piece_bytes set to it. Takes a second or two.
KVOFFLOAD_EXPORT CudaBackendConfig calibrate(const CudaBackendConfig& config);

/// GPU compaction of a device-resident block table (the per-offloaded-block GPU ids of a job,
/// null blocks included): CUB DeviceSelect drops the nulls and a segmented reduction counts
/// each group's real ids, checked against the job's group sizes, all on the stream with no
/// host round trip. Temporary storage is sized once, at construction. Thread-safety: one
/// thread at a time (its temporary storage is shared by the calls).
class KVOFFLOAD_EXPORT DeviceCompactor {
 public:
  DeviceCompactor(std::int64_t max_ids, int max_groups);
  ~DeviceCompactor();
  DeviceCompactor(const DeviceCompactor&) = delete;
  DeviceCompactor& operator=(const DeviceCompactor&) = delete;

  /// All pointers are device memory: ids (n), offsets (groups + 1), expected (groups), out (n),
  /// count (1), group_counts (groups), mismatch (1 int, set to 1 if a group's count differs).
  /// Throws invalid_argument beyond the sizes given at construction, cuda_error on failure.
  void compact(const std::int32_t* ids, std::int64_t n, const std::int64_t* offsets, int groups,
               const std::int64_t* expected, std::int32_t* out, std::int64_t* count,
               std::int64_t* group_counts, int* mismatch, std::uintptr_t stream);

 private:
  // Unused in a build without CUDA (whose constructor throws).
  [[maybe_unused]] std::int64_t max_ids_;
  [[maybe_unused]] int max_groups_;
  [[maybe_unused]] void* temp_ = nullptr;
  [[maybe_unused]] std::size_t temp_bytes_ = 0;
};

}  // namespace kvoffload
