#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvoffload/export.hpp"
#include "kvoffload/types.hpp"

namespace kvoffload {

/// One canonical KV tensor of the engine's GPU cache: `num_blocks` pages, page i at
/// base + i * block_stride_bytes, each `page_bytes` long. Per-layer K and V tensors, K/V packed
/// in one tensor, and cross-layer tensors (one page holds every layer) are all this shape with
/// different sizes and strides.
struct KvTensor {
  std::uintptr_t base = 0;
  std::int64_t num_blocks = 0;
  std::int64_t page_bytes = 0;
  std::int64_t block_stride_bytes = 0;
};

/// A tensor a group owns, with the bytes of each page that hold data (hybrid models pad pages
/// to a common size; the padding is not copied). Groups may share tensors.
struct GroupTensor {
  std::int32_t tensor = 0;
  std::int64_t page_bytes = 0;  ///< unpadded, <= the tensor's page_bytes
};

/// The engine's GPU KV cache and the host block layout derived from it: a host block of group
/// g holds, for each of g's tensors in order, block_size_factor consecutive pages
/// (`page_bytes` each, unpadded). Immutable; thread-safe.
class KVOFFLOAD_EXPORT KvLayout {
 public:
  /// Throws invalid_argument naming the tensor or group for a bad layout (no tensors, zero or
  /// negative sizes, a stride smaller than the page, a group tensor out of range or larger than
  /// its tensor's page, a group with no tensors, a null base).
  KvLayout(std::vector<KvTensor> tensors, std::vector<std::vector<GroupTensor>> groups,
           std::int64_t block_size_factor);

  [[nodiscard]] const std::vector<KvTensor>& tensors() const noexcept { return tensors_; }
  [[nodiscard]] const std::vector<GroupTensor>& group(std::size_t g) const { return groups_.at(g); }
  [[nodiscard]] std::size_t num_groups() const noexcept { return groups_.size(); }
  [[nodiscard]] std::int64_t block_size_factor() const noexcept { return f_; }
  /// Bytes of group g's host blocks.
  [[nodiscard]] std::int64_t host_block_bytes(std::size_t g) const { return host_bytes_.at(g); }
  /// The largest host block over all groups: the host pool's block size, rounded up to
  /// `alignment`.
  [[nodiscard]] std::int64_t pool_block_bytes(std::int64_t alignment = 256) const noexcept;
  /// Offset in a host block of group g of its k-th tensor's sub-block `sub`.
  [[nodiscard]] std::int64_t host_offset(std::size_t g, std::size_t k, std::int64_t sub) const {
    return offsets_[g][k] + sub * groups_[g][k].page_bytes;
  }

 private:
  std::vector<KvTensor> tensors_;
  std::vector<std::vector<GroupTensor>> groups_;
  std::vector<std::vector<std::int64_t>> offsets_;  // per group, per tensor: start in the block
  std::vector<std::int64_t> host_bytes_;
  std::int64_t f_;
};

}  // namespace kvoffload
