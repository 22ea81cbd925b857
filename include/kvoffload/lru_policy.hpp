#pragma once

#include <cstddef>
#include <vector>

#include "kvoffload/detail/intrusive_lists.hpp"
#include "kvoffload/eviction_policy.hpp"

namespace kvoffload {

/// Least-recently-used order (SEMANTICS 10): one intrusive recency list over block ids, so
/// every operation is O(1) per block and allocation-free after construction. Not thread-safe:
/// only the manager calls it.
class KVOFFLOAD_EXPORT LruPolicy final : public EvictionPolicy {
 public:
  explicit LruPolicy(std::size_t capacity);

  void insert(HostBlockId id, const Key& key) override;
  void touch(std::span<const HostBlockId> ids,
             detail::function_ref<bool(HostBlockId)> ready) override;
  bool select_victims(std::size_t count, detail::function_ref<bool(HostBlockId)> can_evict,
                      std::vector<HostBlockId>& victims) override;
  void evict(HostBlockId id, const Key& key) override;
  void erase(HostBlockId id) override;
  void reset() override;

  /// Resident ids from least to most recent (for tests and debugging).
  [[nodiscard]] std::vector<HostBlockId> order() const;

 private:
  detail::IntrusiveLists list_;
};

}  // namespace kvoffload
