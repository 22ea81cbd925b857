#include <cuda_runtime_api.h>

#include "host_registration.cuh"

namespace kvoffload::detail {

int cuda_host_register(void* ptr, std::size_t bytes) noexcept {
  const cudaError_t e =
      cudaHostRegister(ptr, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
  if (e != cudaSuccess) (void)cudaGetLastError();  // do not leave the error for the next call
  return static_cast<int>(e);
}

int cuda_host_unregister(void* ptr) noexcept {
  const cudaError_t e = cudaHostUnregister(ptr);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return static_cast<int>(e);
}

const char* cuda_error_name(int error) noexcept {
  return cudaGetErrorName(static_cast<cudaError_t>(error));
}

}  // namespace kvoffload::detail
