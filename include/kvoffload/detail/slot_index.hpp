#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvoffload/detail/flat_hash_map.hpp"

namespace kvoffload::detail {

/// A hash index from a 64-bit key to a record slot that stores only the slots: 4 bytes a table
/// entry, where a map of (key, slot) pairs with their hashes takes 24. The key of an entry is
/// read back from its record by the caller's `key_of(slot)`, so every entry (key, slot) must
/// keep key_of(slot) == key while it is in the index: erase it before the record's key
/// changes, set the key before inserting. Linear probing, backward-shift deletion, capacity
/// doubling at a load factor of 1/2. Not thread-safe.
class SlotIndex {
 public:
  static constexpr std::uint32_t npos = 0xffffffffU;

  [[nodiscard]] std::size_t size() const noexcept { return size_; }

  /// The slot indexed under `key`, npos if none.
  template <class KeyOf>
  [[nodiscard]] std::uint32_t find(std::uint64_t key, const KeyOf& key_of) const noexcept {
    if (size_ == 0) return npos;
    for (std::size_t i = mix64(key) & mask_;; i = (i + 1) & mask_) {
      const std::uint32_t s = table_[i];
      if (s == npos) return npos;
      if (key_of(s) == key) return s;
    }
  }

  /// Indexes `slot` under `key` (key_of(slot) == key; the key must not be indexed yet).
  template <class KeyOf>
  void insert(std::uint64_t key, std::uint32_t slot, const KeyOf& key_of) {
    if (2 * (size_ + 1) > table_.size()) grow(key_of);
    std::size_t i = mix64(key) & mask_;
    while (table_[i] != npos) i = (i + 1) & mask_;
    table_[i] = slot;
    ++size_;
  }

  /// Removes the entry (key, slot) if there is one; another slot under the key stays.
  template <class KeyOf>
  bool erase(std::uint64_t key, std::uint32_t slot, const KeyOf& key_of) noexcept {
    if (size_ == 0) return false;
    std::size_t i = mix64(key) & mask_;
    for (;; i = (i + 1) & mask_) {
      if (table_[i] == npos) return false;
      if (table_[i] == slot && key_of(slot) == key) break;  // (slot may be under another key)
    }
    // Backward shift: move each later entry of the run into the hole if its home is not
    // between the hole and it.
    for (std::size_t j = (i + 1) & mask_; table_[j] != npos; j = (j + 1) & mask_) {
      const std::size_t home = mix64(key_of(table_[j])) & mask_;
      if (((j - home) & mask_) >= ((j - i) & mask_)) {
        table_[i] = table_[j];
        i = j;
      }
    }
    table_[i] = npos;
    --size_;
    return true;
  }

  void clear() noexcept {
    table_.clear();
    size_ = mask_ = 0;
  }

 private:
  template <class KeyOf>
  void grow(const KeyOf& key_of) {
    std::vector<std::uint32_t> old(table_.empty() ? 16 : 2 * table_.size(), npos);
    old.swap(table_);
    mask_ = table_.size() - 1;
    for (const std::uint32_t s : old) {
      if (s == npos) continue;
      std::size_t i = mix64(key_of(s)) & mask_;
      while (table_[i] != npos) i = (i + 1) & mask_;
      table_[i] = s;
    }
  }

  std::vector<std::uint32_t> table_;
  std::size_t size_ = 0;
  std::size_t mask_ = 0;
};

}  // namespace kvoffload::detail
