// calibrate(): the piece sizes below which the kernel mode beats batch copies, measured with one
// backend per mode on the device.

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
  // One backend per mode for the whole sweep, without staging buffers (no staged job runs).
  auto make = [&](CopyMode mode) {
    CudaBackendConfig c = config;
    c.mode = mode;
    c.compute_stream.reset();
    c.staging_bytes = 0;
    return std::make_unique<CudaBackend>(c, runtime);
  };
  const auto kernel = make(CopyMode::kernel);
  const auto batch = make(CopyMode::batch);
  auto time_mode = [&](CudaBackend& backend, std::uint64_t piece, JobKind dir) {
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
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::vector<BackendResult> done;
    backend.poll(done);
    for (const BackendResult& r : done) {
      if (!r.ok) {
        throw cuda_error(fmt::format("calibrate: a {} copy failed: {}",
                                     to_string(backend.config().mode), r.error));
      }
    }
    return seconds;
  };
  for (const JobKind dir : {JobKind::store, JobKind::load}) {
    std::uint64_t crossover = 4096;
    for (std::uint64_t piece = 4096; piece <= (std::uint64_t{4} << 20); piece *= 2) {
      if (time_mode(*kernel, piece, dir) <= time_mode(*batch, piece, dir)) {
        crossover = piece * 2;
      }
    }
    (dir == JobKind::store ? out.store_small_piece_bytes : out.load_small_piece_bytes) = crossover;
  }
  return out;
}

}  // namespace kvoffload
