#include <cuda_runtime_api.h>

#include "copy_kernels.cuh"

namespace kvoffload::detail {
namespace {

__global__ void copy_pieces_kernel(const DevicePiece* __restrict__ pieces, std::uint64_t count) {
  const unsigned lanes = warpSize;
  const unsigned lane = threadIdx.x % lanes;
  const std::uint64_t warps_per_cta = blockDim.x / lanes;
  const std::uint64_t warp = blockIdx.x * warps_per_cta + threadIdx.x / lanes;
  copy_pieces(pieces, count, warp, gridDim.x * warps_per_cta, lane, lanes);
}

// Reads *mismatch, which the compaction wrote earlier on the same stream: a job that failed
// its check gets only empty pieces, so the copy kernel after it moves no byte.
__global__ void build_pieces_kernel(DeviceJobLayout layout, const std::int32_t* __restrict__ ids,
                                    const std::int64_t* __restrict__ count,
                                    const std::int64_t* __restrict__ group_counts,
                                    const std::int32_t* __restrict__ host_ids,
                                    const int* __restrict__ mismatch,
                                    DevicePiece* __restrict__ pieces, std::uint64_t max_pieces) {
  for (std::uint64_t x = blockIdx.x * blockDim.x + threadIdx.x; x < max_pieces;
       x += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    pieces[x] = build_piece(layout, ids, count, group_counts, host_ids, mismatch, x);
  }
}

}  // namespace

int launch_build_pieces(const DeviceJobLayout& layout, const std::int32_t* ids,
                        const std::int64_t* count, const std::int64_t* group_counts,
                        const std::int32_t* host_ids, const int* mismatch, DevicePiece* pieces,
                        std::uint64_t max_pieces, int ctas, int threads, void* stream) noexcept {
  if (max_pieces == 0) return static_cast<int>(cudaSuccess);
  build_pieces_kernel<<<ctas, threads, 0, static_cast<cudaStream_t>(stream)>>>(
      layout, ids, count, group_counts, host_ids, mismatch, pieces, max_pieces);
  return static_cast<int>(cudaGetLastError());
}

int launch_copy_pieces(const DevicePiece* pieces, std::uint64_t count, int ctas, int threads,
                       void* stream) noexcept {
  if (count == 0) return static_cast<int>(cudaSuccess);
  copy_pieces_kernel<<<ctas, threads, 0, static_cast<cudaStream_t>(stream)>>>(pieces, count);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kvoffload::detail
