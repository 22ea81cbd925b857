#include <cuda_runtime_api.h>

#include "copy_kernels.cuh"

namespace kvoffload::detail {
namespace {

__global__ void copy_pieces_kernel(const DevicePiece* pieces, std::uint64_t count) {
  const unsigned lanes = warpSize;
  const unsigned lane = threadIdx.x % lanes;
  const unsigned warps_per_cta = blockDim.x / lanes;
  const unsigned warp = blockIdx.x * warps_per_cta + threadIdx.x / lanes;
  copy_pieces(pieces, count, warp, gridDim.x * warps_per_cta, lane, lanes);
}

}  // namespace

int launch_copy_pieces(const DevicePiece* pieces, std::uint64_t count, int ctas, int threads,
                       void* stream) noexcept {
  if (count == 0) return static_cast<int>(cudaSuccess);
  copy_pieces_kernel<<<ctas, threads, 0, static_cast<cudaStream_t>(stream)>>>(pieces, count);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kvoffload::detail
