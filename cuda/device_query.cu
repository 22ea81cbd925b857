#include <cuda_runtime_api.h>

#include "device_query.cuh"

namespace kvoffload::detail {

int cuda_visible_devices() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  return count;
}

}  // namespace kvoffload::detail
