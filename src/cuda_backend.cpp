// CudaBackend: streams, events, the copy modes and the device-table path, written against
// DeviceRuntime so the same code runs on a GPU and on the simulated device in every build.

#include "kvoffload/cuda_backend.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>

#include <fmt/format.h>

#include "block_math.hpp"
#include "expects.hpp"
#include "kvoffload/detail/copy_body.hpp"
#include "kvoffload/device.hpp"
#include "kvoffload/device_runtime.hpp"
#include "logging.hpp"
#include "ring_allocator.hpp"

namespace kvoffload {
namespace {

using detail::DevicePiece;

/// Switches the calling thread to `device` for a scope (and back).
class Scope {
 public:
  Scope(DeviceRuntime& rt, int device) : rt_(rt) {
    check(rt.get_device(&previous_), "get_device");
    if (previous_ != device) check(rt.set_device(device), "set_device");
  }
  ~Scope() { (void)rt_.set_device(previous_); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void check(int e, const char* call) const {
    if (e != dev::ok)
      throw cuda_error(fmt::format("CUDA backend: {} failed: {}", call, rt_.describe(e)));
  }
  DeviceRuntime& rt_;
  int previous_ = 0;
};

/// A device allocation or pinned host allocation, freed on scope exit unless released.
class Owned {
 public:
  enum class Kind : std::uint8_t { device, host };
  Owned(DeviceRuntime& rt, Kind kind) : rt_(&rt), kind_(kind) {}
  ~Owned() { reset(); }
  Owned(Owned&& o) noexcept : rt_(o.rt_), kind_(o.kind_), p_(o.p_) { o.p_ = nullptr; }
  Owned& operator=(Owned&& o) noexcept {
    if (this != &o) {
      reset();
      rt_ = o.rt_;
      kind_ = o.kind_;
      p_ = o.p_;
      o.p_ = nullptr;
    }
    return *this;
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  int allocate(std::size_t bytes) {
    reset();
    return kind_ == Kind::device ? rt_->malloc_device(&p_, bytes) : rt_->malloc_host(&p_, bytes);
  }
  void reset() {
    if (p_ == nullptr) return;
    (void)(kind_ == Kind::device ? rt_->free_device(p_) : rt_->free_host(p_));
    p_ = nullptr;
  }
  [[nodiscard]] void* get() const noexcept { return p_; }
  [[nodiscard]] std::byte* bytes() const noexcept { return static_cast<std::byte*>(p_); }

 private:
  DeviceRuntime* rt_;
  Kind kind_;
  void* p_ = nullptr;
};

/// A stream-ordered device allocation, freed (in stream order) on scope exit.
class AsyncBuffer {
 public:
  AsyncBuffer(DeviceRuntime& rt, StreamHandle stream) : rt_(rt), stream_(stream) {}
  ~AsyncBuffer() {
    if (p_ != nullptr) (void)rt_.free_async(p_, stream_);
  }
  AsyncBuffer(const AsyncBuffer&) = delete;
  AsyncBuffer& operator=(const AsyncBuffer&) = delete;
  int allocate(std::size_t bytes) { return rt_.malloc_async(&p_, bytes, stream_); }
  /// Queues the free now; returns its status.
  int free() {
    const int e = p_ == nullptr ? dev::ok : rt_.free_async(p_, stream_);
    p_ = nullptr;
    return e;
  }
  [[nodiscard]] std::byte* get() const noexcept { return static_cast<std::byte*>(p_); }

 private:
  DeviceRuntime& rt_;
  StreamHandle stream_;
  void* p_ = nullptr;
};

std::uint64_t align16(std::uint64_t n) {
  return (n + 15) / 16 * 16;
}

}  // namespace

struct CudaBackend::Impl {
  /// A slice of a stream's pinned ring, or a pinned allocation of the job's own.
  struct Pinned {
    std::byte* data = nullptr;
    std::size_t stream = 0;
    std::optional<std::uint64_t> ring_offset;
    void* own = nullptr;
  };

  struct Job {
    std::shared_ptr<DeviceRuntime> rt;
    Ticket ticket = 0;
    CopyPlan plan;
    CopyMode mode = CopyMode::memcpy;
    EventHandle done = 0;
    bool recorded = false;
    bool failed = false;  // at submission, when polled, or cancelled
    std::string error;
    bool cancelled = false;
    std::chrono::steady_clock::time_point start;
    Pinned pinned;                              // the piece array or device-table inputs
    std::optional<std::uint64_t> staging;       // staged: offset in the staging buffers
    std::vector<std::uint64_t> staged_offsets;  // staged: where each piece lies
    bool scattered = false;
    const int* mismatch = nullptr;  // device-table: the pinned flag the device writes
    bool released = false;
    ~Job() {
      if (done != 0) (void)rt->event_destroy(done);
    }
  };
  using JobPtr = std::shared_ptr<Job>;

  Impl(const CudaBackendConfig& c, std::shared_ptr<DeviceRuntime> runtime)
      : rt(std::move(runtime)),
        config(c),
        device_staging(*rt, Owned::Kind::device),
        host_staging(*rt, Owned::Kind::host),
        ring_memory(*rt, Owned::Kind::host) {}

  ~Impl() {
    try {
      Scope scope(*rt, config.device);
      for (StreamHandle s : streams) (void)rt->stream_synchronize(s);
      in_order[0].clear();
      in_order[1].clear();
      if (compute_ready != 0) (void)rt->event_destroy(compute_ready);
      device_staging.reset();
      host_staging.reset();
      ring_memory.reset();
      for (StreamHandle s : streams) (void)rt->stream_destroy(s);
    } catch (const std::exception& e) {
      detail::logger().error("CUDA backend: shutdown failed: {}", e.what());
    }
  }

  void check(int e, const char* what) const {
    if (e != dev::ok) {
      (void)rt->get_last_error();
      throw cuda_error(fmt::format("CUDA backend on device {}: {} failed: {}", config.device, what,
                                   rt->describe(e)));
    }
  }

  /// Streams, rings, staging; the host region check. Throws (RAII frees what was made).
  void setup() {
    Scope scope(*rt, config.device);
    int least = 0, greatest = 0;
    check(rt->stream_priority_range(&least, &greatest), "stream_priority_range");
    for (int i = 0; i < config.store_streams + config.load_streams; ++i) {
      StreamHandle s = 0;
      check(rt->stream_create(i < config.store_streams ? least : greatest, &s), "stream_create");
      streams.push_back(s);
    }
    bool mappable = false;
    check(rt->can_map_host_memory(config.device, &mappable), "can_map_host_memory");
    kernel_ok = mappable;
    if (!mappable) {
      detail::logger().warn(
          "CUDA backend: device {} cannot use registered host pointers; kernel, staged and "
          "device-table modes are off",
          config.device);
    } else if (config.host_bytes > 0) {
      bool mapped = false;
      check(rt->host_mapped(reinterpret_cast<const void*>(config.host_base), config.host_bytes,
                            &mapped),
            "host_mapped");
      if (!mapped) {
        kernel_ok = false;
        detail::logger().warn(
            "CUDA backend: the host region ({} bytes) is not pinned and mapped for device {} "
            "(an unpinned pool?); kernel, staged and device-table modes are off, copies use "
            "the copy engines",
            config.host_bytes, config.device);
      }
    }
    batch_ok = rt->batch_available();
    if (config.ring_bytes > 0) {
      const std::size_t n = streams.size();
      check(ring_memory.allocate(static_cast<std::size_t>(config.ring_bytes) * n),
            "malloc_host (rings)");
      for (std::size_t i = 0; i < n; ++i) rings.emplace_back(config.ring_bytes);
    }
    if (kernel_ok && config.staging_bytes > 0) {
      check(device_staging.allocate(config.staging_bytes), "malloc_device (staging)");
      check(host_staging.allocate(config.staging_bytes), "malloc_host (staging)");
      staging_ring = detail::RingAllocator(config.staging_bytes);
    }
    if (config.compute_stream) set_compute(config.compute_stream);
  }

  void set_compute(std::optional<std::uintptr_t> stream) {
    KVOFFLOAD_EXPECTS(!stream || *stream != per_thread_default_stream,
                      "compute_stream: cudaStreamPerThread names a different stream on each "
                      "thread; pass the engine's stream itself (torch.cuda.current_stream())");
    if (stream && compute_ready == 0) {
      Scope scope(*rt, config.device);
      check(rt->event_create(&compute_ready), "event_create (compute stream)");
    }
    compute = stream;
  }

  std::size_t pick_stream(bool store) {
    if (store) {
      return next_store++ % static_cast<std::size_t>(config.store_streams);
    }
    return static_cast<std::size_t>(config.store_streams) +
           next_load++ % static_cast<std::size_t>(config.load_streams);
  }

  /// Pinned bytes for an upload on stream `si`: ring first, else an allocation of its own.
  int get_pinned(Job& job, std::size_t si, std::size_t bytes) {
    job.pinned.stream = si;
    if (!rings.empty()) {
      if (auto off = rings[si].allocate(bytes)) {
        job.pinned.ring_offset = off;
        job.pinned.data = ring_memory.bytes() + si * config.ring_bytes + *off;
        return dev::ok;
      }
    }
    ++stats.ring_fell_back;
    const int e = rt->malloc_host(&job.pinned.own, bytes);
    job.pinned.data = static_cast<std::byte*>(job.pinned.own);
    return e;
  }

  /// Gives back what the job held; only once its device work has finished (or never ran).
  void release(Job& job) {
    if (job.released) return;
    job.released = true;
    if (job.pinned.ring_offset) rings[job.pinned.stream].release(*job.pinned.ring_offset);
    if (job.pinned.own != nullptr) (void)rt->free_host(job.pinned.own);
    job.pinned = {};
    if (job.staging) staging_ring.release(*job.staging);
    job.staging.reset();
  }

  /// Waits (on the device) for the engine's compute stream, if the job must.
  int wait_for_compute(StreamHandle stream, bool must) {
    if (!compute || !must || skip_compute_wait) return dev::ok;
    int e = rt->event_record(compute_ready, *compute);
    if (e == dev::ok) e = rt->stream_wait_event(stream, compute_ready);
    return e;
  }

  /// The staged store's second half: the host copies the staging buffer into the pool, after
  /// the job's event (from poll or wait, never a CUDA callback).
  void scatter(Job& job) {
    if (job.scattered || !job.staging) return;
    job.scattered = true;
    const std::byte* from = host_staging.bytes() + *job.staging;
    rt->host_access(from, job.plan.total_bytes, false);
    for (std::size_t i = 0; i < job.plan.descriptors.size(); ++i) {
      const CopyDescriptor& d = job.plan.descriptors[i];
      std::memcpy(reinterpret_cast<void*>(d.dst), from + job.staged_offsets[i], d.bytes);
    }
  }

  /// Enqueues the job's copies on `stream`; returns the first failing status.
  int enqueue(Job& job, std::size_t si) {
    const StreamHandle stream = streams[si];
    const CopyPlan& plan = job.plan;
    const bool store = plan.kind == JobKind::store;
    switch (job.mode) {
      case CopyMode::memcpy:
        for (const CopyDescriptor& d : plan.descriptors) {
          const int e = rt->memcpy_async(reinterpret_cast<void*>(d.dst),
                                         reinterpret_cast<const void*>(d.src), d.bytes, stream);
          if (e != dev::ok) return e;
        }
        return dev::ok;
      case CopyMode::batch: {
        if (plan.descriptors.empty()) return dev::ok;
        std::size_t fail = 0;
        // Stores read live KV: in stream order. Loads read pinned host blocks nobody writes.
        const int e = rt->memcpy_batch_async(plan.descriptors.data(), plan.descriptors.size(),
                                             store, stream, &fail);
        if (e != dev::ok) {
          job.error = fmt::format("job {} (batch mode): copy {} of {} refused: {}", plan.job, fail,
                                  plan.descriptors.size(), rt->describe(e));
        }
        return e;
      }
      case CopyMode::kernel:
      case CopyMode::staged: {
        const std::size_t n = plan.descriptors.size();
        if (n == 0) return dev::ok;
        const std::size_t bytes = n * sizeof(DevicePiece);
        int e = get_pinned(job, si, bytes);
        if (e != dev::ok) return e;
        rt->host_access(job.pinned.data, bytes, true);
        auto* pieces = reinterpret_cast<DevicePiece*>(job.pinned.data);
        std::uint64_t offset = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const CopyDescriptor& d = plan.descriptors[i];
          pieces[i] = {d.src, d.dst, d.bytes};
          if (job.mode == CopyMode::staged) {
            job.staged_offsets.push_back(offset);
            pieces[i] = detail::staged_piece(
                pieces[i], reinterpret_cast<std::uint64_t>(device_staging.get()) + *job.staging,
                offset);
            offset += d.bytes;
          }
        }
        AsyncBuffer d_pieces(*rt, stream);
        e = d_pieces.allocate(bytes);
        if (e == dev::ok) e = rt->memcpy_async(d_pieces.get(), pieces, bytes, stream);
        if (e == dev::ok) {
          e = rt->launch_copy_pieces(reinterpret_cast<const DevicePiece*>(d_pieces.get()), n,
                                     config.kernel_ctas, config.kernel_threads, stream);
        }
        const int freed = d_pieces.free();
        if (e != dev::ok) return e;
        if (freed != dev::ok) return freed;
        if (job.mode != CopyMode::staged) return dev::ok;
        // One large copy to this job's part of the host staging buffer; poll or wait scatter it.
        return rt->memcpy_async(host_staging.bytes() + *job.staging,
                                device_staging.bytes() + *job.staging, plan.total_bytes, stream);
      }
      case CopyMode::automatic: break;
    }
    return dev::invalid_value;
  }

  /// After a failed call: clear the error, let queued work finish, fail the job.
  void fail_submission(Job& job, std::size_t si, int e, std::string_view what) {
    (void)rt->get_last_error();
    (void)rt->stream_synchronize(streams[si]);  // copies already queued may still run
    (void)rt->get_last_error();
    job.failed = true;
    if (job.error.empty())
      job.error = fmt::format("job {} ({}): {}", job.plan.job, what, rt->describe(e));
    release(job);
  }

  void count_mode(CopyMode mode) {
    switch (mode) {
      case CopyMode::batch: ++stats.jobs_batch; break;
      case CopyMode::memcpy: ++stats.jobs_memcpy; break;
      case CopyMode::kernel: ++stats.jobs_kernel; break;
      case CopyMode::staged: ++stats.jobs_staged; break;
      case CopyMode::automatic: break;
    }
  }

  std::shared_ptr<DeviceRuntime> rt;
  CudaBackendConfig config;
  std::vector<StreamHandle> streams;  // store streams, then load streams
  std::size_t next_store = 0, next_load = 0;
  bool kernel_ok = false, batch_ok = false;
  Owned device_staging, host_staging, ring_memory;
  std::vector<detail::RingAllocator> rings;  // per stream, over ring_memory
  detail::RingAllocator staging_ring;
  std::optional<std::uintptr_t> compute;
  EventHandle compute_ready = 0;
  bool skip_compute_wait = false;
  mutable std::mutex mutex;
  std::deque<JobPtr> in_order[2];
  Ticket next_ticket = 1;
  bool stopping = false;
  CudaBackendStats stats;
};

bool CudaBackend::available() noexcept {
  return cuda_device_count() > 0;
}

namespace {
void check_config(const CudaBackendConfig& config) {
  KVOFFLOAD_EXPECTS(config.device >= 0, "device is {} (must be >= 0)", config.device);
  KVOFFLOAD_EXPECTS(config.store_streams >= 1 && config.load_streams >= 1,
                    "store_streams and load_streams must be at least 1");
  KVOFFLOAD_EXPECTS(config.kernel_ctas >= 1 && config.kernel_threads >= 32 &&
                        config.kernel_threads % 32 == 0 && config.kernel_threads <= 1024,
                    "kernel_ctas must be positive and kernel_threads a multiple of 32 up to 1024");
}
}  // namespace

CudaBackend::CudaBackend(const CudaBackendConfig& config) {
  check_config(config);
  if (!available()) {
    throw unsupported("CudaBackend: needs a CUDA build of kvoffload and a visible CUDA device");
  }
  impl_ = std::make_unique<Impl>(config, cuda_runtime());
  impl_->setup();
}

CudaBackend::CudaBackend(const CudaBackendConfig& config, std::shared_ptr<DeviceRuntime> runtime) {
  check_config(config);
  KVOFFLOAD_EXPECTS(runtime != nullptr, "CudaBackend: no device runtime");
  KVOFFLOAD_EXPECTS(config.device < runtime->device_count(),
                    "device is {} but {} device(s) are visible", config.device,
                    runtime->device_count());
  impl_ = std::make_unique<Impl>(config, std::move(runtime));
  impl_->setup();
}

CudaBackend::~CudaBackend() = default;

bool CudaBackend::batch_available() const noexcept {
  return impl_->batch_ok;
}
bool CudaBackend::kernel_available() const noexcept {
  return impl_->kernel_ok;
}
const CudaBackendConfig& CudaBackend::config() const noexcept {
  return impl_->config;
}
CudaBackendStats CudaBackend::stats() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->stats;
}
void CudaBackend::unsafe_skip_compute_wait_for_testing(bool skip) {
  std::lock_guard lock(impl_->mutex);
  impl_->skip_compute_wait = skip;
}

CopyMode CudaBackend::mode_for(const CopyPlan& plan) const noexcept {
  return choose_copy_mode(plan, impl_->config, batch_available(), kernel_available());
}

void CudaBackend::set_compute_stream(std::optional<std::uintptr_t> stream) {
  std::lock_guard lock(impl_->mutex);
  impl_->set_compute(stream);
}

Ticket CudaBackend::submit(CopyPlan plan) {
  Impl& s = *impl_;
  const bool store = plan.kind == JobKind::store;
  auto job = std::make_shared<Impl::Job>();
  job->rt = s.rt;
  job->plan = std::move(plan);
  job->mode = mode_for(job->plan);
  job->start = std::chrono::steady_clock::now();

  std::lock_guard lock(s.mutex);
  job->ticket = s.next_ticket++;
  Impl::Job& j = *job;
  s.in_order[store ? 0 : 1].push_back(std::move(job));
  if (s.stopping) {
    j.failed = true;
    j.error = fmt::format("job {}: backend is shut down", j.plan.job);
    return j.ticket;
  }
  std::optional<Scope> scope;
  try {
    scope.emplace(*s.rt, s.config.device);  // before any event or stream work
  } catch (const cuda_error& e) {
    j.failed = true;
    j.error = fmt::format("job {}: {}", j.plan.job, e.what());
    return j.ticket;
  }
  if (j.mode == CopyMode::staged) {
    j.staging = s.staging_ring.allocate(j.plan.total_bytes);
    if (!j.staging) {  // staging is busy with earlier jobs: the kernel copies directly
      j.mode = CopyMode::kernel;
      ++s.stats.staged_fell_back;
    }
  }
  s.count_mode(j.mode);
  const std::size_t si = s.pick_stream(store);
  const StreamHandle stream = s.streams[si];
  int e = s.rt->event_create(&j.done);
  if (e != dev::ok) j.done = 0;
  if (e == dev::ok) e = s.wait_for_compute(stream, store || s.config.loads_wait_for_compute);
  if (e == dev::ok) e = s.enqueue(j, si);
  if (e == dev::ok) e = s.rt->event_record(j.done, stream);
  if (e == dev::ok) {
    j.recorded = true;
  } else {
    s.fail_submission(j, si, e, fmt::format("{} mode", to_string(j.mode)));
  }
  return j.ticket;
}

Ticket CudaBackend::submit_device_table(const TransferJob& job, JobKind kind,
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
  KVOFFLOAD_EXPECTS(offsets.size() == layout.num_groups() + 1,
                    "job {}: {} table offsets for {} groups (need groups + 1)", job.id,
                    offsets.size(), G);
  KVOFFLOAD_EXPECTS(offsets[0] == 0, "job {}: table offsets must start at 0, not {}", job.id,
                    offsets[0]);
  for (int g = 0; g < G; ++g) {
    KVOFFLOAD_EXPECTS(
        offsets[static_cast<std::size_t>(g) + 1] >= offsets[static_cast<std::size_t>(g)],
        "job {} group {}: table offsets decrease ({} then {})", job.id, g,
        offsets[static_cast<std::size_t>(g)], offsets[static_cast<std::size_t>(g) + 1]);
  }
  KVOFFLOAD_EXPECTS(table != nullptr || offsets[static_cast<std::size_t>(G)] == 0,
                    "job {}: no block table", job.id);
  check_job_shape(job, G, layout.block_size_factor());
  for (std::size_t i = 0; i < job.host_block_ids.size(); ++i) {
    KVOFFLOAD_EXPECTS(job.host_block_ids[i] >= 0 && job.host_block_ids[i] < host.num_blocks,
                      "job {}: host block {} at position {} is outside the host region (0 to {})",
                      job.id, job.host_block_ids[i], i, host.num_blocks - 1);
  }
  DeviceJobLayout L{};
  L.groups = G;
  L.block_size_factor = layout.block_size_factor();
  L.host_base = host.base;
  L.host_stride = static_cast<std::uint64_t>(host.block_stride_bytes);
  L.store = kind == JobKind::store;
  std::int64_t first_host = 0;
  std::uint64_t total = 0;
  for (int g = 0; g < G; ++g) {
    const auto gi = static_cast<std::size_t>(g);
    const auto& tensors = layout.group(gi);
    KVOFFLOAD_EXPECTS(tensors.size() <= DeviceJobLayout::kMaxTensors,
                      "job {} group {}: {} tensors, the device path takes {}", job.id, g,
                      tensors.size(), DeviceJobLayout::kMaxTensors);
    KVOFFLOAD_EXPECTS(host.row_offset + layout.host_block_bytes(gi) <= host.block_stride_bytes,
                      "job {} group {}: its host block does not fit the host region's stride",
                      job.id, g);
    const std::int64_t size = job.gpu.group_sizes[gi];
    const std::int64_t index = job.gpu.block_indices[gi];
    const std::int64_t f = L.block_size_factor;
    L.block_index[g] = index;
    L.first_host[g] = first_host;
    L.host_count[g] = detail::host_blocks_spanned(size, index, f);
    L.expected[g] = size;
    first_host += L.host_count[g];
    L.tensors[g] = static_cast<int>(tensors.size());
    L.max_tensors = std::max(L.max_tensors, L.tensors[g]);
    std::int64_t blocks = INT32_MAX;
    for (std::size_t k = 0; k < tensors.size(); ++k) {
      const KvTensor& t = layout.tensors()[static_cast<std::size_t>(tensors[k].tensor)];
      blocks = std::min(blocks, t.num_blocks);
      L.tensor[g][k] = {t.base, static_cast<std::uint64_t>(t.block_stride_bytes),
                        static_cast<std::uint64_t>(tensors[k].page_bytes),
                        static_cast<std::uint64_t>(host.row_offset + layout.host_offset(gi, k, 0))};
      total += static_cast<std::uint64_t>(tensors[k].page_bytes * size);
    }
    L.max_id[g] = blocks - 1;
  }
  const std::int64_t n = offsets[static_cast<std::size_t>(G)];
  const auto H = job.host_block_ids.size();

  auto owned = std::make_shared<Impl::Job>();
  owned->rt = s.rt;
  owned->plan.job = job.id;
  owned->plan.kind = kind;
  owned->plan.total_bytes = total;
  owned->mode = CopyMode::kernel;
  owned->start = std::chrono::steady_clock::now();
  std::lock_guard lock(s.mutex);
  owned->ticket = s.next_ticket++;
  Impl::Job& j = *owned;
  s.in_order[L.store ? 0 : 1].push_back(std::move(owned));
  if (s.stopping) {
    j.failed = true;
    j.error = fmt::format("job {}: backend is shut down", job.id);
    return j.ticket;
  }
  std::optional<Scope> scope;
  try {
    scope.emplace(*s.rt, s.config.device);
  } catch (const cuda_error& e) {
    j.failed = true;
    j.error = fmt::format("job {} (device table): {}", job.id, e.what());
    return j.ticket;
  }
  ++s.stats.jobs_device_table;
  const std::size_t si = s.pick_stream(L.store);
  const StreamHandle stream = s.streams[si];
  // Inputs, laid out alike in pinned memory and on the device: offsets, expected, max ids,
  // host ids; then the flag the device writes back.
  const std::size_t o_offsets = 0;
  const std::size_t o_expected = o_offsets + align16(8 * offsets.size());
  const std::size_t o_max = o_expected + align16(8 * static_cast<std::size_t>(G));
  const std::size_t o_host = o_max + align16(8 * static_cast<std::size_t>(G));
  const std::size_t inputs = o_host + align16(4 * std::max<std::size_t>(H, 1));
  const std::size_t o_flag = inputs;
  const std::size_t pinned_bytes = o_flag + 16;
  std::size_t temp_bytes = 0;
  int e = s.rt->compaction_temp_bytes(std::max<std::int64_t>(n, 1), G, &temp_bytes);
  if (e == dev::ok) e = s.rt->event_create(&j.done);
  if (e != dev::ok) j.done = 0;
  if (e == dev::ok) e = s.get_pinned(j, si, pinned_bytes);
  AsyncBuffer scratch(*s.rt, stream);
  const auto pieces = static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(L.max_tensors);
  const std::size_t o_temp = align16(inputs);
  const std::size_t o_count = o_temp + align16(temp_bytes);
  const std::size_t o_groups = o_count + 16;
  const std::size_t o_out = o_groups + align16(8 * static_cast<std::size_t>(G));
  const std::size_t o_dflag =
      o_out + align16(4 * static_cast<std::size_t>(std::max<std::int64_t>(n, 1)));
  const std::size_t o_pieces = o_dflag + 16;
  const std::size_t scratch_bytes = o_pieces + pieces * sizeof(DevicePiece) + 16;
  if (e == dev::ok) {
    std::byte* p = j.pinned.data;
    s.rt->host_access(p, pinned_bytes, true);
    std::memcpy(p + o_offsets, offsets.data(), 8 * offsets.size());
    std::memcpy(p + o_expected, job.gpu.group_sizes.data(), 8 * static_cast<std::size_t>(G));
    std::memcpy(p + o_max, L.max_id, 8 * static_cast<std::size_t>(G));
    for (std::size_t i = 0; i < H; ++i) {
      const auto id = static_cast<std::int32_t>(job.host_block_ids[i]);
      std::memcpy(p + o_host + 4 * i, &id, 4);
    }
    std::memset(p + o_flag, 0, 16);
    j.mismatch = reinterpret_cast<const int*>(p + o_flag);
    e = scratch.allocate(scratch_bytes);
  }
  // The engine writes the table on its compute stream: wait before the first read of it.
  if (e == dev::ok) e = s.wait_for_compute(stream, true);
  if (e == dev::ok) e = s.rt->memcpy_async(scratch.get(), j.pinned.data, inputs, stream);
  std::byte* d = scratch.get();
  auto* d_flag = reinterpret_cast<int*>(d + o_dflag);
  if (e == dev::ok) {
    CompactArgs a;
    a.ids = table;
    a.n = n;
    a.offsets = reinterpret_cast<const std::int64_t*>(d + o_offsets);
    a.groups = G;
    a.expected = reinterpret_cast<const std::int64_t*>(d + o_expected);
    a.max_id = reinterpret_cast<const std::int64_t*>(d + o_max);
    a.out = reinterpret_cast<std::int32_t*>(d + o_out);
    a.count = reinterpret_cast<std::int64_t*>(d + o_count);
    a.group_counts = reinterpret_cast<std::int64_t*>(d + o_groups);
    a.mismatch = d_flag;
    a.temp = d + o_temp;
    a.temp_bytes = temp_bytes;
    e = s.rt->launch_compact(a, stream);
  }
  auto* d_pieces = reinterpret_cast<DevicePiece*>(d + o_pieces);
  if (e == dev::ok && pieces > 0) {
    // Reads the flag the compaction wrote (same stream): a failed check builds empty pieces.
    e = s.rt->launch_build_pieces(L, reinterpret_cast<const std::int32_t*>(d + o_out),
                                  reinterpret_cast<const std::int64_t*>(d + o_count),
                                  reinterpret_cast<const std::int64_t*>(d + o_groups),
                                  reinterpret_cast<const std::int32_t*>(d + o_host), d_flag,
                                  d_pieces, pieces, s.config.kernel_ctas, s.config.kernel_threads,
                                  stream);
    if (e == dev::ok) {
      e = s.rt->launch_copy_pieces(d_pieces, pieces, s.config.kernel_ctas, s.config.kernel_threads,
                                   stream);
    }
  }
  if (e == dev::ok) e = s.rt->memcpy_async(j.pinned.data + o_flag, d_flag, sizeof(int), stream);
  const int freed = scratch.free();
  if (e == dev::ok) e = freed;
  if (e == dev::ok) e = s.rt->event_record(j.done, stream);
  if (e == dev::ok) {
    j.recorded = true;
  } else {
    s.fail_submission(j, si, e, "device table");
  }
  return j.ticket;
}

void CudaBackend::poll(std::vector<BackendResult>& finished) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  for (auto& queue : s.in_order) {
    while (!queue.empty()) {
      Impl::Job& j = *queue.front();
      if (j.recorded && !j.released) {
        const int e = s.rt->event_query(j.done);
        if (e == dev::not_ready) break;  // later jobs of this direction wait their turn
        if (e != dev::ok) {
          (void)s.rt->get_last_error();
          if (!j.failed) {
            j.failed = true;
            j.error = fmt::format("job {}: {}", j.plan.job, s.rt->describe(e));
          }
        }
        if (!j.failed && j.mismatch != nullptr) {
          s.rt->host_access(j.mismatch, sizeof(int), false);
          if (*j.mismatch != 0) {
            j.failed = true;
            j.error = fmt::format(
                "job {}: the device block table disagrees with the job (a group's non-null ids "
                "differ from its group_sizes, or an id is past the group's tensors); nothing "
                "was copied",
                j.plan.job);
          }
        }
        if (!j.failed) s.scatter(j);
      }
      s.release(j);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - j.start).count();
      finished.push_back({j.ticket, j.plan.job, j.plan.kind, !j.failed, std::move(j.error),
                          j.failed ? 0 : j.plan.total_bytes, seconds});
      queue.pop_front();
    }
  }
}

void CudaBackend::wait(Ticket ticket) {
  Impl& s = *impl_;
  Impl::JobPtr job;
  {
    std::lock_guard lock(s.mutex);
    for (auto& queue : s.in_order) {
      for (auto& j : queue) {
        if (j->ticket == ticket) job = j;
      }
    }
    if (job == nullptr || job->failed || !job->recorded) return;
  }
  // Outside the lock, so submissions go on; the shared pointer keeps the job (and its event)
  // alive even if another thread polls it meanwhile.
  const int e = s.rt->event_synchronize(job->done);
  std::lock_guard lock(s.mutex);
  if (e != dev::ok) {
    (void)s.rt->get_last_error();
    if (!job->released && !job->failed) {
      job->failed = true;
      job->error = fmt::format("job {}: {}", job->plan.job, s.rt->describe(e));
    }
    return;
  }
  // A staged store is finished once its bytes are in the pool.
  if (!job->released && !job->failed && !job->cancelled) s.scatter(*job);
}

void CudaBackend::shutdown(bool drain) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  s.stopping = true;
  if (!drain) {
    for (auto& queue : s.in_order) {
      for (auto& j : queue) {
        if (j->failed || !j->recorded || s.rt->event_query(j->done) == dev::ok) continue;
        (void)s.rt->get_last_error();
        j->failed = true;
        j->cancelled = true;
        j->error = fmt::format("job {}: cancelled (backend shut down without drain)", j->plan.job);
      }
    }
  }
  // The GPU work cannot be recalled: wait for it on the backend's own device and streams.
  try {
    Scope scope(*s.rt, s.config.device);
    for (StreamHandle stream : s.streams) (void)s.rt->stream_synchronize(stream);
    (void)s.rt->get_last_error();
  } catch (const cuda_error& e) {
    detail::logger().error("CUDA backend: shutdown: {}", e.what());
  }
}

CudaBackendConfig calibrate(const CudaBackendConfig& config,
                            std::shared_ptr<DeviceRuntime> runtime) {
  CudaBackendConfig out = config;
  if (runtime == nullptr) {
    if (!CudaBackend::available()) return out;
    runtime = cuda_runtime();
  }
  DeviceRuntime& rt = *runtime;
  Scope scope(rt, config.device);
  const std::size_t total = std::size_t{64} << 20;
  Owned d(rt, Owned::Kind::device), h(rt, Owned::Kind::host);
  auto fail = [&](int e, const char* what) {
    if (e != dev::ok)
      throw cuda_error(fmt::format("calibrate: {} failed: {}", what, rt.describe(e)));
  };
  fail(d.allocate(total), "malloc_device");
  fail(h.allocate(total), "malloc_host");
  auto time_mode = [&](CopyMode mode, std::uint64_t piece, JobKind dir) {
    CudaBackendConfig c = config;
    c.mode = mode;
    c.compute_stream.reset();
    CudaBackend backend(c, runtime);
    CopyPlan plan;
    plan.kind = dir;
    const auto dv = reinterpret_cast<std::uintptr_t>(d.get());
    const auto hv = reinterpret_cast<std::uintptr_t>(h.get());
    for (std::uint64_t off = 0; off + piece <= total; off += 2 * piece) {
      plan.descriptors.push_back(dir == JobKind::store ? CopyDescriptor{dv + off, hv + off, piece}
                                                       : CopyDescriptor{hv + off, dv + off, piece});
      plan.total_bytes += piece;
    }
    backend.wait(backend.submit(plan));  // warm up
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 3; ++i) backend.wait(backend.submit(plan));
    std::vector<BackendResult> done;
    backend.poll(done);
    for (const BackendResult& r : done) {
      if (!r.ok)
        throw cuda_error(fmt::format("calibrate: a {} copy failed: {}", to_string(mode), r.error));
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  for (const JobKind dir : {JobKind::store, JobKind::load}) {
    std::uint64_t crossover = 4096;
    for (std::uint64_t piece = 4096; piece <= (std::uint64_t{4} << 20); piece *= 2) {
      if (time_mode(CopyMode::kernel, piece, dir) <= time_mode(CopyMode::batch, piece, dir)) {
        crossover = piece * 2;
      }
    }
    (dir == JobKind::store ? out.store_small_piece_bytes : out.load_small_piece_bytes) = crossover;
  }
  return out;
}

DeviceCompactor::DeviceCompactor(std::int64_t max_ids, int max_groups,
                                 std::shared_ptr<DeviceRuntime> runtime)
    : rt_(runtime != nullptr ? std::move(runtime) : cuda_runtime()),
      max_ids_(max_ids),
      max_groups_(max_groups) {
  KVOFFLOAD_EXPECTS(max_ids >= 1 && max_groups >= 1, "compactor: sizes must be positive");
  int e = rt_->compaction_temp_bytes(max_ids, max_groups, &temp_bytes_);
  if (e == dev::ok) e = rt_->malloc_device(&temp_, std::max<std::size_t>(temp_bytes_, 1));
  if (e != dev::ok) {
    throw cuda_error(fmt::format("compactor: temporary storage: {}", rt_->describe(e)));
  }
}

DeviceCompactor::~DeviceCompactor() {
  if (temp_ != nullptr) (void)rt_->free_device(temp_);
}

void DeviceCompactor::compact(const std::int32_t* ids, std::int64_t n, const std::int64_t* offsets,
                              int groups, const std::int64_t* expected, std::int32_t* out,
                              std::int64_t* count, std::int64_t* group_counts, int* mismatch,
                              std::uintptr_t stream) {
  KVOFFLOAD_EXPECTS(
      n >= 0 && n <= max_ids_ && groups >= 1 && groups <= max_groups_,
      "compactor: {} ids in {} groups exceed the {} ids and {} groups it was sized for", n, groups,
      max_ids_, max_groups_);
  CompactArgs a;
  a.ids = ids;
  a.n = n;
  a.offsets = offsets;
  a.groups = groups;
  a.expected = expected;
  a.out = out;
  a.count = count;
  a.group_counts = group_counts;
  a.mismatch = mismatch;
  a.temp = temp_;
  a.temp_bytes = temp_bytes_;
  const int e = rt_->launch_compact(a, stream);
  if (e != dev::ok) {
    (void)rt_->get_last_error();
    throw cuda_error(fmt::format("compactor: {}", rt_->describe(e)));
  }
}

}  // namespace kvoffload
