#pragma once

// Internal: the scheduler's requests, owned here and found by id through a flat hash index
// (every step looks up every scheduled request by its string id; a node-based map with a
// generic string hash made that the largest cost of a decode step).

#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

#include "kvoffload/detail/flat_hash_map.hpp"

namespace kvoffload {

struct RequestState;

/// A fast hash for short ids: 8 bytes at a time, the tail with overlapping loads (no byte
/// loop, no library call), then splitmix's finalizer.
struct IdHash {
  std::size_t operator()(std::string_view s) const noexcept {
    const char* p = s.data();
    const std::size_t n = s.size();
    std::uint64_t h = 0x9e3779b97f4a7c15ULL ^ n;
    std::size_t i = 0;
    for (; i + 8 < n; i += 8) h = mix(h, load64(p + i));
    std::uint64_t tail = 0;
    if (n >= 8) {
      tail = load64(p + n - 8);  // overlaps the last full word: fine for a hash
    } else if (n >= 4) {
      tail = (static_cast<std::uint64_t>(load32(p)) << 32) | load32(p + n - 4);
    } else if (n > 0) {
      tail = (static_cast<std::uint64_t>(static_cast<unsigned char>(p[0])) << 16) |
             (static_cast<std::uint64_t>(static_cast<unsigned char>(p[n / 2])) << 8) |
             static_cast<unsigned char>(p[n - 1]);
    }
    return static_cast<std::size_t>(detail::mix64(mix(h, tail)));
  }

 private:
  static std::uint64_t mix(std::uint64_t h, std::uint64_t w) noexcept {
    h = (h ^ w) * 0xff51afd7ed558ccdULL;
    return h ^ (h >> 32);
  }
  static std::uint64_t load64(const char* p) noexcept {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    return w;
  }
  static std::uint32_t load32(const char* p) noexcept {
    std::uint32_t w;
    std::memcpy(&w, p, 4);
    return w;
  }
};

template <class State>
class RequestTable {
 public:
  [[nodiscard]] State* find(std::string_view id) const noexcept {
    State* const* p = index_.find(id);
    return p == nullptr ? nullptr : *p;
  }

  /// find() in stages, for a loop over many ids whose cache misses should overlap: hash(id),
  /// then prefetch_slot(h) a few ids ahead, hint(h) (a likely match, to prefetch from) fewer
  /// ids ahead, then find_hashed(id, h).
  [[nodiscard]] static std::uint64_t hash(std::string_view id) noexcept {
    return Index::hash_key(id);
  }
  void prefetch_slot(std::uint64_t h) const noexcept { index_.prefetch_hashed(h); }
  [[nodiscard]] State* hint(std::uint64_t h) const noexcept {
    State* const* p = index_.hint_hashed(h);
    return p == nullptr ? nullptr : *p;
  }
  [[nodiscard]] State* find_hashed(std::string_view id, std::uint64_t h) const noexcept {
    State* const* p = const_cast<Index&>(index_).find_hashed(id, h);
    return p == nullptr ? nullptr : *p;
  }

  /// Adds a request; its id must not be present.
  State& add(std::unique_ptr<State> state) {
    State& s = *state;
    s.slot = owned_.size();
    owned_.push_back(std::move(state));
    index_.insert(std::string_view(s.id), &s);
    return s;
  }

  void erase(State& s) noexcept {
    index_.erase(std::string_view(s.id));
    // Swap with the last one so ownership stays dense.
    const std::size_t slot = s.slot;
    if (slot + 1 != owned_.size()) {
      owned_[slot] = std::move(owned_.back());
      owned_[slot]->slot = slot;
    }
    owned_.pop_back();
  }

  [[nodiscard]] std::size_t size() const noexcept { return owned_.size(); }

  /// f(State&) for every request; f may not add or erase.
  template <class F>
  void for_each(F&& f) {
    for (auto& s : owned_) f(*s);
  }

 private:
  std::vector<std::unique_ptr<State>> owned_;
  using Index = detail::FlatHashMap<std::string_view, State*, IdHash>;
  Index index_;
};

}  // namespace kvoffload
