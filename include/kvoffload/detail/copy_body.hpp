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

#if defined(__CUDACC__) || defined(__GNUC__)
#define KVOFFLOAD_RESTRICT __restrict__
#else
#define KVOFFLOAD_RESTRICT
#endif

/// How copy_piece splits a piece: `head` single bytes, `words` 16-byte words, single bytes for
/// the rest. Words only when source and destination are equally aligned modulo 16, so that
/// every word is 16-byte aligned on both sides (a misaligned vector access faults on a GPU).
struct PieceSplit {
  std::uint64_t head;
  std::uint64_t words;
};
KVOFFLOAD_HOST_DEVICE inline PieceSplit split_piece(const DevicePiece& p) {
  const std::uint64_t n = p.bytes;
  if (((p.src ^ p.dst) & 15U) == 0) {
    std::uint64_t head = (16 - (p.src & 15U)) & 15U;
    if (head > n) head = n;
    return {head, (n - head) / 16};
  }
  return {n, 0};  // unaligned pieces are all head
}

/// Lane `lane` of `lanes` copies its share of one piece. When source and destination are
/// equally aligned modulo 16: a byte head up to the 16-byte boundary, a body of 16-byte words
/// (four in flight per lane), a byte tail; otherwise single bytes. Together the lanes copy
/// every byte exactly once. The piece is taken by value (in registers).
KVOFFLOAD_HOST_DEVICE inline void copy_piece(const DevicePiece p, unsigned lane, unsigned lanes) {
  const auto* KVOFFLOAD_RESTRICT s = reinterpret_cast<const unsigned char*>(p.src);
  auto* KVOFFLOAD_RESTRICT d = reinterpret_cast<unsigned char*>(p.dst);
  const std::uint64_t n = p.bytes;
  const PieceSplit split = split_piece(p);
  const std::uint64_t head = split.head;
  const std::uint64_t words = split.words;
  for (std::uint64_t i = lane; i < head; i += lanes) d[i] = s[i];
  const auto* KVOFFLOAD_RESTRICT vs = reinterpret_cast<const Vec16*>(s + head);
  auto* KVOFFLOAD_RESTRICT vd = reinterpret_cast<Vec16*>(d + head);
  std::uint64_t w = lane;
  const std::uint64_t step = lanes;
  for (; w + 3 * step < words; w += 4 * step) {
    const Vec16 a = vs[w];
    const Vec16 b = vs[w + step];
    const Vec16 c = vs[w + 2 * step];
    const Vec16 e = vs[w + 3 * step];
    vd[w] = a;
    vd[w + step] = b;
    vd[w + 2 * step] = c;
    vd[w + 3 * step] = e;
  }
  for (; w < words; w += step) vd[w] = vs[w];
  const std::uint64_t tail = head + words * 16;
  for (std::uint64_t i = tail + lane; i < n; i += lanes) d[i] = s[i];
}

/// Which pieces warp `warp` of `warps` handles: piece i goes to warp i % warps. Warp indices
/// are 64-bit: a grid's warp count does not fit 32 bits for every launch shape.
KVOFFLOAD_HOST_DEVICE inline void copy_pieces(const DevicePiece* pieces, std::uint64_t count,
                                              std::uint64_t warp, std::uint64_t warps,
                                              unsigned lane, unsigned lanes) {
  for (std::uint64_t i = warp; i < count; i += warps) {
    const DevicePiece p = pieces[i];
    if (p.bytes != 0) copy_piece(p, lane, lanes);
  }
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
  std::int64_t host_count[kMaxGroups];  ///< the group's host blocks
  std::int64_t expected[kMaxGroups];    ///< the job's group_sizes: no group copies more
  std::int64_t max_id[kMaxGroups];      ///< the largest valid GPU block id of the group
  int tensors[kMaxGroups];
  Tensor tensor[kMaxGroups][kMaxTensors];
};

/// Piece `k` of compacted GPU block `i` (ids and group_counts as the compaction wrote them;
/// host_ids are the job's host blocks, group-major). Groups with fewer tensors than
/// max_tensors yield empty pieces (bytes 0) for the rest, and so does every position that a
/// wrong table would push past the group's expected size, host blocks or block ids: the
/// builder never addresses memory outside the job's blocks.
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
  const auto within = static_cast<std::int64_t>(i - start);
  if (within >= L.expected[g]) return DevicePiece{0, 0, 0};
  const std::int32_t id = ids[i];
  if (id <= 0 || id > L.max_id[g]) return DevicePiece{0, 0, 0};
  const std::int64_t f = L.block_size_factor;
  const std::int64_t pos = L.block_index[g] % f + within;
  if (pos / f >= L.host_count[g]) return DevicePiece{0, 0, 0};
  const std::int32_t host = host_ids[L.first_host[g] + pos / f];
  const DeviceJobLayout::Tensor& t = L.tensor[g][k];
  const std::uint64_t gpu = t.base + static_cast<std::uint64_t>(id) * t.stride;
  const std::uint64_t hst = L.host_base + static_cast<std::uint64_t>(host) * L.host_stride +
                            t.host_offset + static_cast<std::uint64_t>(pos % f) * t.page_bytes;
  return L.store ? DevicePiece{gpu, hst, t.page_bytes} : DevicePiece{hst, gpu, t.page_bytes};
}

/// Piece x of the device-table path's piece array (x / max_tensors is the compacted block,
/// x % max_tensors the tensor): empty past *count and for every piece when the compaction set
/// *mismatch, so a job that fails its check copies no byte.
KVOFFLOAD_HOST_DEVICE inline DevicePiece build_piece(const DeviceJobLayout& L,
                                                     const std::int32_t* ids,
                                                     const std::int64_t* count,
                                                     const std::int64_t* group_counts,
                                                     const std::int32_t* host_ids,
                                                     const int* mismatch, std::uint64_t x) {
  const auto per_block = static_cast<std::uint64_t>(L.max_tensors);
  if (*mismatch != 0 || x >= static_cast<std::uint64_t>(*count) * per_block) {
    return DevicePiece{0, 0, 0};
  }
  return piece_for(L, ids, group_counts, host_ids, x / per_block, static_cast<int>(x % per_block));
}

}  // namespace kvoffload::detail
