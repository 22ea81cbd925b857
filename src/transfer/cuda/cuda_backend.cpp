// CudaBackend: construction, submission, completion polling, waits and shutdown, written
// against DeviceRuntime so the same code runs on a GPU and on the simulated device in every
// build. The state is in cuda_backend_impl.hpp; the device-table path in cuda_device_table.cpp.

#include "kvoffload/cuda_backend.hpp"

#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "common/expects.hpp"
#include "common/logging.hpp"
#include "kvoffload/device.hpp"
#include "transfer/cuda/cuda_backend_impl.hpp"

namespace kvoffload {

using detail::DevicePiece;
using detail::Scope;

bool CudaBackend::available() noexcept {
  return cuda_device_count() > 0;
}

namespace {
void check_config(const CudaBackendConfig& config) {
  KVOFFLOAD_EXPECTS(config.device >= 0, "device is {} (must be >= 0)", config.device);
  KVOFFLOAD_EXPECTS(config.store_streams >= 1 && config.load_streams >= 1,
                    "store_streams and load_streams must be at least 1");
  KVOFFLOAD_EXPECTS(config.kernel_ctas >= 1 && config.kernel_ctas <= detail::kMaxKernelCtas,
                    "kernel_ctas is {} (must be 1 to {})", config.kernel_ctas,
                    detail::kMaxKernelCtas);
  KVOFFLOAD_EXPECTS(config.kernel_threads >= 32 && config.kernel_threads % 32 == 0 &&
                        config.kernel_threads <= 1024,
                    "kernel_threads is {} (must be a multiple of 32 up to 1024)",
                    config.kernel_threads);
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

ComputeMark CudaBackend::mark_compute() noexcept {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  try {
    return s.mark();
  } catch (const std::exception& e) {
    (void)s.rt->get_last_error();
    detail::logger().warn(
        "CUDA backend: a deferred store's compute mark failed ({}); it waits for the compute "
        "stream when it starts",
        e.what());
    return 0;
  }
}

void CudaBackend::drop_mark(ComputeMark mark) noexcept {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  s.give_back(s.take_mark(mark));
}

void CudaBackend::set_compute_stream(std::optional<StreamHandle> stream) {
  std::lock_guard lock(impl_->mutex);
  impl_->set_compute(stream);
}

void CudaBackend::check_tensors(std::span<const KvTensor> tensors) const {
  Impl& s = *impl_;
  const Scope scope(*s.rt, s.config.device);
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const KvTensor& k = tensors[t];
    if (k.num_blocks <= 0 || k.page_bytes <= 0) continue;  // the layout refuses these
    const std::uintptr_t last = k.base +
                                static_cast<std::uintptr_t>(k.num_blocks - 1) *
                                    static_cast<std::uintptr_t>(k.block_stride_bytes) +
                                static_cast<std::uintptr_t>(k.page_bytes) - 1;
    for (const std::uintptr_t p : {k.base, last}) {
      int device = -1;
      s.check(s.rt->pointer_device(reinterpret_cast<const void*>(p), &device), "pointer_device");
      if (device == -2) {  // e.g. memory mapped with cuMemMap where CUDA cannot tell: let it be
        detail::logger().warn(
            "CUDA backend: cannot tell which device holds KV tensor {} (byte {:#x}: CUDA cannot "
            "place it); not checked",
            t, p);
        break;
      }
      KVOFFLOAD_EXPECTS(
          device == s.config.device,
          "KV tensor {} ({} blocks of {} bytes at {:#x}): byte {:#x} is {}, but the CUDA "
          "backend is on device {} ({})",
          t, k.num_blocks, k.page_bytes, k.base, p,
          device < 0 ? std::string("not device memory") : fmt::format("on device {}", device),
          s.config.device,
          device < 0 ? "the KV cache must be on the GPU"
                     : "set cuda_device to the tensors' device");
    }
  }
}

Ticket CudaBackend::submit(CopyPlan plan) {
  Impl& s = *impl_;
  const bool store = plan.kind == JobKind::store;
  std::uint64_t sum = 0;
  for (const CopyDescriptor& d : plan.descriptors) sum += d.bytes;
  // The staged path sizes its staging slice from the pieces, and the result reports
  // total_bytes: a plan that disagrees with itself is refused before anything is queued.
  KVOFFLOAD_EXPECTS(sum == plan.total_bytes,
                    "job {}: total_bytes is {} but its {} copies add up to {} bytes", plan.job,
                    plan.total_bytes, plan.descriptors.size(), sum);
  // Named for profilers (an NVTX range: Nsight Systems shows each submission by job).
  const detail::Range range(*s.rt,
                            fmt::format("kvoffload {} job {}", to_string(plan.kind), plan.job));
  auto job = std::make_shared<Impl::Job>();
  job->rt = s.rt;
  job->plan = std::move(plan);
  job->mode = mode_for(job->plan);
  job->start = std::chrono::steady_clock::now();

  std::lock_guard lock(s.mutex);
  job->ticket = s.next_ticket++;
  Impl::Job& j = *job;
  s.in_order[store ? 0 : 1].push_back(std::move(job));
  // From here on nothing throws out of submit: the job is queued, and any failure fails it.
  // A deferred store's mark leaves the table now and goes back to the spares however the
  // submission ends (its wait, if any, is queued by then).
  struct MarkGuard {
    Impl& s;
    std::optional<EventHandle> ev;
    ~MarkGuard() { s.give_back(ev); }
  } mark{s, s.take_mark(j.plan.compute_mark)};
  std::optional<Scope> scope;
  std::optional<std::size_t> si;
  try {
    if (s.stopping) {
      j.error = fmt::format("job {}: backend is shut down", j.plan.job);
      return j.ticket;
    }
    try {
      scope.emplace(*s.rt, s.config.device);  // before any event or stream work
    } catch (const cuda_error& e) {
      j.error = fmt::format("job {}: {}", j.plan.job, e.what());
      return j.ticket;
    }
    const bool must_wait = store || s.config.loads_wait_for_compute;
    if (!s.capture_free(j, must_wait, mark.ev)) {
      s.release(j);
      return j.ticket;  // failed, with its error; nothing queued
    }
    si = s.pick_stream(store);
    if (j.mode == CopyMode::staged && !j.plan.descriptors.empty()) {
      j.staging_bytes = s.plan_runs(j);
      j.staging = s.staging_ring.allocate(j.staging_bytes);
      if (!j.staging) {  // staging is busy with earlier jobs: the kernel copies directly
        j.mode = CopyMode::kernel;
        if (j.staging_bytes <= s.staging_ring.capacity()) ++s.stats.staged_fell_back;
      }
    }
    if (j.mode == CopyMode::kernel || j.mode == CopyMode::staged) {
      const std::size_t bytes = j.plan.descriptors.size() * sizeof(DevicePiece);
      if (bytes > 0 && !s.reserve_upload(j, *si, bytes, bytes)) {
        // The stream's upload rings are full now, or smaller than this piece array: the copy
        // engines take the job instead, and nothing is allocated for it.
        ++s.stats.ring_fell_back;
        if (j.staging) s.staging_ring.release(*j.staging);
        j.staging.reset();
        j.mode = s.batch_ok ? CopyMode::batch : CopyMode::memcpy;
      }
    }
    s.count_mode(j.mode);
    const StreamHandle stream = s.streams[*si];
    int e = s.rt->event_create(&j.done);
    if (e != dev::ok) j.done = 0;
    if (e == dev::ok) e = s.wait_for_compute(stream, must_wait, mark.ev);
    if (e == dev::ok) e = s.enqueue(j, *si);
    if (e == dev::ok) e = s.rt->event_record(j.done, stream);
    if (e == dev::ok) {
      j.recorded = true;
      j.failed = false;
    } else {
      s.fail_submission(j, *si, e, fmt::format("{} mode", to_string(j.mode)));
    }
  } catch (const std::exception& e) {
    s.abandon(j, si, e.what());  // reported once, by poll: submit itself no longer throws
  } catch (...) {
    s.abandon(j, si, "an unknown exception");
  }
  return j.ticket;
}

void CudaBackend::poll(std::vector<BackendResult>& finished) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  std::optional<Scope> scope;  // event queries and frees, on the backend's device
  try {
    scope.emplace(*s.rt, s.config.device);
  } catch (const cuda_error& e) {
    // Never report a job whose copy may still run: ask its event anyway, on whatever
    // context this thread has (a dead context fails each job with its error).
    detail::logger().error("CUDA backend: poll: {}; polling without it", e.what());
  }
  for (auto& queue : s.in_order) {
    while (!queue.empty()) {
      Impl::Job& j = *queue.front();
      if (j.recorded && !j.released) {
        const int e = s.rt->event_query(j.done);
        if (e == dev::not_ready) break;  // later jobs of this direction wait their turn
        if (dev::capture_status(e)) {    // a capture elsewhere forbids the query: ask later
          (void)s.rt->get_last_error();
          break;
        }
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
      }
      s.release(j);
      if (j.failed && j.error.empty()) {
        j.error = fmt::format(
            "job {}: submission did not complete (it threw after the job was "
            "queued); nothing is reported copied",
            j.plan.job);
      }
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
  std::optional<Scope> scope;  // outlives `job`: its event may be destroyed here
  try {
    scope.emplace(*s.rt, s.config.device);
  } catch (const cuda_error& e) {
    detail::logger().error("CUDA backend: wait: {}; waiting without it", e.what());
  }
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
  // A graph capture elsewhere (global mode) refuses the synchronize while it lasts: ask again,
  // for at most kCaptureWait. The job is never released here (poll releases it once its event
  // says done), so a job given up on is failed, never reported ok, and holds its buffers.
  constexpr auto kCaptureWait = std::chrono::seconds(10);
  const auto until = std::chrono::steady_clock::now() + kCaptureWait;
  int e = s.rt->event_synchronize(job->done);
  while (dev::capture_status(e) && std::chrono::steady_clock::now() < until) {
    (void)s.rt->get_last_error();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    e = s.rt->event_synchronize(job->done);
  }
  std::lock_guard lock(s.mutex);
  if (e != dev::ok) {
    (void)s.rt->get_last_error();
    if (!job->released && !job->failed) {
      job->failed = true;
      job->error = dev::capture_status(e)
                       ? fmt::format(
                             "job {}: could not be waited for: a CUDA graph capture "
                             "refused every synchronize for {} s ({}); its result is "
                             "not trusted",
                             job->plan.job, kCaptureWait.count(), s.rt->describe(e))
                       : fmt::format("job {}: {}", job->plan.job, s.rt->describe(e));
    }
  }
}

void CudaBackend::shutdown(bool drain) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  s.stopping = true;
  std::optional<Scope> scope;
  try {
    scope.emplace(*s.rt, s.config.device);
  } catch (const cuda_error& e) {
    detail::logger().error("CUDA backend: shutdown: {}", e.what());
    return;
  }
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
  for (StreamHandle stream : s.streams) (void)s.rt->stream_synchronize(stream);
  (void)s.rt->get_last_error();
}

}  // namespace kvoffload
