#include <cuda_runtime_api.h>

#include <algorithm>

#include <thrust/iterator/transform_iterator.h>
#include <cub/device/device_segmented_reduce.cuh>
#include <cub/device/device_select.cuh>

#include "compaction.cuh"
#include "kvoffload/detail/copy_body.hpp"

namespace kvoffload::detail {
namespace {

struct IsReal {
  __host__ __device__ std::int64_t operator()(std::int32_t id) const {
    return NotNullBlock{}(id) ? 1 : 0;
  }
};

__global__ void check_group_counts(const std::int64_t* counts, const std::int64_t* expected,
                                   int groups, int* mismatch) {
  const int g = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (g < groups && counts[g] != expected[g]) *mismatch = 1;
}

// Ids below 0 or above their group's largest block id are a mismatch too.
__global__ void check_id_range(const std::int32_t* ids, std::int64_t n, const std::int64_t* offsets,
                               int groups, const std::int64_t* max_id, int* mismatch) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    int g = 0;
    while (g + 1 < groups && i >= offsets[g + 1]) ++g;
    const std::int32_t id = ids[i];
    if (id < 0 || id > max_id[g]) *mismatch = 1;
  }
}

}  // namespace

int compaction_temp_bytes(std::int64_t max_ids, int max_groups, std::size_t* bytes) noexcept {
  std::size_t select = 0, reduce = 0;
  cudaError_t e =
      cub::DeviceSelect::If(nullptr, select, static_cast<const std::int32_t*>(nullptr),
                            static_cast<std::int32_t*>(nullptr),
                            static_cast<std::int64_t*>(nullptr), max_ids, NotNullBlock{});
  if (e != cudaSuccess) return static_cast<int>(e);
  // The size query reads no pointer, but arithmetic on a null one is undefined: the segment
  // ends are passed as null too.
  auto flags = thrust::make_transform_iterator(static_cast<const std::int32_t*>(nullptr), IsReal{});
  const auto* no_offsets = static_cast<const std::int64_t*>(nullptr);
  e = cub::DeviceSegmentedReduce::Sum(nullptr, reduce, flags, static_cast<std::int64_t*>(nullptr),
                                      max_groups, no_offsets, no_offsets);
  if (e != cudaSuccess) return static_cast<int>(e);
  *bytes = std::max(select, reduce);
  return static_cast<int>(cudaSuccess);
}

int compact_block_ids(const std::int32_t* ids, std::int64_t n, const std::int64_t* offsets,
                      int groups, const std::int64_t* expected, std::int32_t* out,
                      const std::int64_t* max_id, std::int64_t* count, std::int64_t* group_counts,
                      int* mismatch, void* temp, std::size_t temp_bytes, void* stream) noexcept {
  const auto s = static_cast<cudaStream_t>(stream);
  std::size_t bytes = temp_bytes;
  cudaError_t e = cub::DeviceSelect::If(temp, bytes, ids, out, count, n, NotNullBlock{}, s);
  if (e != cudaSuccess) return static_cast<int>(e);
  bytes = temp_bytes;
  auto flags = thrust::make_transform_iterator(ids, IsReal{});
  e = cub::DeviceSegmentedReduce::Sum(temp, bytes, flags, group_counts, groups, offsets,
                                      offsets + 1, s);
  if (e != cudaSuccess) return static_cast<int>(e);
  e = cudaMemsetAsync(mismatch, 0, sizeof(int), s);
  if (e != cudaSuccess) return static_cast<int>(e);
  check_group_counts<<<(groups + 127) / 128, 128, 0, s>>>(group_counts, expected, groups, mismatch);
  e = cudaGetLastError();
  if (e != cudaSuccess || max_id == nullptr || n == 0) return static_cast<int>(e);
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((n + 255) / 256, 1024));
  check_id_range<<<blocks, 256, 0, s>>>(ids, n, offsets, groups, max_id, mismatch);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kvoffload::detail
