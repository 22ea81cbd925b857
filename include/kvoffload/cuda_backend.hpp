#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "kvoffload/backend.hpp"
#include "kvoffload/enums.hpp"
#include "kvoffload/export.hpp"
#include "kvoffload/kv_layout.hpp"
#include "kvoffload/types.hpp"

namespace kvoffload {

struct CudaBackendConfig {
  int device = 0;
  CopyMode mode = CopyMode::automatic;
  int store_streams = 2;  ///< device-to-host streams (lowest priority)
  int load_streams = 2;   ///< host-to-device streams (highest priority)
  int kernel_ctas = 8;    ///< CTAs of the copy kernels: few, so the forward pass keeps its SMs
  int kernel_threads = 256;
  /// Device memory per backend for the staged path; allocated only when a job can be staged
  /// (mode staged, or automatic with staged_min_pieces).
  std::uint64_t staging_bytes = std::uint64_t{64} << 20;
  /// Pinned and device memory per stream for uploading piece arrays and the device-table
  /// path's inputs and scratch (rings allocated once; no job allocates memory of its own). A
  /// kernel job that does not fit runs on the copy engines instead; a device-table job that
  /// does not fit fails, naming this field.
  std::uint64_t ring_bytes = std::uint64_t{4} << 20;
  // automatic mode: pieces averaging under the direction's threshold go to the kernel (or, for
  // jobs of at least staged_min_pieces pieces when that is not 0, staged); larger ones to
  // batch. Kernel loads read over PCIe and are slower than kernel stores, so the thresholds
  // differ; `calibrate` measures both on the current device.
  std::uint64_t store_small_piece_bytes = std::uint64_t{64} << 10;
  std::uint64_t load_small_piece_bytes = std::uint64_t{32} << 10;
  /// 0 (default): automatic never picks staged. Staged (issue 49, item 7) gathers a job's small
  /// pages on the device into staging laid out as the host blocks' bytes and moves each run of
  /// adjacent host bytes with one DMA (loads: the reverse), so small pages reach the link's
  /// large-copy rate both ways at once; not yet measured on a GPU, hence off by default. (The
  /// earlier staged store, with a CPU scatter out of pinned staging, ran at 5-6 GB/s on an
  /// H200.)
  std::uint64_t staged_min_pieces = 0;
  /// The engine's compute stream (a cudaStream_t's value; 0 is the legacy default stream,
  /// which is PyTorch's default stream). Unset: nothing is waited for. Set: every store, and
  /// every load unless loads_wait_for_compute is false, first waits for the work queued on it
  /// when the job is submitted: the forward pass writing the KV a store reads, or reading
  /// blocks a load overwrites. cudaStreamPerThread (2) is refused: it names a different
  /// stream on the backend's threads.
  std::optional<StreamHandle> compute_stream;
  bool loads_wait_for_compute = true;
  /// The pinned host region jobs copy to and from (the worker's pool). When given, the
  /// backend checks at construction that it is registered and mapped for the device; if not
  /// (an unpinned pool, say), the kernel, staged and device-table modes are disabled with a
  /// logged reason instead of faulting. Unset (0 bytes): only the device's capability counts.
  std::uintptr_t host_base = 0;
  std::uint64_t host_bytes = 0;
  /// The region's registrations, from host_base, each this many bytes (the pool's
  /// blocks_per_registration times its block bytes); 0: one. The staged path merges adjacent
  /// host bytes into one copy only within a registration (CUDA refuses a copy across two).
  std::uint64_t host_registration_bytes = 0;
};

/// What the backend did (for benchmarks: which mode each job really used).
struct CudaBackendStats {
  std::uint64_t jobs_batch = 0, jobs_memcpy = 0, jobs_kernel = 0, jobs_staged = 0;
  std::uint64_t jobs_device_table = 0;
  std::uint64_t staged_fell_back = 0;  ///< staged jobs run as kernel jobs: staging was full
  /// Jobs refused because the compute stream was capturing a CUDA graph (failed, not run).
  std::uint64_t refused_capturing = 0;
  /// Kernel or staged jobs run by the copy engines (batch, else memcpy) instead: their piece
  /// array did not fit the stream's upload rings then (ring_bytes).
  std::uint64_t ring_fell_back = 0;
};

/// The automatic mode's decision, as a pure function (tested on the CPU).
KVOFFLOAD_EXPORT CopyMode choose_copy_mode(const CopyPlan& plan, const CudaBackendConfig& config,
                                           bool batch_available, bool kernel_available);

class DeviceRuntime;

/// The production backend: a pool of CUDA streams (stores and loads apart, so both copy engines
/// work at once; loads at higher priority), copies per the mode, completion polled through
/// events without blocking, results per direction in submission order.
///
/// Ordering: with a compute stream set, jobs wait for the engine's work queued before their
/// submission (see CudaBackendConfig::compute_stream), on the device, without blocking the
/// host.
///
/// Errors: a CUDA call that fails when it is made (a bad argument, a range past the end of an
/// allocation, out of memory) fails its job with the error's name, and nothing else. A fault
/// while a kernel or copy runs (cudaErrorIllegalAddress, say) is different: CUDA poisons the
/// whole context, the engine's too, and every later job and CUDA call fails; the process must
/// be restarted. Failed jobs are never reported as ok: no silent wrong data.
///
/// Every CUDA call goes through a DeviceRuntime (device_runtime.hpp): the CUDA runtime, or a
/// SimDevice in tests. Thread-safety: submit, poll, wait and shutdown may be called from
/// different threads; a job waited for stays alive even when another thread polls it.
class KVOFFLOAD_EXPORT CudaBackend final : public Backend {
 public:
  /// A CUDA build and at least one device.
  static bool available() noexcept;

  /// On the CUDA runtime. Throws cuda_error without a device (or a CUDA build),
  /// invalid_argument naming the field for a bad config.
  explicit CudaBackend(const CudaBackendConfig& config = {});
  /// On `runtime` (a SimDevice, say).
  CudaBackend(const CudaBackendConfig& config, std::shared_ptr<DeviceRuntime> runtime);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  /// Throws invalid_argument (nothing queued) for a plan whose total_bytes is not the sum of
  /// its copies. Once the job is queued it never throws: any failure fails the job, reported
  /// once by poll.
  Ticket submit(CopyPlan plan) override;
  void poll(std::vector<BackendResult>& finished) override;
  void wait(Ticket ticket) override;
  /// Work already on the GPU cannot be recalled: both ways wait for it before returning.
  /// Without drain, the jobs not finished by then are reported failed with "cancelled".
  void shutdown(bool drain) override;
  /// An event of the compute stream's work so far (joined with the streams switched away from
  /// whose work is not done), for a deferred store's plan. 0 without a compute stream, or if
  /// recording failed (logged; the plan then waits for the compute stream at submit).
  ComputeMark mark_compute() noexcept override;
  void drop_mark(ComputeMark mark) noexcept override;

  /// The device-table path, for engines whose block table is already on the GPU: `table`
  /// (device memory) holds the job's GPU block ids per offloaded block with the null blocks
  /// still in, group g's at [offsets[g], offsets[g + 1]) (offsets on the host, from 0,
  /// non-decreasing). On one stream and with no host round trip, the backend drops the nulls
  /// (CUB), checks each group's count against job.gpu.group_sizes and each id against the
  /// group's tensors, builds the copy pieces from the layout and the job's host blocks, and
  /// copies them with the kernel. A job that fails the check copies no byte and is reported
  /// failed. job.gpu.block_ids is not read; everything else is checked on the host like the
  /// planner does (invalid_argument). Needs mapped pinned memory (kernel_available); at most
  /// 8 groups of 8 tensors.
  Ticket submit_device_table(const TransferJob& job, JobKind kind, const KvLayout& layout,
                             const HostRegion& host, const std::int32_t* table,
                             std::span<const std::int64_t> offsets);

  /// Changes the compute stream for jobs submitted from now on (see
  /// CudaBackendConfig::compute_stream). The old stream is not forgotten: jobs submitted after
  /// the switch also wait for the work queued on it up to the switch, until that work is done
  /// (deferred stores of its pass, loads over blocks it reads). The engine keeps a stream
  /// alive until it has switched away from it. nullopt turns every wait off, old streams'
  /// included. A stream of another device is refused (invalid_argument). A stream capturing a
  /// CUDA graph when it is switched away from cannot be recorded without joining its capture:
  /// its work from before the capture is then not waited for (logged).
  ///
  /// Graph captures: a job that would wait for a compute stream while it captures a graph is
  /// refused (failed, "capturing a CUDA graph", CudaBackendStats::refused_capturing), and so
  /// is a deferred store submitted during a capture; loads that need no compute wait run.
  void set_compute_stream(std::optional<StreamHandle> stream);
  /// Refuses (invalid_argument, naming the tensor and both devices) KV tensors that are not
  /// memory of the backend's device, first and last byte: a copy kernel would fault on them
  /// (an illegal address poisons the engine's context too). The Worker calls it.
  void check_tensors(std::span<const KvTensor> tensors) const;
  [[nodiscard]] bool batch_available() const noexcept;
  [[nodiscard]] bool kernel_available() const noexcept;
  /// The mode the backend would use for `plan` (before staging space is considered).
  [[nodiscard]] CopyMode mode_for(const CopyPlan& plan) const noexcept;
  [[nodiscard]] const CudaBackendConfig& config() const noexcept;
  [[nodiscard]] CudaBackendStats stats() const;
  /// Test-only: jobs stop waiting for the compute stream, so that tests can show they catch
  /// the race this causes. Never in production.
  void unsafe_skip_compute_wait_for_testing(bool skip);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// One size of calibrate's measurements: seconds for the same jobs in each mode, under load
/// (staged_s < 0: not measured, the device cannot stage).
struct CalibrationSample {
  JobKind dir = JobKind::store;
  std::uint64_t piece = 0;
  double kernel_s = 0, staged_s = -1, batch_s = 0;
};

/// calibrate's decision from its measurements, as a pure function (tested on the CPU): per
/// direction, the small-piece threshold is twice the largest piece at which the kernel or
/// staged mode was no slower than batch (the smallest size measured if none was); staged is
/// turned on (staged_min_pieces 1) when it beat the kernel at most of those sizes.
KVOFFLOAD_EXPORT CudaBackendConfig choose_calibration(const CudaBackendConfig& config,
                                                      std::span<const CalibrationSample> samples);

/// How much calibrate measures: jobs of `bytes` in pieces from min_piece to max_piece
/// (doubling), `reps` timed jobs per mode and size.
struct CalibrateOptions {
  std::uint64_t bytes = std::uint64_t{64} << 20;
  std::uint64_t min_piece = 4096;
  std::uint64_t max_piece = std::uint64_t{4} << 20;
  int reps = 3;
};

/// Measures, on config.device and under a serving engine's load (each direction timed while
/// the other direction copies as many bytes at once), where the small-piece modes (kernel,
/// staged) beat batch copies, for stores and loads apart, and whether staged beats the kernel
/// there. Returns `config` with store_small_piece_bytes, load_small_piece_bytes and
/// staged_min_pieces (1: automatic stages small-piece jobs; 0: it uses the kernel) set. Takes a
/// few seconds on a GPU. `runtime` null: the CUDA runtime.
KVOFFLOAD_EXPORT CudaBackendConfig calibrate(const CudaBackendConfig& config,
                                             std::shared_ptr<DeviceRuntime> runtime = nullptr,
                                             const CalibrateOptions& options = {});

/// GPU compaction of a device-resident block table (the per-offloaded-block GPU ids of a job,
/// null blocks included): CUB DeviceSelect drops the nulls and a segmented reduction counts
/// each group's real ids, checked against the job's group sizes, all on the stream with no
/// host round trip. Temporary storage is sized once, at construction, on one device. CUB keeps
/// state in it that it initialises asynchronously on each call's stream, so each call waits
/// (on the device, through an event) for the one before it, whatever streams they use.
/// Thread-safe.
class KVOFFLOAD_EXPORT DeviceCompactor {
 public:
  /// `runtime` null: the CUDA runtime (throws cuda_error in a build without CUDA). `device`
  /// -1: the calling thread's current device. Streams passed to compact() must belong to it.
  DeviceCompactor(std::int64_t max_ids, int max_groups,
                  std::shared_ptr<DeviceRuntime> runtime = nullptr, int device = -1);
  ~DeviceCompactor();
  DeviceCompactor(const DeviceCompactor&) = delete;
  DeviceCompactor& operator=(const DeviceCompactor&) = delete;

  /// All pointers are device memory: ids (n), offsets (groups + 1), expected (groups), out (n),
  /// count (1), group_counts (groups), mismatch (1 int, set to 1 if a group's count differs).
  /// Throws invalid_argument beyond the sizes given at construction or for a stream of another
  /// device, cuda_error on failure.
  void compact(const std::int32_t* ids, std::int64_t n, const std::int64_t* offsets, int groups,
               const std::int64_t* expected, std::int32_t* out, std::int64_t* count,
               std::int64_t* group_counts, int* mismatch, StreamHandle stream);

 private:
  std::shared_ptr<DeviceRuntime> rt_;
  std::int64_t max_ids_;
  int max_groups_;
  int device_ = 0;
  void* temp_ = nullptr;
  std::size_t temp_bytes_ = 0;
  EventHandle last_ = 0;  // an event: the previous call's work, recorded on its stream
  bool recorded_ = false;
  std::mutex mutex_;
};

}  // namespace kvoffload
