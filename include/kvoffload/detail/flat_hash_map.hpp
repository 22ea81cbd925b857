#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace kvoffload::detail {

/// Open-addressing hash map with linear probing and backward-shift deletion. Each slot's
/// 64-bit hash lives in a dense array of its own (0 marks an empty slot), so a probe reads 8
/// bytes per slot and touches the entry itself only when the hashes match: for large tables
/// that is one cache miss per lookup instead of two or three. Inserting and erasing allocate
/// nothing except when the table grows (capacity doubles at a load factor of 1/2). Keys and
/// values must be cheap to copy. Pointers returned by find/insert are invalidated by the next
/// insertion or erase.
template <class K, class V, class Hash, class Eq = std::equal_to<K>>
class FlatHashMap {
 public:
  FlatHashMap() = default;
  explicit FlatHashMap(std::size_t expected) { reserve(expected); }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }

  /// Makes room for `n` entries without further growth.
  void reserve(std::size_t n) {
    std::size_t want = 16;
    while (want < 2 * n) want *= 2;
    if (want > hashes_.size()) rehash(want);
  }

  /// The hash find/insert use, for callers that look a key up more than once.
  [[nodiscard]] static std::uint64_t hash_key(const K& key) noexcept { return hash_of(key); }

  [[nodiscard]] V* find(const K& key) noexcept { return find_hashed(key, hash_of(key)); }
  /// find() with h == hash_key(key) computed by the caller.
  [[nodiscard]] V* find_hashed(const K& key, std::uint64_t h) noexcept {
    if (size_ == 0) return nullptr;
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
      if (hashes_[i] == 0) return nullptr;
      if (hashes_[i] == h && Eq{}(slots_[i].first, key)) return &slots_[i].second;
    }
  }
  [[nodiscard]] const V* find(const K& key) const noexcept {
    return const_cast<FlatHashMap*>(this)->find(key);
  }
  [[nodiscard]] bool contains(const K& key) const noexcept { return find(key) != nullptr; }

  /// Starts loading the cache lines a lookup of `key` will read: call it a few keys ahead in
  /// a loop over many keys, so their cache misses overlap.
  void prefetch(const K& key) const noexcept { prefetch_hashed(hash_of(key)); }
  void prefetch_hashed(std::uint64_t h) const noexcept {
    if (hashes_.empty()) return;
    const std::size_t i = h & mask_;
    __builtin_prefetch(&hashes_[i]);
    __builtin_prefetch(&slots_[i]);
  }

  /// The value of the first entry whose hash is h, without comparing keys: a hint for
  /// prefetching what a later find_hashed will read (a colliding key's value, or null).
  [[nodiscard]] const V* hint_hashed(std::uint64_t h) const noexcept {
    if (size_ == 0) return nullptr;
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
      if (hashes_[i] == 0) return nullptr;
      if (hashes_[i] == h) return &slots_[i].second;
    }
  }

  /// Inserts (key, value) unless key is present. Returns the stored value and whether it was
  /// inserted.
  std::pair<V*, bool> insert(const K& key, const V& value) {
    return insert_hashed(key, hash_of(key), value);
  }
  /// insert() with h == hash_key(key) computed by the caller.
  std::pair<V*, bool> insert_hashed(const K& key, std::uint64_t h, const V& value) {
    if (2 * (size_ + 1) > hashes_.size()) rehash(hashes_.empty() ? 16 : 2 * hashes_.size());
    std::size_t i = h & mask_;
    for (; hashes_[i] != 0; i = (i + 1) & mask_) {
      if (hashes_[i] == h && Eq{}(slots_[i].first, key)) return {&slots_[i].second, false};
    }
    hashes_[i] = h;
    slots_[i].first = key;
    slots_[i].second = value;
    ++size_;
    return {&slots_[i].second, true};
  }

  /// Removes key; returns whether it was present.
  bool erase(const K& key) noexcept {
    if (size_ == 0) return false;
    const std::uint64_t h = hash_of(key);
    std::size_t i = h & mask_;
    for (;; i = (i + 1) & mask_) {
      if (hashes_[i] == 0) return false;
      if (hashes_[i] == h && Eq{}(slots_[i].first, key)) break;
    }
    // Backward shift: pull later entries of the probe chain into the hole so lookups never
    // need tombstones.
    std::size_t hole = i;
    for (std::size_t j = (hole + 1) & mask_; hashes_[j] != 0; j = (j + 1) & mask_) {
      const std::size_t home = hashes_[j] & mask_;
      if (((j - home) & mask_) >= ((j - hole) & mask_)) {
        hashes_[hole] = hashes_[j];
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    hashes_[hole] = 0;
    --size_;
    return true;
  }

  void clear() noexcept {
    if (size_ == 0) return;
    std::fill(hashes_.begin(), hashes_.end(), std::uint64_t{0});
    size_ = 0;
  }

  /// Calls f(key, value) for every entry, in no particular order.
  template <class F>
  void for_each(F&& f) const {
    for (std::size_t i = 0; i < hashes_.size(); ++i) {
      if (hashes_[i] != 0) f(slots_[i].first, slots_[i].second);
    }
  }

 private:
  /// Never 0 (0 marks an empty slot).
  static std::uint64_t hash_of(const K& key) noexcept {
    return static_cast<std::uint64_t>(Hash{}(key)) | (std::uint64_t{1} << 63);
  }

  void rehash(std::size_t new_capacity) {
    std::vector<std::pair<K, V>> old_slots(new_capacity);
    std::vector<std::uint64_t> old_hashes(new_capacity, 0);
    old_slots.swap(slots_);
    old_hashes.swap(hashes_);
    mask_ = new_capacity - 1;
    size_ = 0;
    for (std::size_t i = 0; i < old_hashes.size(); ++i) {
      if (old_hashes[i] != 0) insert(old_slots[i].first, old_slots[i].second);
    }
  }

  std::vector<std::pair<K, V>> slots_;
  std::vector<std::uint64_t> hashes_;
  std::size_t size_ = 0;
  std::size_t mask_ = 0;
};

/// Finalizer of splitmix64: a cheap, well-mixing hash for integer keys.
inline std::uint64_t mix64(std::uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

struct IntHash {
  template <class I>
  std::size_t operator()(I value) const noexcept {
    return static_cast<std::size_t>(mix64(static_cast<std::uint64_t>(value)));
  }
};

}  // namespace kvoffload::detail
