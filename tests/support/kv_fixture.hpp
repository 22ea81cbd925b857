#pragma once

// Test helpers for the worker side: "GPU" KV tensors and a host region in ordinary memory,
// filled with guard patterns, and a layout over them.

#include <cstdint>
#include <memory>
#include <vector>

#include "kvoffload/copy_planner.hpp"
#include "kvoffload/kv_layout.hpp"

namespace kvtest {

struct TensorSpec {
  std::int64_t num_blocks;
  std::int64_t page_bytes;
  std::int64_t stride_bytes;  // >= page_bytes
};

class KvFixture {
 public:
  /// groups[g] lists (tensor index, unpadded page bytes).
  KvFixture(std::vector<TensorSpec> tensors,
            std::vector<std::vector<kvoffload::GroupTensor>> groups, std::int64_t f,
            std::int64_t host_blocks);

  /// Every byte of GPU tensors and host region gets a guard value derived from its address.
  void fill_guards();
  [[nodiscard]] static std::uint8_t guard(std::uintptr_t addr) {
    return static_cast<std::uint8_t>((addr * 0x9e3779b1U) >> 24);
  }

  /// Fills the unpadded part of GPU page `block` of tensor `t` with a pattern from `seed`.
  void write_page(std::size_t tensor, std::int64_t block, std::int64_t bytes, std::uint64_t seed);
  [[nodiscard]] bool page_is(std::size_t tensor, std::int64_t block, std::int64_t bytes,
                             std::uint64_t seed) const;
  [[nodiscard]] std::uint8_t* page(std::size_t tensor, std::int64_t block) const;

  /// Runs a plan with memcpy (an oracle independent of the backends).
  static void apply(const kvoffload::CopyPlan& plan);

  std::unique_ptr<kvoffload::KvLayout> layout;
  kvoffload::HostRegion host;
  std::vector<std::vector<std::uint8_t>> gpu;  // one buffer per tensor
  std::vector<std::uint8_t> host_memory;
};

/// The byte a pattern with `seed` has at offset i.
inline std::uint8_t pattern(std::uint64_t seed, std::int64_t i) {
  std::uint64_t x =
      seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(i) * 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 29;
  return static_cast<std::uint8_t>(x >> 11);
}

}  // namespace kvtest
