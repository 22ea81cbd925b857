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
