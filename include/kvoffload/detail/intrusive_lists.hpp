#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace kvoffload::detail {

/// Several doubly linked lists over one index space 0..nodes-1, stored in arrays: a node is in
/// at most one list, moving it is O(1), and nothing is allocated after construction. Each
/// list's front is its least recent end. Used by the eviction policies.
class IntrusiveLists {
 public:
  static constexpr std::uint32_t npos = std::numeric_limits<std::uint32_t>::max();

  IntrusiveLists(std::size_t nodes, std::size_t lists)
      : nodes_(nodes),
        prev_(nodes + lists),
        next_(nodes + lists),
        list_(nodes, kNone),
        size_(lists, 0) {
    clear();
  }

  void clear() {
    for (std::size_t l = 0; l < size_.size(); ++l) {
      const auto s = static_cast<std::uint32_t>(nodes_ + l);
      prev_[s] = next_[s] = s;
      size_[l] = 0;
    }
    std::fill(list_.begin(), list_.end(), kNone);
  }

  /// Appends `node` at the most recent end of `list`, unlinking it first if it is linked.
  void push_back(std::size_t list, std::uint32_t node) {
    if (linked(node)) remove(node);
    const auto s = static_cast<std::uint32_t>(nodes_ + list);
    const std::uint32_t last = prev_[s];
    prev_[node] = last;
    next_[node] = s;
    next_[last] = node;
    prev_[s] = node;
    list_[node] = static_cast<std::uint8_t>(list);
    ++size_[list];
  }

  void remove(std::uint32_t node) {
    next_[prev_[node]] = next_[node];
    prev_[next_[node]] = prev_[node];
    --size_[list_[node]];
    list_[node] = kNone;
  }

  [[nodiscard]] bool linked(std::uint32_t node) const { return list_[node] != kNone; }
  /// The list `node` is in; only valid if linked(node).
  [[nodiscard]] std::size_t list_of(std::uint32_t node) const { return list_[node]; }
  [[nodiscard]] std::size_t size(std::size_t list) const { return size_[list]; }

  /// The least recent node of `list`, or npos.
  [[nodiscard]] std::uint32_t front(std::size_t list) const { return real(next_[nodes_ + list]); }
  /// The node after `node` towards the most recent end, or npos.
  [[nodiscard]] std::uint32_t next(std::uint32_t node) const { return real(next_[node]); }

 private:
  static constexpr std::uint8_t kNone = 0xff;
  [[nodiscard]] std::uint32_t real(std::uint32_t n) const { return n < nodes_ ? n : npos; }

  std::size_t nodes_;
  std::vector<std::uint32_t> prev_;
  std::vector<std::uint32_t> next_;
  std::vector<std::uint8_t> list_;
  std::vector<std::size_t> size_;
};

}  // namespace kvoffload::detail
