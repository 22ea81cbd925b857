#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kvoffload/types.hpp"

namespace kvoffload::detail {

/// The host cache's key -> block index. Keys live in the manager's per-block key array; a slot
/// holds only a 32-bit tag of the key's hash and its block id (8 bytes: 16 to 32 bytes per
/// host block at a load factor of 1/4 to 1/2), so inserting a new key or missing one touches
/// a single cache line of a small table, and the key itself is read (keys[id]) only when the
/// tags match (the tag's low bits are the home slot, so a false match needs the other bits
/// equal too: one probe in 2^(31 - log2 slots), and the key compare rejects it). Open
/// addressing with linear probing and backward-shift deletion; sized once for a fixed number of
/// blocks (load factor at most 1/2), so it never rehashes or allocates after construction.
class KeyIndex {
 public:
  KeyIndex() = default;
  explicit KeyIndex(std::size_t max_entries) {
    // Homes come from a tag's 31 free bits (tag()): past 2^30 entries (2^32 slots, a host
    // pool of over 64 TiB at 64 KiB blocks) half the slots are never a home, still correct.
    std::size_t n = 16;
    while (n < 2 * max_entries) n *= 2;
    slots_.assign(n, Slot{});
    mask_ = n - 1;
  }

  /// The hash find/insert/erase expect (never 0: 0 marks an empty slot).
  [[nodiscard]] static std::uint64_t hash(const Key& key) noexcept {
    return static_cast<std::uint64_t>(KeyHash{}(key)) | (std::uint64_t{1} << 63);
  }

  /// The block holding `key` (h == hash(key); keys[id] is block id's key), or -1.
  [[nodiscard]] HostBlockId find(const Key& key, std::uint64_t h, const Key* keys) const noexcept {
    const std::uint32_t t = tag(h);
    for (std::size_t i = t & mask_;; i = (i + 1) & mask_) {
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
    std::size_t i = t & mask_;
    for (; slots_[i].tag != 0; i = (i + 1) & mask_) {
      if (slots_[i].tag == t && keys[slots_[i].id] == key) return {slots_[i].id, false};
    }
    slots_[i] = Slot{t, id};
    ++size_;
    return {id, true};
  }

  /// Removes the entry of block `id`, whose key hashes to h. Returns whether it was present.
  bool erase(std::uint64_t h, HostBlockId id) noexcept {
    const std::uint32_t t = tag(h);
    std::size_t i = t & mask_;
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].tag == 0) return false;
      if (slots_[i].id == id && slots_[i].tag == t) break;
    }
    // Backward shift: pull later entries of the probe chain into the hole (no tombstones).
    std::size_t hole = i;
    for (std::size_t j = (hole + 1) & mask_; slots_[j].tag != 0; j = (j + 1) & mask_) {
      const std::size_t home = slots_[j].tag & mask_;
      if (((j - home) & mask_) >= ((j - hole) & mask_)) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = Slot{};
    --size_;
    return true;
  }

  /// Starts loading the slot a probe for hash h reads first (a few keys ahead in a loop).
  void prefetch(std::uint64_t h) const noexcept { __builtin_prefetch(&slots_[tag(h) & mask_]); }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }

  void clear() noexcept {
    if (size_ == 0) return;
    for (Slot& s : slots_) s = Slot{};
    size_ = 0;
  }

 private:
  /// A slot's tag, and its home (tag & mask_: at most 2^31 slots): hash() sets bit 63, so a
  /// tag is never 0, the empty slot's.
  static std::uint32_t tag(std::uint64_t h) noexcept { return static_cast<std::uint32_t>(h >> 32); }
  struct Slot {
    std::uint32_t tag = 0;  // 0: empty
    HostBlockId id = -1;
  };
  static_assert(sizeof(HostBlockId) == 4, "a slot is 8 bytes");
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

}  // namespace kvoffload::detail
