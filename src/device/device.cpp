#include "kvoffload/device.hpp"

#if defined(KVOFFLOAD_HAVE_CUDA)
#include "../cuda/device_query.cuh"
#endif

namespace kvoffload {

bool built_with_cuda() noexcept {
#if defined(KVOFFLOAD_HAVE_CUDA)
  return true;
#else
  return false;
#endif
}

int cuda_device_count() noexcept {
#if defined(KVOFFLOAD_HAVE_CUDA)
  return detail::cuda_visible_devices();
#else
  return 0;
#endif
}

}  // namespace kvoffload
