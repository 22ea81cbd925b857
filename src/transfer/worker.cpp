#include "kvoffload/worker.hpp"

#include <fmt/format.h>

#include "common/expects.hpp"
#include "kvoffload/cuda_backend.hpp"
#include "kvoffload/device_runtime.hpp"
#include "kvoffload/host_backend.hpp"
#include "kvoffload/pinned_host_pool.hpp"

namespace kvoffload {
namespace {

/// Store t as the worker of rank `rank` runs it. A store's own tp_rank of 0 means "the
/// worker's"; any other must be the worker's, or ranks would share slots or keys silently.
TierStore with_rank(TierStore store, int rank, std::size_t t) {
  std::visit(
      [&](auto& s) {
        KVOFFLOAD_EXPECTS(s.tp_rank == 0 || rank == 0 || s.tp_rank == rank,
                          "worker: tiers[{}].tp_rank is {}, but the worker's tp_rank is {} (give "
                          "the rank once, as WorkerConfig::tp_rank)",
                          t, s.tp_rank, rank);
        if (rank != 0) s.tp_rank = rank;
      },
      store);
  return store;
}

/// The pool's pinning and the host-side checks of the config, before anything is allocated.
void check_config(const WorkerConfig& c) {
  KVOFFLOAD_EXPECTS(c.threads >= 0, "worker: threads is {} (0: all cores)", c.threads);
  KVOFFLOAD_EXPECTS(!c.compute_stream || *c.compute_stream != per_thread_default_stream,
                    "worker: compute_stream is cudaStreamPerThread, which names a different "
                    "stream on each thread; pass the engine's stream itself");
  KVOFFLOAD_EXPECTS(!c.compute_stream || c.backend == BackendKind::cuda,
                    "worker: compute_stream is set but the backend is the host backend (it is "
                    "for the CUDA backend)");
  KVOFFLOAD_EXPECTS(c.runtime == nullptr || c.backend == BackendKind::cuda,
                    "worker: runtime is set but the backend is the host backend");
}

std::unique_ptr<Backend> make_backend(const WorkerConfig& c, const PinnedHostPool& pool) {
  if (c.backend == BackendKind::cuda) {
    CudaBackendConfig cc;
    cc.device = c.cuda_device;
    cc.compute_stream = c.compute_stream;
    cc.loads_wait_for_compute = c.loads_wait_for_compute;
    cc.mode = c.copy_mode;
    cc.host_base = reinterpret_cast<std::uintptr_t>(pool.data());
    cc.host_bytes = pool.size_bytes();
    cc.host_registration_bytes =
        static_cast<std::uint64_t>(pool.blocks_per_registration()) * pool.block_bytes();
    if (c.runtime != nullptr) return std::make_unique<CudaBackend>(cc, c.runtime);
    return std::make_unique<CudaBackend>(cc);
  }
  HostBackendConfig bc;
  bc.threads = c.threads;
  return std::make_unique<HostBackend>(bc);
}

}  // namespace

Worker::Worker(const WorkerConfig& c) {
  init(c, nullptr);
}

Worker::Worker(const WorkerConfig& c, std::unique_ptr<Backend> backend) {
  KVOFFLOAD_EXPECTS(backend != nullptr, "worker: no backend");
  init(c, std::move(backend));
}

void Worker::init(const WorkerConfig& c, std::unique_ptr<Backend> backend) {
  check_config(c);
  KVOFFLOAD_EXPECTS(c.host_blocks > 0, "worker: host_blocks is {} (must be > 0)", c.host_blocks);
  weights_ = c.weights;
  layout_note_ = c.layout_note;
  if (backend == nullptr && c.backend == BackendKind::cuda && c.runtime == nullptr &&
      !CudaBackend::available()) {
    throw unsupported(
        "worker: the CUDA backend needs a CUDA build of kvoffload and a visible device");
  }
  layout_ = std::make_unique<KvLayout>(c.tensors, c.groups, c.block_size_factor);
  PoolConfig pc;
  pc.block_bytes = layout_->pool_block_bytes();
  pc.host_blocks = c.host_blocks;
  // Pinned (and mapped) for the CUDA backend, by its device runtime (the CUDA runtime, or a
  // simulated device), in the worker's device's context (no context on device 0).
  if (c.backend == BackendKind::cuda || c.runtime != nullptr) {
    pc.pinning = Pinning::require;
    pc.register_chunk_bytes = c.host_register_chunk_bytes;
    pc.device = c.cuda_device;
    pc.runtime = c.runtime;
  } else {
    pc.pinning = Pinning::off;
  }
  pool_ = std::make_unique<PinnedHostPool>(pc);
  if (backend == nullptr) {
    backend = make_backend(c, *pool_);
  } else if (c.compute_stream) {
    auto* cuda = dynamic_cast<CudaBackend*>(backend.get());
    KVOFFLOAD_EXPECTS(cuda != nullptr,
                      "worker: compute_stream is set but the backend is not the CUDA backend");
    cuda->set_compute_stream(c.compute_stream);
  }
  if (const auto* cuda = dynamic_cast<const CudaBackend*>(backend.get())) {
    cuda->check_tensors(c.tensors);
  }
  const HostRegion region{
      reinterpret_cast<std::uintptr_t>(pool_->data()), pool_->num_blocks(),
      static_cast<std::int64_t>(pool_->block_bytes()), 0,
      static_cast<std::int64_t>(pool_->block_bytes()), pool_->blocks_per_registration()};
  TransferEngineConfig ec;
  ec.defer_stores = c.defer_stores;
  ec.max_store_bytes_in_flight = c.max_store_bytes_in_flight;
  engine_ = std::make_unique<TransferEngine>(*layout_, region, std::move(backend), ec);
  const std::string layout = layout_description();
  auto host_block_of = [this](HostBlockId id) { return host_block(id); };
  for (std::size_t t = 0; t < c.tiers.size(); ++t) {
    const TierStore store = with_rank(c.tiers[t], c.tp_rank, t);
    if (const auto* disk = std::get_if<DiskTierConfig>(&store)) {
      tiers_.push_back(std::make_unique<DiskTier>(*disk, layout, pool_->block_bytes(),
                                                  host_block_of, weights_epoch(c.weights)));
    } else {
      tiers_.push_back(std::make_unique<SharedTier>(std::get<SharedTierConfig>(store),
                                                    layout_->block_size_factor(), layout,
                                                    pool_->block_bytes(), host_block_of));
    }
  }
}

WorkerConfig derive_worker_config(const SchedulerConfig& scheduler, WorkerConfig worker) {
  scheduler.validate();
  KVOFFLOAD_EXPECTS(worker.groups.size() == scheduler.groups.size(),
                    "worker: groups: tensors for {} group(s), but the scheduler has {}",
                    worker.groups.size(), scheduler.groups.size());
  worker.block_size_factor = scheduler.block_size_factor;
  worker.host_blocks = scheduler.manager.host_blocks;
  worker.weights = scheduler.weights;
  worker.tiers.clear();
  for (std::size_t t = 0; t < scheduler.tiers.size(); ++t) {
    KVOFFLOAD_EXPECTS(scheduler.tiers[t].store.has_value(),
                      "tiers[{}].store: a worker needs the tier's store (a DiskTierConfig or a "
                      "SharedTierConfig)",
                      t);
    worker.tiers.push_back(with_rank(*scheduler.tiers[t].store, worker.tp_rank, t));
  }
  return worker;
}

std::string Worker::layout_description() const {
  std::string d =
      fmt::format("f={} block_bytes={}", layout_->block_size_factor(), pool_->block_bytes());
  for (std::size_t g = 0; g < layout_->num_groups(); ++g) {
    d += fmt::format(" g{}:{}[", g, layout_->host_block_bytes(g));
    for (const GroupTensor& t : layout_->group(g))
      d += fmt::format("{}:{},", t.tensor, t.page_bytes);
    d += "]";
  }
  if (!layout_note_.empty()) d += " note=" + layout_note_;
  return d;
}

const Tier& Worker::tier(std::size_t t) const {
  KVOFFLOAD_EXPECTS(t < tiers_.size(), "worker: tier {} is not configured ({} tiers)", t,
                    tiers_.size());
  return *tiers_[t];
}

void Worker::release_tier_scan(std::size_t t) {
  KVOFFLOAD_EXPECTS(t < tiers_.size(), "worker: tier {} is not configured ({} tiers)", t,
                    tiers_.size());
  tiers_[t]->release_scan();
}

const DiskTier& Worker::disk_tier(std::size_t t) const {
  const Tier& tt = tier(t);
  KVOFFLOAD_EXPECTS(tt.medium() == Medium::disk, "worker: tier {} is a {} tier, not a disk tier", t,
                    to_string(tt.medium()));
  return static_cast<const DiskTier&>(tt);
}

const SharedTier& Worker::shared_tier(std::size_t t) const {
  const Tier& tt = tier(t);
  KVOFFLOAD_EXPECTS(tt.medium() == Medium::shared,
                    "worker: tier {} is a {} tier, not a shared tier", t, to_string(tt.medium()));
  return static_cast<const SharedTier&>(tt);
}

void Worker::check_matches(const SchedulerConfig& config) const {
  config.validate();  // a store of the tier's medium, among the rest
  KVOFFLOAD_EXPECTS(config.block_size_factor == layout_->block_size_factor(),
                    "worker: block_size_factor is {}, but the scheduler's is {}",
                    layout_->block_size_factor(), config.block_size_factor);
  KVOFFLOAD_EXPECTS(config.manager.host_blocks == num_host_blocks(),
                    "worker: host_blocks is {}, but the scheduler's is {}", num_host_blocks(),
                    config.manager.host_blocks);
  KVOFFLOAD_EXPECTS(config.groups.size() == layout_->num_groups(),
                    "worker: {} group(s), but the scheduler has {}", layout_->num_groups(),
                    config.groups.size());
  KVOFFLOAD_EXPECTS(config.weights == weights_,
                    "worker: weights is \"{}\", but the scheduler's is \"{}\" (its disk tiers "
                    "restored the other weights' slots)",
                    weights_, config.weights);
  const std::span<const TierConfig> scheduler_tiers = config.tiers;
  KVOFFLOAD_EXPECTS(scheduler_tiers.size() == tiers_.size(),
                    "worker: {} tier(s), but the scheduler has {}", tiers_.size(),
                    scheduler_tiers.size());
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    const TierConfig& want = scheduler_tiers[t];
    KVOFFLOAD_EXPECTS(want.medium == tiers_[t]->medium(),
                      "worker: tier {} is a {} tier, but the scheduler's tier {} is {}", t,
                      to_string(tiers_[t]->medium()), t, to_string(want.medium));
    if (want.medium == Medium::disk) {
      // The scheduler hands out slots below its blocks: each must exist here.
      KVOFFLOAD_EXPECTS(want.blocks <= tiers_[t]->num_slots(),
                        "worker: tier {} has {} slot(s), but the scheduler's tier {} has {} blocks",
                        t, tiers_[t]->num_slots(), t, want.blocks);
    } else if (const auto* store =
                   want.store ? std::get_if<SharedTierConfig>(&*want.store) : nullptr) {
      // The scheduler's presence checks ask the namespace its store names.
      const SharedTierConfig& s = *store;
      const std::string ns = shared_namespace(s.name, s.tp_size, config.block_size_factor);
      KVOFFLOAD_EXPECTS(ns == shared_tier(t).key_namespace(),
                        "worker: tier {} writes namespace {}, but the scheduler's tier {} (name "
                        "\"{}\", tp_size {}) checks namespace {}",
                        t, shared_tier(t).key_namespace(), t, s.name, s.tp_size, ns);
    }
  }
}

Medium Worker::tier_medium(std::size_t t) const {
  return tier(t).medium();
}

void Worker::clear_tiers() {
  for (const auto& tier : tiers_) tier->clear();
}

void Worker::submit_tier(const TierJob& job) {
  KVOFFLOAD_EXPECTS(job.tier < num_tiers(), "tier job {}: tier {} is not configured ({} tiers)",
                    job.id, job.tier, num_tiers());
  tiers_[job.tier]->submit(job);  // refuses a transfer's kind, naming the job
}

// The engine goes first: its backend may still be copying into the pool.
Worker::~Worker() {
  tiers_.clear();
  engine_.reset();
}

void Worker::set_compute_stream(std::optional<StreamHandle> stream) {
  auto* cuda = dynamic_cast<CudaBackend*>(&engine_->backend());
  KVOFFLOAD_EXPECTS(cuda != nullptr,
                    "worker: set_compute_stream needs the CUDA backend (this worker's is not)");
  cuda->set_compute_stream(stream);
}

std::optional<CudaBackendStats> Worker::cuda_stats() const {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&engine_->backend());
  if (cuda == nullptr) return std::nullopt;
  return cuda->stats();
}

void Worker::submit(const TransferJob& job) {
  KVOFFLOAD_EXPECTS(!is_tier_job(job.kind),
                    "job {}: kind {} is a tier job's (a TierJob, for Worker::submit_tier)", job.id,
                    to_string(job.kind));
  if (job.kind == JobKind::load) {
    engine_->submit_load(job);
  } else {
    engine_->submit_store(job);
  }
}

void Worker::start_step() {
  engine_->start_step();
}

std::vector<FinishedTransfer> Worker::get_finished() {
  std::vector<FinishedTransfer> out = engine_->get_finished();
  std::vector<FinishedTierJob> tier_jobs;
  for (const auto& tier : tiers_) {
    for (const FinishedTierJob& f : tier->get_finished()) tier_jobs.push_back(f);
  }
  {
    for (const FinishedTierJob& f : tier_jobs) {
      FinishedTransfer t;
      t.job = f.job;
      t.ok = f.ok;
      t.kind = f.kind;
      if (!f.ok) t.error = fmt::format("{} block(s) failed", f.failed_blocks);
      out.push_back(std::move(t));
    }
  }
  return out;
}

void Worker::wait(std::span<const JobId> jobs) {
  engine_->wait(jobs);
  for (const auto& tier : tiers_) tier->wait(jobs);
}

std::span<std::byte> Worker::host_block(HostBlockId id) const {
  KVOFFLOAD_EXPECTS(id >= 0 && id < pool_->num_blocks(),
                    "worker: host block {} is out of range (0 to {})", id, pool_->num_blocks() - 1);
  return {pool_->block(id), pool_->block_bytes()};
}

std::int64_t Worker::num_host_blocks() const noexcept {
  return pool_->num_blocks();
}

TransferStats Worker::stats() const {
  return engine_->stats();
}

bool Worker::store_pressure() const {
  return engine_->store_pressure();
}

}  // namespace kvoffload
