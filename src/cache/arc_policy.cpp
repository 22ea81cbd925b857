#include "kvoffload/arc_policy.hpp"

#include <algorithm>

namespace kvoffload {

ArcPolicy::ArcPolicy(std::size_t capacity)
    : capacity_(capacity),
      resident_(capacity, 2),
      ghosts_(2 * capacity, 2),
      ghost_keys_(2 * capacity),
      ghost_index_(2 * capacity),
      touch_stamp_(capacity, 0) {
  reset();
}

void ArcPolicy::reset() {
  resident_.clear();
  ghosts_.clear();
  ghost_index_.clear();
  free_ghosts_.clear();
  free_ghosts_.reserve(2 * capacity_);
  for (std::size_t n = 2 * capacity_; n-- > 0;)
    free_ghosts_.push_back(static_cast<std::uint32_t>(n));
  target_ = 0;
}

ArcPolicy::List ArcPolicy::where(HostBlockId id) const {
  const auto node = static_cast<std::uint32_t>(id);
  if (!resident_.linked(node)) return List::none;
  return resident_.list_of(node) == kT1 ? List::t1 : List::t2;
}

void ArcPolicy::insert(HostBlockId id, const Key& key) {
  const auto node = static_cast<std::uint32_t>(id);
  if (const HostBlockId ghost =
          ghost_index_.find(key, detail::KeyIndex::hash(key), ghost_keys_.data());
      ghost >= 0) {
    // A key evicted recently comes back: the list that lost it should have been larger.
    const auto g = static_cast<std::uint32_t>(ghost);
    const std::size_t b1 = ghosts_.size(kB1), b2 = ghosts_.size(kB2);
    if (ghosts_.list_of(g) == kB1) {
      target_ = std::min(capacity_,
                         target_ + std::max<std::size_t>(1, b2 / std::max<std::size_t>(b1, 1)));
    } else {
      const std::size_t step = std::max<std::size_t>(1, b1 / std::max<std::size_t>(b2, 1));
      target_ = target_ > step ? target_ - step : 0;
    }
    drop_ghost(g);
    resident_.push_back(kT2, node);
    return;
  }
  resident_.push_back(kT1, node);
}

void ArcPolicy::touch(std::span<const HostBlockId> ids,
                      detail::function_ref<bool(HostBlockId)> ready) {
  if (++stamp_ == 0) {
    std::fill(touch_stamp_.begin(), touch_stamp_.end(), 0);
    stamp_ = 1;
  }
  // Last to first (a plain loop: clang 14 cannot compile libstdc++ 12's views::reverse).
  for (std::size_t i = ids.size(); i-- > 0;) {
    const HostBlockId id = ids[i];
    const auto node = static_cast<std::uint32_t>(id);
    if (id < 0 || !resident_.linked(node) || touch_stamp_[node] == stamp_)
      continue;  // one access a call
    touch_stamp_[node] = stamp_;
    const bool promote = resident_.list_of(node) == kT2 || ready(id);
    resident_.push_back(promote ? kT2 : kT1, node);
  }
}

bool ArcPolicy::select_victims(std::size_t count, detail::function_ref<bool(HostBlockId)> can_evict,
                               std::vector<HostBlockId>& victims) {
  const std::size_t before = victims.size();
  auto next_evictable = [&](std::uint32_t n) {
    while (n != detail::IntrusiveLists::npos && !can_evict(static_cast<HostBlockId>(n))) {
      n = resident_.next(n);
    }
    return n;
  };
  std::uint32_t c1 = next_evictable(resident_.front(kT1));
  std::uint32_t c2 = next_evictable(resident_.front(kT2));
  std::size_t t1 = resident_.size(kT1);  // T1's size as the victims taken so far leave it
  while (victims.size() - before < count) {
    const bool from_t1 =
        c1 != detail::IntrusiveLists::npos &&
        (t1 >= std::max<std::size_t>(1, target_) || c2 == detail::IntrusiveLists::npos);
    if (from_t1) {
      victims.push_back(static_cast<HostBlockId>(c1));
      c1 = next_evictable(resident_.next(c1));
      --t1;
    } else if (c2 != detail::IntrusiveLists::npos) {
      victims.push_back(static_cast<HostBlockId>(c2));
      c2 = next_evictable(resident_.next(c2));
    } else {
      victims.resize(before);
      return false;
    }
  }
  return true;
}

void ArcPolicy::evict(HostBlockId id, const Key& key) {
  const auto node = static_cast<std::uint32_t>(id);
  if (!resident_.linked(node)) return;
  const std::size_t list = resident_.list_of(node);
  resident_.remove(node);
  add_ghost(list == kT1 ? kB1 : kB2, key);
}

void ArcPolicy::erase(HostBlockId id) {
  const auto node = static_cast<std::uint32_t>(id);
  if (resident_.linked(node)) resident_.remove(node);
}

void ArcPolicy::add_ghost(std::size_t list, const Key& key) {
  const std::uint64_t h = detail::KeyIndex::hash(key);
  if (const HostBlockId old = ghost_index_.find(key, h, ghost_keys_.data()); old >= 0) {
    drop_ghost(static_cast<std::uint32_t>(old));
  }
  // Each ghost list remembers at most `capacity` keys: the least recent goes first.
  if (ghosts_.size(list) >= capacity_) drop_ghost(ghosts_.front(list));
  const std::uint32_t g = free_ghosts_.back();
  free_ghosts_.pop_back();
  ghost_keys_[g] = key;
  ghosts_.push_back(list, g);
  (void)ghost_index_.insert(key, h, static_cast<HostBlockId>(g), ghost_keys_.data());
}

void ArcPolicy::drop_ghost(std::uint32_t node) {
  (void)ghost_index_.erase(detail::KeyIndex::hash(ghost_keys_[node]),
                           static_cast<HostBlockId>(node));
  ghosts_.remove(node);
  free_ghosts_.push_back(node);
}

}  // namespace kvoffload
