#pragma once

// Host-only declarations of the CUDA side of PinnedHostPool; safe to include from .cpp files.
// Nothing here throws or logs: errors come back as cudaError_t values (as int).

#include <cstddef>

namespace kvoffload::detail {

/// cudaHostRegister(ptr, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped): pinned for
/// every device and mapped into their address spaces (the kernel modes read it). Returns the
/// cudaError_t.
int cuda_host_register(void* ptr, std::size_t bytes) noexcept;
/// cudaHostUnregister(ptr). Returns the cudaError_t.
int cuda_host_unregister(void* ptr) noexcept;
/// cudaGetErrorName, e.g. "cudaErrorMemoryAllocation".
const char* cuda_error_name(int error) noexcept;

}  // namespace kvoffload::detail
