#pragma once

// Host side of the CUDA code: turns cudaError_t into kvoffload::cuda_error with file:line, the
// failing call and the error's name (the .cu files return errors, never throw).

#include <cuda_runtime_api.h>

#include <string>

#include "kvoffload/error.hpp"

namespace kvoffload::detail {

[[noreturn]] void throw_cuda_error(cudaError_t error, const char* call, const char* file, int line);
/// "cudaErrorInvalidValue (invalid argument)".
std::string describe(cudaError_t error);

}  // namespace kvoffload::detail

/// Runs a CUDA runtime call and throws kvoffload::cuda_error if it fails.
#define KVOFFLOAD_CUDA_TRY(call)                                                           \
  do {                                                                                     \
    const cudaError_t kvoffload_status_ = (call);                                          \
    if (kvoffload_status_ != cudaSuccess) [[unlikely]] {                                   \
      ::kvoffload::detail::throw_cuda_error(kvoffload_status_, #call, __FILE__, __LINE__); \
    }                                                                                      \
  } while (0)
