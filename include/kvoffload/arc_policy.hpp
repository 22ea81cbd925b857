#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvoffload/detail/intrusive_lists.hpp"
#include "kvoffload/detail/key_index.hpp"
#include "kvoffload/eviction_policy.hpp"

namespace kvoffload {

/// Adaptive Replacement Cache (Megiddo and Modha) over host blocks: T1 holds blocks used once,
/// T2 blocks used again; the ghost lists B1 and B2 remember keys recently evicted from each,
/// and a hit on a ghost moves the target size of T1 towards the list that would have kept it.
/// New blocks enter T1 (or T2 when their key is a ghost). A touch promotes a ready block of T1
/// to T2 (a block still being written is only refreshed in T1: its own request's touch is not
/// a reuse). Eviction takes from T1 while it is at least its target, else from T2, least
/// recent first, skipping protected blocks; all or nothing as for LRU.
/// Allocation-free after construction; not thread-safe (the manager calls it).
class KVOFFLOAD_EXPORT ArcPolicy final : public EvictionPolicy {
 public:
  enum class List : std::uint8_t { none, t1, t2 };

  explicit ArcPolicy(std::size_t capacity);

  void insert(HostBlockId id, const Key& key) override;
  void touch(std::span<const HostBlockId> ids,
             detail::function_ref<bool(HostBlockId)> ready) override;
  bool select_victims(std::size_t count, detail::function_ref<bool(HostBlockId)> can_evict,
                      std::vector<HostBlockId>& victims) override;
  void evict(HostBlockId id, const Key& key) override;
  void erase(HostBlockId id) override;
  void reset() override;

  // Introspection for tests and statistics.
  [[nodiscard]] List where(HostBlockId id) const;
  [[nodiscard]] std::size_t t1_size() const { return resident_.size(kT1); }
  [[nodiscard]] std::size_t t2_size() const { return resident_.size(kT2); }
  [[nodiscard]] std::size_t b1_size() const { return ghosts_.size(kB1); }
  [[nodiscard]] std::size_t b2_size() const { return ghosts_.size(kB2); }
  /// The adaptive target size of T1, 0..capacity.
  [[nodiscard]] std::size_t target() const { return target_; }
  [[nodiscard]] bool is_ghost(const Key& key) const {
    return ghost_index_.find(key, detail::KeyIndex::hash(key), ghost_keys_.data()) >= 0;
  }

 private:
  static constexpr std::size_t kT1 = 0, kT2 = 1, kB1 = 0, kB2 = 1;

  void add_ghost(std::size_t list, const Key& key);
  void drop_ghost(std::uint32_t node);

  std::size_t capacity_;
  std::size_t target_ = 0;
  detail::IntrusiveLists resident_;  // block ids: T1 and T2
  detail::IntrusiveLists ghosts_;    // ghost nodes: B1 and B2
  std::vector<Key> ghost_keys_;      // per ghost node
  std::vector<std::uint32_t> free_ghosts_;
  // Ghost key -> node, over ghost_keys_: 8-byte slots (16 bytes a ghost) where a map holding
  // the keys took 52-byte slots at a power-of-two size (issue 51: ARC cost 551 bytes of heap
  // per host block at 10M blocks).
  detail::KeyIndex ghost_index_;
  std::vector<std::uint32_t> touch_stamp_;
  std::uint32_t stamp_ = 0;
};

}  // namespace kvoffload
