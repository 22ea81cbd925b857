#include "kvoffload/kv_layout.hpp"

#include <algorithm>

#include "common/expects.hpp"

namespace kvoffload {

KvLayout::KvLayout(std::vector<KvTensor> tensors, std::vector<std::vector<GroupTensor>> groups,
                   std::int64_t block_size_factor)
    : tensors_(std::move(tensors)), groups_(std::move(groups)), f_(block_size_factor) {
  KVOFFLOAD_EXPECTS(!tensors_.empty(), "layout: no tensors");
  KVOFFLOAD_EXPECTS(!groups_.empty(), "layout: no groups");
  KVOFFLOAD_EXPECTS(f_ >= 1, "layout: block_size_factor must be at least 1, got {}", f_);
  for (std::size_t t = 0; t < tensors_.size(); ++t) {
    const KvTensor& k = tensors_[t];
    KVOFFLOAD_EXPECTS(k.base != 0, "layout: tensor {} has a null base", t);
    KVOFFLOAD_EXPECTS(k.num_blocks >= 1, "layout: tensor {}: num_blocks must be positive, got {}",
                      t, k.num_blocks);
    KVOFFLOAD_EXPECTS(k.page_bytes >= 1, "layout: tensor {}: page_bytes must be positive, got {}",
                      t, k.page_bytes);
    KVOFFLOAD_EXPECTS(k.block_stride_bytes >= k.page_bytes,
                      "layout: tensor {}: block_stride_bytes {} is smaller than page_bytes {}", t,
                      k.block_stride_bytes, k.page_bytes);
  }
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    KVOFFLOAD_EXPECTS(!groups_[g].empty(), "layout: group {} has no tensors", g);
    std::vector<std::int64_t> offsets;
    std::int64_t at = 0;
    for (std::size_t k = 0; k < groups_[g].size(); ++k) {
      const GroupTensor& gt = groups_[g][k];
      KVOFFLOAD_EXPECTS(gt.tensor >= 0 && static_cast<std::size_t>(gt.tensor) < tensors_.size(),
                        "layout: group {} tensor {}: no tensor {} (there are {})", g, k, gt.tensor,
                        tensors_.size());
      KVOFFLOAD_EXPECTS(
          gt.page_bytes >= 1 &&
              gt.page_bytes <= tensors_[static_cast<std::size_t>(gt.tensor)].page_bytes,
          "layout: group {} tensor {}: page_bytes {} is outside 1..{}", g, k, gt.page_bytes,
          tensors_[static_cast<std::size_t>(gt.tensor)].page_bytes);
      offsets.push_back(at);
      at += gt.page_bytes * f_;
    }
    offsets_.push_back(std::move(offsets));
    host_bytes_.push_back(at);
  }
}

std::int64_t KvLayout::pool_block_bytes(std::int64_t alignment) const noexcept {
  const std::int64_t most = *std::max_element(host_bytes_.begin(), host_bytes_.end());
  return (most + alignment - 1) / alignment * alignment;
}

}  // namespace kvoffload
