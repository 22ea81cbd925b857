#include "support/kv_fixture.hpp"

#include <cstring>

namespace kvtest {

using namespace kvoffload;

KvFixture::KvFixture(std::vector<TensorSpec> tensors, std::vector<std::vector<GroupTensor>> groups,
                     std::int64_t f, std::int64_t host_blocks) {
  std::vector<KvTensor> kv;
  for (const TensorSpec& t : tensors) {
    gpu.emplace_back(static_cast<std::size_t>(t.num_blocks * t.stride_bytes));
    kv.push_back({reinterpret_cast<std::uintptr_t>(gpu.back().data()), t.num_blocks, t.page_bytes,
                  t.stride_bytes});
  }
  layout = std::make_unique<KvLayout>(std::move(kv), std::move(groups), f);
  const std::int64_t block = layout->pool_block_bytes();
  host_memory.resize(static_cast<std::size_t>(block * host_blocks));
  host = HostRegion{reinterpret_cast<std::uintptr_t>(host_memory.data()), host_blocks, block, 0,
                    block};
  fill_guards();
}

void KvFixture::fill_guards() {
  for (auto& t : gpu) {
    for (auto& b : t) b = guard(reinterpret_cast<std::uintptr_t>(&b));
  }
  for (auto& b : host_memory) b = guard(reinterpret_cast<std::uintptr_t>(&b));
}

std::uint8_t* KvFixture::page(std::size_t tensor, std::int64_t block) const {
  const KvTensor& t = layout->tensors()[tensor];
  return reinterpret_cast<std::uint8_t*>(t.base +
                                         static_cast<std::uintptr_t>(block * t.block_stride_bytes));
}

void KvFixture::write_page(std::size_t tensor, std::int64_t block, std::int64_t bytes,
                           std::uint64_t seed) {
  std::uint8_t* p = page(tensor, block);
  for (std::int64_t i = 0; i < bytes; ++i) p[i] = pattern(seed, i);
}

bool KvFixture::page_is(std::size_t tensor, std::int64_t block, std::int64_t bytes,
                        std::uint64_t seed) const {
  const std::uint8_t* p = page(tensor, block);
  for (std::int64_t i = 0; i < bytes; ++i) {
    if (p[i] != pattern(seed, i)) return false;
  }
  return true;
}

void KvFixture::apply(const CopyPlan& plan) {
  for (const CopyDescriptor& d : plan.descriptors) {
    std::memmove(reinterpret_cast<void*>(d.dst), reinterpret_cast<const void*>(d.src), d.bytes);
  }
}

}  // namespace kvtest
