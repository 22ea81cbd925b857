// The CudaBackend of a build without CUDA: it reports that it is unavailable and refuses to
// be constructed, so engines can link the same API either way.

#include "kvoffload/cuda_backend.hpp"
#include "kvoffload/error.hpp"

namespace kvoffload {

struct CudaBackend::Impl {};

bool CudaBackend::available() noexcept {
  return false;
}
CudaBackend::CudaBackend(const CudaBackendConfig& /*config*/) {
  throw cuda_error("CudaBackend: this build of kvoffload has no CUDA support");
}
CudaBackend::~CudaBackend() = default;
Ticket CudaBackend::submit(CopyPlan /*plan*/) {
  return 0;
}
void CudaBackend::poll(std::vector<BackendResult>& /*finished*/) {}
void CudaBackend::wait(Ticket /*ticket*/) {}
void CudaBackend::shutdown(bool /*drain*/) {}
void CudaBackend::set_compute_stream(std::uintptr_t /*stream*/) {}
Ticket CudaBackend::submit_device_table(const TransferJob&, Direction, const KvLayout&,
                                        const HostRegion&, const std::int32_t*,
                                        std::span<const std::int64_t>) {
  return 0;
}
bool CudaBackend::batch_available() const noexcept {
  return false;
}
bool CudaBackend::kernel_available() const noexcept {
  return false;
}
CopyMode CudaBackend::mode_for(const CopyPlan& /*plan*/) const noexcept {
  return CopyMode::memcpy;
}
const CudaBackendConfig& CudaBackend::config() const noexcept {
  static const CudaBackendConfig none;
  return none;
}
CudaBackendConfig calibrate(const CudaBackendConfig& config) {
  return config;
}

DeviceCompactor::DeviceCompactor(std::int64_t max_ids, int max_groups)
    : max_ids_(max_ids), max_groups_(max_groups) {
  throw cuda_error("DeviceCompactor: this build of kvoffload has no CUDA support");
}
DeviceCompactor::~DeviceCompactor() = default;
void DeviceCompactor::compact(const std::int32_t*, std::int64_t, const std::int64_t*, int,
                              const std::int64_t*, std::int32_t*, std::int64_t*, std::int64_t*,
                              int*, std::uintptr_t) {}

}  // namespace kvoffload
