#pragma once

// The bodies of the CUDA copy kernels as __host__ __device__ functions: the kernels in
// cuda/copy_kernels.cu call them per warp lane, and the CPU tests call them with every lane in
// a loop, so the indexing is tested on machines without a GPU.

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KVOFFLOAD_HOST_DEVICE __host__ __device__
#else
#define KVOFFLOAD_HOST_DEVICE
#endif

namespace kvoffload::detail {

/// A copy as the kernels see it (the same layout as CopyDescriptor).
struct DevicePiece {
  std::uint64_t src;
  std::uint64_t dst;
  std::uint64_t bytes;
};

struct alignas(16) Vec16 {
  std::uint64_t a, b;
};

/// Lane `lane` of `lanes` copies its share of one piece: 16-byte words when source,
/// destination and length allow, single bytes otherwise. Together the lanes copy every byte
/// exactly once.
KVOFFLOAD_HOST_DEVICE inline void copy_piece(const DevicePiece& p, unsigned lane, unsigned lanes) {
  const bool aligned = ((p.src | p.dst | p.bytes) & 15U) == 0;
  if (aligned) {
    const auto* s = reinterpret_cast<const Vec16*>(p.src);
    auto* d = reinterpret_cast<Vec16*>(p.dst);
    const std::uint64_t n = p.bytes / 16;
    for (std::uint64_t i = lane; i < n; i += lanes) d[i] = s[i];
    return;
  }
  const auto* s = reinterpret_cast<const unsigned char*>(p.src);
  auto* d = reinterpret_cast<unsigned char*>(p.dst);
  for (std::uint64_t i = lane; i < p.bytes; i += lanes) d[i] = s[i];
}

/// Which pieces warp `warp` of `warps` handles: piece i goes to warp i % warps.
KVOFFLOAD_HOST_DEVICE inline void copy_pieces(const DevicePiece* pieces, std::uint64_t count,
                                              unsigned warp, unsigned warps, unsigned lane,
                                              unsigned lanes) {
  for (std::uint64_t i = warp; i < count; i += warps) copy_piece(pieces[i], lane, lanes);
}

/// The staged store: piece i's bytes go to staging + offsets[i] (the exclusive prefix sum of
/// the sizes, which the host computes), so the pieces lie back to back for one large copy.
KVOFFLOAD_HOST_DEVICE inline DevicePiece staged_piece(const DevicePiece& p, std::uint64_t staging,
                                                      std::uint64_t offset) {
  return DevicePiece{p.src, staging + offset, p.bytes};
}

/// The GPU compaction's predicate: a block id that is not the null block.
struct NotNullBlock {
  KVOFFLOAD_HOST_DEVICE bool operator()(std::int32_t id) const { return id != 0; }
};

}  // namespace kvoffload::detail

namespace kvoffload::detail {

/// What the device needs to turn a job's compacted GPU block ids into copy pieces without the
/// host: per group its first block index, its tensors (base, stride, unpadded page bytes and
/// offset in the host block) and where its host blocks start in host_ids. Passed to the
/// kernel by value.
struct DeviceJobLayout {
  static constexpr int kMaxGroups = 8;
  static constexpr int kMaxTensors = 8;  ///< per group
  struct Tensor {
    std::uint64_t base;
    std::uint64_t stride;
    std::uint64_t page_bytes;
    std::uint64_t host_offset;  ///< of sub-block 0 in the host block
  };
  int groups;
  int max_tensors;  ///< pieces per GPU block (the largest group's tensor count)
  std::int64_t block_size_factor;
  std::uint64_t host_base;
  std::uint64_t host_stride;
  bool store;  ///< GPU -> host; else host -> GPU
  std::int64_t block_index[kMaxGroups];
  std::int64_t first_host[kMaxGroups];  ///< index into host_ids of the group's first block
  int tensors[kMaxGroups];
  Tensor tensor[kMaxGroups][kMaxTensors];
};

/// Piece `k` of compacted GPU block `i` (ids and group_counts as the compaction wrote them;
/// host_ids are the job's host blocks, group-major). Groups with fewer tensors than
/// max_tensors yield empty pieces (bytes 0) for the rest.
KVOFFLOAD_HOST_DEVICE inline DevicePiece piece_for(const DeviceJobLayout& L,
                                                   const std::int32_t* ids,
                                                   const std::int64_t* group_counts,
                                                   const std::int32_t* host_ids, std::uint64_t i,
                                                   int k) {
  int g = 0;
  std::uint64_t start = 0;
  while (g + 1 < L.groups && i >= start + static_cast<std::uint64_t>(group_counts[g])) {
    start += static_cast<std::uint64_t>(group_counts[g]);
    ++g;
  }
  if (k >= L.tensors[g]) return DevicePiece{0, 0, 0};
  const std::int64_t f = L.block_size_factor;
  const std::int64_t pos = L.block_index[g] % f + static_cast<std::int64_t>(i - start);
  const std::int32_t host = host_ids[L.first_host[g] + pos / f];
  const DeviceJobLayout::Tensor& t = L.tensor[g][k];
  const std::uint64_t gpu = t.base + static_cast<std::uint64_t>(ids[i]) * t.stride;
  const std::uint64_t hst = L.host_base + static_cast<std::uint64_t>(host) * L.host_stride +
                            t.host_offset + static_cast<std::uint64_t>(pos % f) * t.page_bytes;
  return L.store ? DevicePiece{gpu, hst, t.page_bytes} : DevicePiece{hst, gpu, t.page_bytes};
}

}  // namespace kvoffload::detail
