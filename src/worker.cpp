#include "kvoffload/worker.hpp"

#include "expects.hpp"
#include "kvoffload/cuda_backend.hpp"
#include "kvoffload/host_backend.hpp"
#include "kvoffload/pinned_host_pool.hpp"

namespace kvoffload {
namespace {

std::unique_ptr<Backend> make_backend(const WorkerConfig& c) {
  if (c.backend == BackendKind::cuda) {
    if (!CudaBackend::available()) {
      throw cuda_error(
          "worker: the CUDA backend needs a CUDA build of kvoffload and a visible device");
    }
    CudaBackendConfig cc;
    cc.device = c.cuda_device;
    return std::make_unique<CudaBackend>(cc);
  }
  KVOFFLOAD_EXPECTS(c.threads >= 0, "worker: threads is {} (0: all cores)", c.threads);
  HostBackendConfig bc;
  bc.threads = c.threads;
  return std::make_unique<HostBackend>(bc);
}

}  // namespace

Worker::Worker(const WorkerConfig& c) : Worker(c, make_backend(c)) {}

Worker::Worker(const WorkerConfig& c, std::unique_ptr<Backend> backend) {
  KVOFFLOAD_EXPECTS(backend != nullptr, "worker: no backend");
  KVOFFLOAD_EXPECTS(c.host_blocks > 0, "worker: host_blocks is {} (must be > 0)", c.host_blocks);
  layout_ = std::make_unique<KvLayout>(c.tensors, c.groups, c.block_size_factor);
  PoolConfig pc;
  pc.block_bytes = layout_->pool_block_bytes();
  pc.host_blocks = c.host_blocks;
  pc.pinning = c.backend == BackendKind::cuda ? Pinning::require : Pinning::off;
  pool_ = std::make_unique<PinnedHostPool>(pc);
  const HostRegion region{reinterpret_cast<std::uintptr_t>(pool_->data()), pool_->num_blocks(),
                          static_cast<std::int64_t>(pool_->block_bytes()), 0,
                          static_cast<std::int64_t>(pool_->block_bytes())};
  TransferEngineConfig ec;
  ec.defer_stores = c.defer_stores;
  engine_ = std::make_unique<TransferEngine>(*layout_, region, std::move(backend), ec);
}

// The engine goes first: its backend may still be copying into the pool.
Worker::~Worker() {
  engine_.reset();
}

void Worker::submit(const TransferJob& job) {
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
  return engine_->get_finished();
}

void Worker::wait(std::span<const JobId> jobs) {
  engine_->wait(jobs);
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

}  // namespace kvoffload
