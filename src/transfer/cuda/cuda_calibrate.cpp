// calibrate(): what the automatic copy mode should pick, measured on the device the way a
// serving engine loads it: each direction's jobs timed while the other direction copies at
// the same time (both copy engines and both directions of the link busy), in the kernel,
// staged and batch modes, one backend per mode.

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "kvoffload/cuda_backend.hpp"
#include "kvoffload/device_runtime.hpp"
#include "transfer/cuda/device_scope.hpp"

namespace kvoffload {

using detail::Owned;
using detail::Scope;

namespace {

/// Half of `bytes` in pieces of `piece` as an engine's jobs lie: every other page on the device
/// (so no two merge), back to back on the host (a host block holds a block's pages of every
/// layer), from `device` to `host` (a store) or back.
CopyPlan strided_plan(JobKind dir, std::uintptr_t device, std::uintptr_t host, std::uint64_t bytes,
                      std::uint64_t piece) {
  CopyPlan plan;
  plan.kind = dir;
  for (std::uint64_t i = 0; (2 * i + 1) * piece <= bytes; ++i) {
    const std::uintptr_t d = device + 2 * i * piece, h = host + i * piece;
    plan.descriptors.push_back(dir == JobKind::store ? CopyDescriptor{d, h, piece}
                                                     : CopyDescriptor{h, d, piece});
    plan.total_bytes += piece;
  }
  return plan;
}

void require_ok(CudaBackend& backend) {
  std::vector<BackendResult> done;
  backend.poll(done);
  for (const BackendResult& r : done) {
    if (!r.ok) {
      throw cuda_error(fmt::format("calibrate: a {} copy failed: {}",
                                   to_string(backend.config().mode), r.error));
    }
  }
}

}  // namespace

CudaBackendConfig calibrate(const CudaBackendConfig& config, std::shared_ptr<DeviceRuntime> runtime,
                            const CalibrateOptions& options) {
  if (runtime == nullptr) {
    if (!CudaBackend::available()) return config;
    runtime = cuda_runtime();
  }
  DeviceRuntime& rt = *runtime;
  Scope scope(rt, config.device);
  const std::uint64_t bytes = options.bytes;
  // Two halves on each side: the measured direction's, and the other direction's traffic.
  Owned d(rt, Owned::Kind::device), h(rt, Owned::Kind::host);
  auto fail = [&](int e, const char* what) {
    if (e != dev::ok)
      throw cuda_error(fmt::format("calibrate: {} failed: {}", what, rt.describe(e)));
  };
  fail(d.allocate(2 * bytes), "malloc_device");
  fail(h.allocate(2 * bytes), "malloc_host");
  const auto dv = reinterpret_cast<std::uintptr_t>(d.get());
  const auto hv = reinterpret_cast<std::uintptr_t>(h.get());
  auto make = [&](CopyMode mode) {
    CudaBackendConfig c = config;
    c.mode = mode;
    c.compute_stream.reset();
    c.staging_bytes = mode == CopyMode::staged ? bytes + (bytes >> 2) : 0;
    c.host_base = hv;
    c.host_bytes = 2 * bytes;
    c.host_registration_bytes = 0;  // one allocation
    return std::make_unique<CudaBackend>(c, runtime);
  };
  auto kernel = make(CopyMode::kernel);
  auto staged = make(CopyMode::staged);
  auto batch = make(CopyMode::batch);
  auto other = make(CopyMode::batch);  // the other direction's traffic, 1 MiB pieces
  // Seconds for `reps` jobs of `dir` in `backend`'s mode while the other direction copies as
  // many bytes at once (submitted first, waited for after).
  auto time_under_load = [&](CudaBackend& backend, std::uint64_t piece, JobKind dir) {
    const JobKind back = dir == JobKind::store ? JobKind::load : JobKind::store;
    const CopyPlan plan = strided_plan(dir, dv, hv, bytes, piece);
    const CopyPlan traffic = strided_plan(back, dv + bytes, hv + bytes, bytes,
                                          std::min<std::uint64_t>(bytes / 2, 1 << 20));
    backend.wait(backend.submit(plan));  // warm up
    double seconds = 0;
    for (int i = 0; i < options.reps; ++i) {
      const Ticket t = other->submit(traffic);
      const auto start = std::chrono::steady_clock::now();
      backend.wait(backend.submit(plan));
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      other->wait(t);
    }
    require_ok(backend);
    require_ok(*other);
    return seconds;
  };
  const bool can_stage = staged->kernel_available();
  std::vector<CalibrationSample> samples;
  for (const JobKind dir : {JobKind::store, JobKind::load}) {
    for (std::uint64_t piece = options.min_piece; piece <= options.max_piece && piece <= bytes / 2;
         piece *= 2) {
      CalibrationSample m{dir, piece, 0, 0, 0};
      m.kernel_s = time_under_load(*kernel, piece, dir);
      m.staged_s = can_stage ? time_under_load(*staged, piece, dir) : -1;
      m.batch_s = time_under_load(*batch, piece, dir);
      samples.push_back(m);
    }
  }
  return choose_calibration(config, samples);
}

}  // namespace kvoffload
