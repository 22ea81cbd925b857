#include "kvoffload/device_runtime.hpp"

#include "kvoffload/error.hpp"

namespace kvoffload {

DeviceRuntime::~DeviceRuntime() = default;

#if !defined(KVOFFLOAD_HAVE_CUDA)
std::shared_ptr<DeviceRuntime> cuda_runtime() {
  throw cuda_error(
      "this build of kvoffload has no CUDA support (the simulated device, "
      "SimDevice, runs the CUDA backend without one)");
}
#endif

}  // namespace kvoffload
