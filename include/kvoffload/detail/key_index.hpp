#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "kvoffload/types.hpp"

namespace kvoffload::detail {

/// The host cache's key -> block index. Keys live in the manager's per-block key array; a slot
/// holds only a 32-bit tag of the key's hash and its block id (8 bytes: 16 bytes per host block
/// at a load factor of 1/2), so inserting a new key or missing one touches a single cache line
/// of a small table, and the key itself is read (keys[id]) only when the tags match (the tag's
/// high bits pick the home slot, so a false match needs the other bits equal too: about one
/// probe in 2^(31 - log2 slots), and the key compare rejects it). Open addressing with linear
/// probing and backward-shift deletion; sized once for a fixed number of blocks (load factor at
/// most 1/2), so it never rehashes or allocates after construction.
class KeyIndex {
 public:
  KeyIndex() = default;
  explicit KeyIndex(std::size_t max_entries) {
    // Exactly twice the entries (load factor at most 1/2, 16 bytes per block), not the next
    // power of two, which would cost up to 32 bytes per block (a 10M-block index: 27 instead
    // of 16). Homes map a tag's 31 hash bits onto [0, n) by a multiply (home()).
    const std::size_t n = std::max<std::size_t>(16, 2 * max_entries);
    if (n > (std::size_t{1} << 32)) throw std::length_error("KeyIndex: over 2^31 entries");
    slots_.assign(n, Slot{});
    n_ = n;
  }
  /// The hash find/insert/erase expect (never 0: 0 marks an empty slot).
  [[nodiscard]] static std::uint64_t hash(const Key& key) noexcept {
    return static_cast<std::uint64_t>(KeyHash{}(key)) | (std::uint64_t{1} << 63);
  }

  /// The block holding `key` (h == hash(key); keys[id] is block id's key), or -1.
  [[nodiscard]] HostBlockId find(const Key& key, std::uint64_t h, const Key* keys) const noexcept {
    const std::uint32_t t = tag(h);
    for (std::size_t i = home(t);; i = next(i)) {
      const Slot& s = slots_[i];
      if (s.tag == 0) return -1;
      if (s.tag == t && keys[s.id] == key) return s.id;
    }
  }

  /// Adds key -> id unless the key is present; returns the key's block and whether it was
  /// added. The caller writes keys[id] = key before the next call.
  std::pair<HostBlockId, bool> insert(const Key& key, std::uint64_t h, HostBlockId id,
                                      const Key* keys) noexcept {
    const std::uint32_t t = tag(h);
    std::size_t i = home(t);
    for (; slots_[i].tag != 0; i = next(i)) {
      if (slots_[i].tag == t && keys[slots_[i].id] == key) return {slots_[i].id, false};
    }
    slots_[i] = Slot{t, id};
    ++size_;
    return {id, true};
  }

  /// Removes the entry of block `id`, whose key hashes to h. Returns whether it was present.
  bool erase(std::uint64_t h, HostBlockId id) noexcept {
    const std::uint32_t t = tag(h);
    std::size_t i = home(t);
    for (;; i = next(i)) {
      if (slots_[i].tag == 0) return false;
      if (slots_[i].id == id && slots_[i].tag == t) break;
    }
    // Backward shift: pull later entries of the probe chain into the hole (no tombstones).
    std::size_t hole = i;
    for (std::size_t j = next(hole); slots_[j].tag != 0; j = next(j)) {
      if (distance(home(slots_[j].tag), j) >= distance(hole, j)) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = Slot{};
    --size_;
    return true;
  }

  /// Starts loading the slot a probe for hash h reads first (a few keys ahead in a loop).
  void prefetch(std::uint64_t h) const noexcept { __builtin_prefetch(&slots_[home(tag(h))]); }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }

  void clear() noexcept {
    if (size_ == 0) return;
    for (Slot& s : slots_) s = Slot{};
    size_ = 0;
  }

 private:
  /// A slot's tag: hash() sets bit 63, so a tag is never 0, the empty slot's.
  static std::uint32_t tag(std::uint64_t h) noexcept { return static_cast<std::uint32_t>(h >> 32); }
  /// Where a probe for tag t starts: its 31 hash bits scaled to [0, n_) (n_ <= 2^32, so the
  /// product fits 64 bits).
  [[nodiscard]] std::size_t home(std::uint32_t t) const noexcept {
    return static_cast<std::size_t>((std::uint64_t{t & 0x7fffffffU} * n_) >> 31);
  }
  [[nodiscard]] std::size_t next(std::size_t i) const noexcept { return i + 1 == n_ ? 0 : i + 1; }
  /// Slots from `from` forward (wrapping) to `to`.
  [[nodiscard]] std::size_t distance(std::size_t from, std::size_t to) const noexcept {
    return to >= from ? to - from : to + n_ - from;
  }
  struct Slot {
    std::uint32_t tag = 0;  // 0: empty
    HostBlockId id = -1;
  };
  static_assert(sizeof(HostBlockId) == 4, "a slot is 8 bytes");
  std::vector<Slot> slots_;
  std::size_t n_ = 0;  // slots
  std::size_t size_ = 0;
};

}  // namespace kvoffload::detail
