#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvoffload/eviction_policy.hpp"

namespace kvoffload {

/// Least-recently-used order (SEMANTICS 10): one intrusive doubly linked list over block ids,
/// so every operation is O(1) per block and allocation-free after construction.
class KVOFFLOAD_EXPORT LruPolicy final : public EvictionPolicy {
 public:
  explicit LruPolicy(std::size_t capacity);

  void insert(HostBlockId id, const Key& key) override;
  void touch(std::span<const HostBlockId> ids) override;
  bool select_victims(std::size_t count, detail::function_ref<bool(HostBlockId)> can_evict,
                      std::vector<HostBlockId>& victims) override;
  void evict(HostBlockId id, const Key& key) override;
  void erase(HostBlockId id) override;
  void reset() override;

  /// Resident ids from least to most recent (for tests and debugging).
  [[nodiscard]] std::vector<HostBlockId> order() const;

 private:
  void unlink(std::size_t id) noexcept;
  void link_most_recent(std::size_t id) noexcept;

  // Index `sentinel_` is the list head: next_[sentinel_] is the least recent block.
  std::size_t sentinel_;
  std::vector<std::uint32_t> prev_;
  std::vector<std::uint32_t> next_;
  std::vector<std::uint8_t> linked_;
};

}  // namespace kvoffload
