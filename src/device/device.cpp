#include "kvoffload/device.hpp"

#include "kvoffload/device_runtime.hpp"

namespace kvoffload {

bool built_with_cuda() noexcept {
#if defined(KVOFFLOAD_HAVE_CUDA)
  return true;
#else
  return false;
#endif
}

int cuda_device_count() noexcept {
  if (!built_with_cuda()) return 0;
  try {
    return cuda_runtime()->device_count();  // no driver or no device: 0, no error left
  } catch (...) {
    return 0;
  }
}

}  // namespace kvoffload
