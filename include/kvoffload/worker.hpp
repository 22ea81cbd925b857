#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "kvoffload/config.hpp"
#include "kvoffload/cuda_backend.hpp"
#include "kvoffload/enums.hpp"
#include "kvoffload/export.hpp"
#include "kvoffload/job.hpp"
#include "kvoffload/kv_layout.hpp"
#include "kvoffload/tiers/disk_tier.hpp"
#include "kvoffload/tiers/shared_tier.hpp"
#include "kvoffload/transfer_engine.hpp"

namespace kvoffload {

class DeviceRuntime;

/// Everything a worker needs: the engine's KV tensors, which of them each group owns, and the
/// host pool's size (the scheduler's host_blocks).
struct WorkerConfig {
  std::vector<KvTensor> tensors;
  std::vector<std::vector<GroupTensor>> groups;
  std::int64_t block_size_factor = 1;
  std::int64_t host_blocks = 0;
  BackendKind backend = BackendKind::host;
  int threads = 0;      ///< host backend copy threads (0: all cores)
  int cuda_device = 0;  ///< CUDA backend device
  bool defer_stores = false;
  /// Back-pressure: the bytes of stores held at once (TransferEngineConfig; 0: no bound).
  std::uint64_t max_store_bytes_in_flight = 0;
  /// CUDA backend: the engine's compute stream (a cudaStream_t's value; 0 is the legacy
  /// default stream, PyTorch's default). Stores, and loads unless loads_wait_for_compute is
  /// false, wait on the device for the work queued on it when they are submitted. Unset:
  /// nothing is waited for, which is only right if the engine synchronizes before submitting.
  /// The host backend refuses it.
  std::optional<StreamHandle> compute_stream;
  bool loads_wait_for_compute = true;
  /// CUDA backend: how copies run (CudaBackendConfig::mode); auto picks per job.
  CopyMode copy_mode = CopyMode::automatic;
  /// CUDA backend: where its CUDA calls go. Null: the CUDA runtime; a SimDevice runs the
  /// backend on the CPU (the pool is then registered with the simulated device).
  std::shared_ptr<DeviceRuntime> runtime;
  /// CUDA backend: the pool is registered with the device in pieces of at most this many
  /// bytes, whole blocks each (PoolConfig::register_chunk_bytes; one huge registration fails
  /// on some machines). No copy spans two pieces.
  std::uint64_t host_register_chunk_bytes = std::uint64_t{1} << 30;
  /// The tiers' stores, in the order of SchedulerConfig::tiers (a tier job names its tier by
  /// index): disk tiers are opened and scanned here, shared tiers connect on first use.
  std::vector<TierStore> tiers;
  /// The weights' identity (SchedulerConfig::weights; derive_worker_config copies it): a disk
  /// tier's scan keeps only the slots written under its epoch.
  std::string weights;
  /// This worker's tensor-parallel rank, given to every tier's store (the one description
  /// holds the tiers for all ranks). 0: each store's own tp_rank; otherwise a store's tp_rank
  /// must be 0 or this (a conflict is refused: ranks would share slots or keys).
  int tp_rank = 0;
  /// What else makes two engines' pages of equal size incompatible: the order of a page's
  /// dimensions (an attention backend's NHD or HND), its dtype. Part of layout_description,
  /// so a disk tier's files and a shared tier's values written under another note are
  /// misses, never read as this layout. The vLLM connector gives each KV tensor's page shape,
  /// strides and dtype.
  std::string layout_note;
};

/// A worker's configuration with what it shares with its scheduler taken from the
/// scheduler's: block_size_factor, host_blocks (the manager's), weights and the tiers' stores, in
/// order, each store's tp_rank set to worker.tp_rank (WorkerConfig::tp_rank's rule). The rest
/// (tensors, groups, backend...) comes from `worker`, whose groups must be as many as the
/// scheduler's. Give the model's geometry and tiers once, in the SchedulerConfig, and derive the
/// worker's from it (in another process, from an equal SchedulerConfig). Throws invalid_argument
/// naming the field for a bad scheduler config or a tier without a store.
KVOFFLOAD_EXPORT WorkerConfig derive_worker_config(const SchedulerConfig& scheduler,
                                                   WorkerConfig worker);

class PinnedHostPool;

/// The worker side in one object, as the C API and the Python binding use it: the KV layout,
/// a host pool sized for it (pinned with the CUDA backend) and a TransferEngine. Thread-safety
/// as TransferEngine's.
class KVOFFLOAD_EXPORT Worker {
 public:
  /// Throws invalid_argument naming the field for a bad configuration, out_of_memory if the
  /// pool cannot be allocated, and cuda_error for the CUDA backend in a build or on a machine
  /// without CUDA.
  explicit Worker(const WorkerConfig& config);
  /// With a backend of the caller's (a FaultyBackend for fault injection, say); the config's
  /// backend, threads and cuda_device are then unused.
  Worker(const WorkerConfig& config, std::unique_ptr<Backend> backend);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  /// Starts a load or a store (as job.kind says); throws invalid_argument naming the job and
  /// group for a job that breaks the invariants or leaves the layout. Nothing is copied then.
  void submit(const TransferJob& job);
  void start_step();
  /// Load and store jobs finished, then tier jobs (FinishedTransfer::tier set).
  std::vector<FinishedTransfer> get_finished();
  /// Waits for these jobs, tier jobs included (ids the worker does not know are ignored).
  void wait(std::span<const JobId> jobs);
  /// Starts a tier job on tier job.tier. Throws invalid_argument naming the job for a tier
  /// that is not configured or a job that does not fit it.
  void submit_tier(const TierJob& job);
  [[nodiscard]] std::size_t num_tiers() const noexcept { return tiers_.size(); }
  /// What tier t is; throws invalid_argument past the tiers.
  [[nodiscard]] Medium tier_medium(std::size_t t) const;
  /// Checks that this worker fits the scheduler `config` describes: the same block_size_factor,
  /// host_blocks and number of groups; its tiers as many, of the same kinds, in the same order
  /// (tier jobs name a tier by index only); a disk tier with at least the scheduler's blocks
  /// as slots; a shared tier in the namespace of the config's store (when it has one). A worker
  /// configured apart from its scheduler (not by derive_worker_config) is checked once, at
  /// start. Throws invalid_argument naming the first difference.
  void check_matches(const SchedulerConfig& config) const;
  /// Clears every tier (Tier::clear: a disk tier empties its slots): call it after
  /// Scheduler::reset_cache and the step's flush set, so the old cache's blocks do not come
  /// back after a restart. Never waits for tier jobs issued before the reset (a slow disk):
  /// their writes are skipped or erased once they land.
  void clear_tiers();
  /// Tier `t` of this worker, in SchedulerConfig::tiers' order (its scan, for
  /// Scheduler::restore_tier, and its counters). Throws invalid_argument past the tiers.
  [[nodiscard]] const Tier& tier(std::size_t t) const;
  /// Frees tier `t`'s start-up scan (Tier::release_scan) once Scheduler::restore_tier has
  /// read it: a disk tier would otherwise keep a key per slot for the worker's life. Throws
  /// invalid_argument past the tiers.
  void release_tier_scan(std::size_t t);
  /// Tier `t` as the kind it is, for that kind's own details (a disk tier's I/O engine and
  /// slot counters, a shared tier's namespace and counters). Throws invalid_argument for a
  /// tier that is not configured or of another kind.
  [[nodiscard]] const DiskTier& disk_tier(std::size_t t) const;
  [[nodiscard]] const SharedTier& shared_tier(std::size_t t) const;
  /// The description of the host block layout that disk_layout_digest hashes.
  [[nodiscard]] std::string layout_description() const;
  /// Changes the compute stream for jobs submitted from now on (WorkerConfig::compute_stream);
  /// nullopt turns the waits off. Throws invalid_argument for a backend other than CUDA or for
  /// cudaStreamPerThread.
  void set_compute_stream(std::optional<StreamHandle> stream);
  /// The CUDA backend's counts of the modes its jobs really used; nullopt for another backend.
  [[nodiscard]] std::optional<CudaBackendStats> cuda_stats() const;

  /// Host block `id` of the pool (throws invalid_argument if out of range).
  [[nodiscard]] std::span<std::byte> host_block(HostBlockId id) const;
  [[nodiscard]] std::int64_t num_host_blocks() const noexcept;
  [[nodiscard]] const KvLayout& layout() const noexcept { return *layout_; }
  [[nodiscard]] TransferStats stats() const;
  /// The stores held reach half of max_store_bytes_in_flight: give it to the scheduler
  /// (Scheduler::set_store_pressure, any worker's) before its next build_step.
  [[nodiscard]] bool store_pressure() const;

 private:
  void init(const WorkerConfig& config, std::unique_ptr<Backend> backend);

  std::unique_ptr<KvLayout> layout_;
  std::unique_ptr<PinnedHostPool> pool_;
  std::unique_ptr<TransferEngine> engine_;
  std::string weights_;      // the weights its disk tiers restored (WorkerConfig::weights)
  std::string layout_note_;  // WorkerConfig::layout_note
  std::vector<std::unique_ptr<Tier>> tiers_;  // destroyed first: they read the pool
};

}  // namespace kvoffload
