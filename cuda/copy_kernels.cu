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

__global__ void build_pieces_kernel(DeviceJobLayout layout, const std::int32_t* ids,
                                    const std::int64_t* count, const std::int64_t* group_counts,
                                    const std::int32_t* host_ids, DevicePiece* pieces,
                                    std::uint64_t max_pieces) {
  const std::uint64_t n =
      static_cast<std::uint64_t>(*count) * static_cast<std::uint64_t>(layout.max_tensors);
  for (std::uint64_t x = blockIdx.x * blockDim.x + threadIdx.x; x < max_pieces;
       x += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    pieces[x] = x < n ? piece_for(layout, ids, group_counts, host_ids, x / layout.max_tensors,
                                  static_cast<int>(x % layout.max_tensors))
                      : DevicePiece{0, 0, 0};
  }
}

}  // namespace

int launch_build_and_copy(const DeviceJobLayout& layout, const std::int32_t* ids,
                          const std::int64_t* count, const std::int64_t* group_counts,
                          const std::int32_t* host_ids, DevicePiece* pieces,
                          std::uint64_t max_pieces, int ctas, int threads, void* stream) noexcept {
  if (max_pieces == 0) return static_cast<int>(cudaSuccess);
  const auto s = static_cast<cudaStream_t>(stream);
  build_pieces_kernel<<<ctas, threads, 0, s>>>(layout, ids, count, group_counts, host_ids, pieces,
                                               max_pieces);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return static_cast<int>(e);
  return launch_copy_pieces(pieces, max_pieces, ctas, threads, stream);
}

int launch_copy_pieces(const DevicePiece* pieces, std::uint64_t count, int ctas, int threads,
                       void* stream) noexcept {
  if (count == 0) return static_cast<int>(cudaSuccess);
  copy_pieces_kernel<<<ctas, threads, 0, static_cast<cudaStream_t>(stream)>>>(pieces, count);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kvoffload::detail
