// CudaBackend: streams, events, and the four copy modes. Host code (compiled by the C++
// compiler against the CUDA runtime); the kernels live in copy_kernels.cu.

#include "kvoffload/cuda_backend.hpp"

#include <cuda.h>  // driver types for cuMemcpyBatchAsync, resolved at run time
#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>

#include <fmt/format.h>

#include "compaction.cuh"
#include "copy_kernels.cuh"
#include "cuda_check.hpp"
#include "cuda_raii.hpp"
#include "expects.hpp"
#include "kvoffload/device.hpp"

namespace kvoffload {
namespace {

// cuMemcpyBatchAsync as the 12.8 driver ABI defines it (with failIdx): requesting that version
// keeps a build with CUDA 13 headers working on any 12.8+ driver.
using BatchFn = CUresult (*)(CUdeviceptr*, CUdeviceptr*, std::size_t*, std::size_t,
                             CUmemcpyAttributes*, std::size_t*, std::size_t, std::size_t*,
                             CUstream);

BatchFn resolve_batch() noexcept {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  if (cudaGetDriverEntryPointByVersion("cuMemcpyBatchAsync", &fn, 12080, cudaEnableDefault,
                                       &status) != cudaSuccess ||
      status != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<BatchFn>(fn);
}

struct NvtxRange {
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

std::vector<detail::DevicePiece> pieces_of(const CopyPlan& plan) {
  std::vector<detail::DevicePiece> out;
  out.reserve(plan.descriptors.size());
  for (const CopyDescriptor& d : plan.descriptors) out.push_back({d.src, d.dst, d.bytes});
  return out;
}

}  // namespace

struct CudaBackend::Impl {
  struct Job {
    Ticket ticket = 0;
    CopyPlan plan;
    CopyMode mode = CopyMode::memcpy;
    detail::CudaEvent done;
    bool failed = false;  // at submission, or detected when polled
    std::string error;
    bool finished = false;
    std::chrono::steady_clock::time_point start;
    double seconds = 0;
    std::vector<std::uint64_t> staged_offsets;  // staged mode: where each piece lies
    const void* staging_base = nullptr;         // staged mode: the host staging buffer
    int* mismatch = nullptr;  // device-table path: pinned flag, set if group counts differ
    ~Job() {
      if (mismatch != nullptr) (void)cudaFreeHost(mismatch);
    }
  };

  explicit Impl(const CudaBackendConfig& c) : config(c), scope(c.device) {
    int least = 0, greatest = 0;
    KVOFFLOAD_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    stores = std::make_unique<detail::StreamPool>(static_cast<std::size_t>(c.store_streams), least);
    loads =
        std::make_unique<detail::StreamPool>(static_cast<std::size_t>(c.load_streams), greatest);
    batch = resolve_batch();
    int host_ptr = 0;
    KVOFFLOAD_CUDA_TRY(
        cudaDeviceGetAttribute(&host_ptr, cudaDevAttrCanUseHostPointerForRegisteredMem, c.device));
    kernel_ok = host_ptr == 1;
    if (kernel_ok && c.staging_bytes > 0) {
      KVOFFLOAD_CUDA_TRY(cudaMalloc(&device_staging, c.staging_bytes));
      KVOFFLOAD_CUDA_TRY(cudaMallocHost(&host_staging, c.staging_bytes));
    }
  }

  ~Impl() {
    (void)cudaDeviceSynchronize();
    if (device_staging != nullptr) (void)cudaFree(device_staging);
    if (host_staging != nullptr) (void)cudaFreeHost(host_staging);
  }

  /// Enqueues the job's copies; a failing call fails the job (the caller records its event).
  cudaError_t enqueue(Job& job, cudaStream_t stream) {
    const CopyPlan& plan = job.plan;
    const bool store = plan.direction == Direction::store;
    switch (job.mode) {
      case CopyMode::memcpy:
        for (const CopyDescriptor& d : plan.descriptors) {
          const cudaError_t e =
              cudaMemcpyAsync(reinterpret_cast<void*>(d.dst), reinterpret_cast<const void*>(d.src),
                              d.bytes, cudaMemcpyDefault, stream);
          if (e != cudaSuccess) return e;
        }
        return cudaSuccess;
      case CopyMode::batch: {
        const std::size_t n = plan.descriptors.size();
        if (n == 0) return cudaSuccess;
        std::vector<CUdeviceptr> dsts(n), srcs(n);
        std::vector<std::size_t> sizes(n);
        for (std::size_t i = 0; i < n; ++i) {
          dsts[i] = plan.descriptors[i].dst;
          srcs[i] = plan.descriptors[i].src;
          sizes[i] = plan.descriptors[i].bytes;
        }
        CUmemcpyAttributes attr{};
        // Stores read live KV: in stream order. Loads read pinned host blocks nobody writes.
        attr.srcAccessOrder =
            store ? CU_MEMCPY_SRC_ACCESS_ORDER_STREAM : CU_MEMCPY_SRC_ACCESS_ORDER_ANY;
        std::size_t index = 0, fail = 0;
        const CUresult r = batch(dsts.data(), srcs.data(), sizes.data(), n, &attr, &index, 1, &fail,
                                 reinterpret_cast<CUstream>(stream));
        if (r != CUDA_SUCCESS) {
          job.error = fmt::format("cuMemcpyBatchAsync failed with CUresult {} at copy {}",
                                  static_cast<int>(r), fail);
          return cudaErrorUnknown;
        }
        return cudaSuccess;
      }
      case CopyMode::kernel:
      case CopyMode::staged: {
        std::vector<detail::DevicePiece> pieces = pieces_of(plan);
        if (pieces.empty()) return cudaSuccess;
        if (job.mode == CopyMode::staged) {
          job.staging_base = host_staging;
          std::uint64_t offset = 0;
          for (detail::DevicePiece& p : pieces) {
            job.staged_offsets.push_back(offset);
            p = detail::staged_piece(p, reinterpret_cast<std::uint64_t>(device_staging), offset);
            offset += p.bytes;
          }
        }
        void* d_pieces = nullptr;
        const std::size_t bytes = pieces.size() * sizeof(detail::DevicePiece);
        cudaError_t e = cudaMallocAsync(&d_pieces, bytes, stream);
        if (e != cudaSuccess) return e;
        e = cudaMemcpyAsync(d_pieces, pieces.data(), bytes, cudaMemcpyHostToDevice, stream);
        if (e == cudaSuccess) {
          e = static_cast<cudaError_t>(detail::launch_copy_pieces(
              static_cast<const detail::DevicePiece*>(d_pieces), pieces.size(), config.kernel_ctas,
              config.kernel_threads, stream));
        }
        const cudaError_t freed = cudaFreeAsync(d_pieces, stream);
        if (e != cudaSuccess) return e;
        if (freed != cudaSuccess) return freed;
        if (job.mode != CopyMode::staged) return cudaSuccess;
        // One large copy to the host staging buffer, then the host scatters it into the pool
        // (stream-ordered, so the next staged job waits for the scatter).
        e = cudaMemcpyAsync(host_staging, device_staging, plan.total_bytes, cudaMemcpyDeviceToHost,
                            stream);
        if (e != cudaSuccess) return e;
        return cudaLaunchHostFunc(stream, &Impl::scatter, &job);
      }
      case CopyMode::automatic: break;
    }
    return cudaErrorInvalidValue;
  }

  static void CUDART_CB scatter(void* arg) {
    Job& job = *static_cast<Job*>(arg);
    const auto* staging = static_cast<const unsigned char*>(job.staging_base);
    for (std::size_t i = 0; i < job.plan.descriptors.size(); ++i) {
      const CopyDescriptor& d = job.plan.descriptors[i];
      std::memcpy(reinterpret_cast<void*>(d.dst), staging + job.staged_offsets[i], d.bytes);
    }
  }

  CudaBackendConfig config;
  detail::DeviceScope scope;
  std::unique_ptr<detail::StreamPool> stores, loads;
  BatchFn batch = nullptr;
  bool kernel_ok = false;
  void* device_staging = nullptr;
  void* host_staging = nullptr;
  std::mutex mutex;
  std::deque<std::unique_ptr<Job>> in_order[2];
  Ticket next_ticket = 1;
  bool stopping = false;
  cudaStream_t compute = nullptr;
  std::unique_ptr<detail::CudaEvent> compute_ready;
};

bool CudaBackend::available() noexcept {
  return cuda_device_count() > 0;
}

CudaBackend::CudaBackend(const CudaBackendConfig& config) {
  KVOFFLOAD_EXPECTS(config.store_streams >= 1 && config.load_streams >= 1,
                    "store_streams and load_streams must be at least 1");
  KVOFFLOAD_EXPECTS(config.kernel_ctas >= 1 && config.kernel_threads >= 32 &&
                        config.kernel_threads % 32 == 0 && config.kernel_threads <= 1024,
                    "kernel_ctas must be positive and kernel_threads a multiple of 32 up to 1024");
  if (!available()) throw cuda_error("CudaBackend: no CUDA device is visible");
  impl_ = std::make_unique<Impl>(config);
}

CudaBackend::~CudaBackend() = default;

bool CudaBackend::batch_available() const noexcept {
  return impl_->batch != nullptr;
}
bool CudaBackend::kernel_available() const noexcept {
  return impl_->kernel_ok;
}
const CudaBackendConfig& CudaBackend::config() const noexcept {
  return impl_->config;
}

CopyMode CudaBackend::mode_for(const CopyPlan& plan) const noexcept {
  return choose_copy_mode(plan, impl_->config, batch_available(), kernel_available());
}

Ticket CudaBackend::submit_device_table(const TransferJob& job, Direction direction,
                                        const KvLayout& layout, const HostRegion& host,
                                        const std::int32_t* table,
                                        std::span<const std::int64_t> offsets) {
  using detail::DeviceJobLayout;
  Impl& s = *impl_;
  const auto G = static_cast<int>(layout.num_groups());
  KVOFFLOAD_EXPECTS(kernel_available(),
                    "job {}: the device-table path needs mapped pinned host memory", job.id);
  KVOFFLOAD_EXPECTS(G <= DeviceJobLayout::kMaxGroups, "job {}: {} groups, the device path takes {}",
                    job.id, G, DeviceJobLayout::kMaxGroups);
  KVOFFLOAD_EXPECTS(offsets.size() == layout.num_groups() + 1 &&
                        job.gpu.group_sizes.size() == layout.num_groups() &&
                        job.gpu.block_indices.size() == layout.num_groups(),
                    "job {}: {} offsets, {} group sizes and {} block indices for {} groups", job.id,
                    offsets.size(), job.gpu.group_sizes.size(), job.gpu.block_indices.size(), G);
  DeviceJobLayout L{};
  L.groups = G;
  L.block_size_factor = layout.block_size_factor();
  L.host_base = host.base;
  L.host_stride = static_cast<std::uint64_t>(host.block_stride_bytes);
  L.store = direction == Direction::store;
  std::int64_t first_host = 0;
  std::uint64_t total = 0;
  for (int g = 0; g < G; ++g) {
    const auto& tensors = layout.group(static_cast<std::size_t>(g));
    KVOFFLOAD_EXPECTS(tensors.size() <= DeviceJobLayout::kMaxTensors,
                      "job {} group {}: {} tensors, the device path takes {}", job.id, g,
                      tensors.size(), DeviceJobLayout::kMaxTensors);
    const std::int64_t size = job.gpu.group_sizes[static_cast<std::size_t>(g)];
    const std::int64_t index = job.gpu.block_indices[static_cast<std::size_t>(g)];
    L.block_index[g] = index;
    L.first_host[g] = first_host;
    first_host +=
        (size + index % L.block_size_factor + L.block_size_factor - 1) / L.block_size_factor;
    L.tensors[g] = static_cast<int>(tensors.size());
    L.max_tensors = std::max(L.max_tensors, L.tensors[g]);
    for (std::size_t k = 0; k < tensors.size(); ++k) {
      const KvTensor& t = layout.tensors()[static_cast<std::size_t>(tensors[k].tensor)];
      L.tensor[g][k] = {
          t.base, static_cast<std::uint64_t>(t.block_stride_bytes),
          static_cast<std::uint64_t>(tensors[k].page_bytes),
          static_cast<std::uint64_t>(host.row_offset +
                                     layout.host_offset(static_cast<std::size_t>(g), k, 0))};
      total += static_cast<std::uint64_t>(tensors[k].page_bytes * size);
    }
  }
  KVOFFLOAD_EXPECTS(first_host == static_cast<std::int64_t>(job.host_block_ids.size()),
                    "job {}: its group sizes need {} host blocks, it has {}", job.id, first_host,
                    job.host_block_ids.size());
  const std::int64_t n = offsets[static_cast<std::size_t>(G)];

  auto owned = std::make_unique<Impl::Job>();
  owned->plan.job = job.id;
  owned->plan.direction = direction;
  owned->plan.total_bytes = total;
  owned->mode = CopyMode::kernel;
  owned->start = std::chrono::steady_clock::now();
  std::lock_guard lock(s.mutex);
  detail::DeviceScope device(s.config.device);
  owned->ticket = s.next_ticket++;
  Impl::Job& j = *owned;
  s.in_order[L.store ? 0 : 1].push_back(std::move(owned));
  const cudaStream_t stream = (L.store ? s.stores->next() : s.loads->next()).value();
  // One device allocation for the small arrays and the outputs, freed in stream order.
  std::size_t temp_bytes = 0;
  cudaError_t e = static_cast<cudaError_t>(
      detail::compaction_temp_bytes(std::max<std::int64_t>(n, 1), G, &temp_bytes));
  const std::size_t ints = static_cast<std::size_t>(n) + job.host_block_ids.size();
  const std::size_t longs = 2 * static_cast<std::size_t>(G) + 2;  // offsets, expected, count
  const std::size_t pieces = static_cast<std::size_t>(n) * static_cast<std::size_t>(L.max_tensors);
  const std::size_t bytes = temp_bytes + 256 + longs * 8 + 8 * static_cast<std::size_t>(G) +
                            ints * 4 + 16 + pieces * sizeof(detail::DevicePiece) + 64;
  char* scratch = nullptr;
  if (e == cudaSuccess) e = cudaMallocAsync(reinterpret_cast<void**>(&scratch), bytes, stream);
  if (e == cudaSuccess) e = cudaMallocHost(reinterpret_cast<void**>(&j.mismatch), sizeof(int));
  if (e == cudaSuccess) {
    *j.mismatch = 0;
    auto carve = [&, at = std::size_t{0}](std::size_t size) mutable {
      char* p = scratch + at;
      at += (size + 15) / 16 * 16;
      return p;
    };
    void* temp = carve(temp_bytes);
    auto* d_offsets = reinterpret_cast<std::int64_t*>(carve(8 * (offsets.size())));
    auto* d_expected = reinterpret_cast<std::int64_t*>(carve(8 * static_cast<std::size_t>(G)));
    auto* d_count = reinterpret_cast<std::int64_t*>(carve(8));
    auto* d_groups = reinterpret_cast<std::int64_t*>(carve(8 * static_cast<std::size_t>(G)));
    auto* d_out = reinterpret_cast<std::int32_t*>(carve(4 * static_cast<std::size_t>(n)));
    auto* d_host = reinterpret_cast<std::int32_t*>(carve(4 * job.host_block_ids.size()));
    auto* d_flag = reinterpret_cast<int*>(carve(sizeof(int)));
    auto* d_pieces =
        reinterpret_cast<detail::DevicePiece*>(carve(pieces * sizeof(detail::DevicePiece)));
    e = cudaMemcpyAsync(d_offsets, offsets.data(), 8 * offsets.size(), cudaMemcpyHostToDevice,
                        stream);
    if (e == cudaSuccess) {
      e = cudaMemcpyAsync(d_expected, job.gpu.group_sizes.data(), 8 * static_cast<std::size_t>(G),
                          cudaMemcpyHostToDevice, stream);
    }
    if (e == cudaSuccess) {
      e = cudaMemcpyAsync(d_host, job.host_block_ids.data(), 4 * job.host_block_ids.size(),
                          cudaMemcpyHostToDevice, stream);
    }
    if (e == cudaSuccess) {
      e = static_cast<cudaError_t>(detail::compact_block_ids(table, n, d_offsets, G, d_expected,
                                                             d_out, d_count, d_groups, d_flag, temp,
                                                             temp_bytes, stream));
    }
    if (e == cudaSuccess) {
      e = static_cast<cudaError_t>(
          detail::launch_build_and_copy(L, d_out, d_count, d_groups, d_host, d_pieces, pieces,
                                        s.config.kernel_ctas, s.config.kernel_threads, stream));
    }
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(j.mismatch, d_flag, sizeof(int), cudaMemcpyDeviceToHost, stream);
    const cudaError_t freed = cudaFreeAsync(scratch, stream);
    if (e == cudaSuccess) e = freed;
  }
  if (e == cudaSuccess) e = cudaEventRecord(j.done.value(), stream);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    (void)cudaStreamSynchronize(stream);
    (void)cudaGetLastError();
    j.failed = true;
    j.error = fmt::format("job {} (device table): {}", job.id, detail::describe(e));
  }
  return j.ticket;
}

void CudaBackend::set_compute_stream(std::uintptr_t stream) {
  std::lock_guard lock(impl_->mutex);
  impl_->compute = reinterpret_cast<cudaStream_t>(stream);
  if (impl_->compute != nullptr && !impl_->compute_ready) {
    impl_->compute_ready = std::make_unique<detail::CudaEvent>();
  }
}

Ticket CudaBackend::submit(CopyPlan plan) {
  Impl& s = *impl_;
  const bool store = plan.direction == Direction::store;
  const std::string range = fmt::format("kvoffload {} job {}", store ? "store" : "load", plan.job);
  NvtxRange nvtx(range.c_str());
  auto job = std::make_unique<Impl::Job>();
  job->plan = std::move(plan);
  job->mode = mode_for(job->plan);
  job->start = std::chrono::steady_clock::now();

  std::lock_guard lock(s.mutex);
  detail::DeviceScope device(s.config.device);
  job->ticket = s.next_ticket++;
  Impl::Job& j = *job;
  s.in_order[store ? 0 : 1].push_back(std::move(job));
  if (s.stopping) {
    j.failed = true;
    j.error = "backend is shut down";
    return j.ticket;
  }
  // Staged jobs share one staging buffer: they all go to the first store stream, in order.
  const detail::CudaStreamView stream =
      j.mode == CopyMode::staged ? s.stores->at(0) : (store ? s.stores->next() : s.loads->next());
  cudaError_t e = cudaSuccess;
  if (store && s.compute != nullptr) {
    // The KV this store reads is being written by work already queued on the compute stream.
    e = cudaEventRecord(s.compute_ready->value(), s.compute);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(stream.value(), s.compute_ready->value(), 0);
  }
  if (e == cudaSuccess) e = s.enqueue(j, stream.value());
  if (e == cudaSuccess) e = cudaEventRecord(j.done.value(), stream.value());
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    j.failed = true;
    if (j.error.empty()) {
      j.error =
          fmt::format("job {} ({} mode): {}", j.plan.job, to_string(j.mode), detail::describe(e));
    }
    // Copies already queued may still run: wait for them before reporting the job.
    (void)cudaStreamSynchronize(stream.value());
    (void)cudaGetLastError();
  }
  return j.ticket;
}

void CudaBackend::poll(std::vector<BackendResult>& finished) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  for (auto& queue : s.in_order) {
    while (!queue.empty()) {
      Impl::Job& j = *queue.front();
      if (!j.failed) {
        try {
          if (!j.done.query()) break;  // later jobs of this direction wait their turn
        } catch (const cuda_error& e) {
          j.failed = true;
          j.error = fmt::format("job {}: {}", j.plan.job, e.what());
        }
        if (!j.failed && j.mismatch != nullptr && *j.mismatch != 0) {
          j.failed = true;
          j.error = fmt::format(
              "job {}: the device block table's non-null ids per group differ from the job's "
              "group_sizes; nothing it copied may be used",
              j.plan.job);
        }
      }
      j.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - j.start).count();
      finished.push_back({j.ticket, j.plan.job, j.plan.direction, !j.failed, std::move(j.error),
                          j.failed ? 0 : j.plan.total_bytes, j.seconds});
      queue.pop_front();
    }
  }
}

void CudaBackend::wait(Ticket ticket) {
  Impl& s = *impl_;
  Impl::Job* job = nullptr;
  {
    std::lock_guard lock(s.mutex);
    for (auto& queue : s.in_order) {
      for (auto& j : queue) {
        if (j->ticket == ticket) job = j.get();
      }
    }
    if (job == nullptr || job->failed) return;
  }
  // Outside the lock: submissions go on while we block. The job cannot disappear: only poll
  // removes jobs, and it does so only for completed ones.
  try {
    job->done.synchronize();
  } catch (const cuda_error& e) {
    std::lock_guard lock(s.mutex);
    job->failed = true;
    job->error = e.what();
  }
}

void CudaBackend::shutdown(bool /*drain*/) {
  // Work already on the GPU cannot be recalled: both ways wait for it; later submits fail.
  std::lock_guard lock(impl_->mutex);
  impl_->stopping = true;
  (void)cudaDeviceSynchronize();
}

CudaBackendConfig calibrate(const CudaBackendConfig& config) {
  CudaBackendConfig out = config;
  if (!CudaBackend::available()) return out;
  detail::DeviceScope device(config.device);
  const std::size_t total = std::size_t{64} << 20;
  void* d = nullptr;
  void* h = nullptr;
  KVOFFLOAD_CUDA_TRY(cudaMalloc(&d, total));
  KVOFFLOAD_CUDA_TRY(cudaMallocHost(&h, total));
  auto time_mode = [&](CopyMode mode, std::uint64_t piece) {
    CudaBackendConfig c = config;
    c.mode = mode;
    CudaBackend backend(c);
    CopyPlan plan;
    plan.direction = Direction::store;
    for (std::uint64_t off = 0; off + piece <= total; off += 2 * piece) {
      plan.descriptors.push_back({reinterpret_cast<std::uintptr_t>(d) + off,
                                  reinterpret_cast<std::uintptr_t>(h) + off, piece});
      plan.total_bytes += piece;
    }
    backend.wait(backend.submit(plan));  // warm up
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 3; ++i) backend.wait(backend.submit(plan));
    std::vector<BackendResult> drop;
    backend.poll(drop);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::uint64_t crossover = 4096;
  for (std::uint64_t piece = 4096; piece <= (std::uint64_t{4} << 20); piece *= 2) {
    if (time_mode(CopyMode::kernel, piece) <= time_mode(CopyMode::batch, piece))
      crossover = piece * 2;
  }
  out.small_piece_bytes = crossover;
  (void)cudaFree(d);
  (void)cudaFreeHost(h);
  return out;
}

DeviceCompactor::DeviceCompactor(std::int64_t max_ids, int max_groups)
    : max_ids_(max_ids), max_groups_(max_groups) {
  KVOFFLOAD_EXPECTS(max_ids >= 1 && max_groups >= 1, "compactor: sizes must be positive");
  KVOFFLOAD_CUDA_TRY(
      static_cast<cudaError_t>(detail::compaction_temp_bytes(max_ids, max_groups, &temp_bytes_)));
  KVOFFLOAD_CUDA_TRY(cudaMalloc(&temp_, std::max<std::size_t>(temp_bytes_, 1)));
}

DeviceCompactor::~DeviceCompactor() {
  if (temp_ != nullptr) (void)cudaFree(temp_);
}

void DeviceCompactor::compact(const std::int32_t* ids, std::int64_t n, const std::int64_t* offsets,
                              int groups, const std::int64_t* expected, std::int32_t* out,
                              std::int64_t* count, std::int64_t* group_counts, int* mismatch,
                              std::uintptr_t stream) {
  KVOFFLOAD_EXPECTS(
      n >= 0 && n <= max_ids_ && groups >= 1 && groups <= max_groups_,
      "compactor: {} ids in {} groups exceed the {} ids and {} groups it was sized for", n, groups,
      max_ids_, max_groups_);
  KVOFFLOAD_CUDA_TRY(static_cast<cudaError_t>(
      detail::compact_block_ids(ids, n, offsets, groups, expected, out, count, group_counts,
                                mismatch, temp_, temp_bytes_, reinterpret_cast<void*>(stream))));
}

}  // namespace kvoffload
