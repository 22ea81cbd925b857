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

/// A fast hash for short ids: 8 bytes at a time, then splitmix's finalizer.
struct IdHash {
  std::size_t operator()(std::string_view s) const noexcept {
    std::uint64_t h = 0x9e3779b97f4a7c15ULL ^ s.size();
    std::size_t i = 0;
    for (; i + 8 <= s.size(); i += 8) {
      std::uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      h = (h ^ w) * 0xff51afd7ed558ccdULL;
      h ^= h >> 32;
    }
    // The tail byte by byte: a variable-length memcpy into a word would be a library call
    // and a store-forwarding stall on every lookup.
    std::uint64_t tail = 0;
    for (unsigned k = 0; i + k < s.size(); ++k) {
      tail |= static_cast<std::uint64_t>(static_cast<unsigned char>(s[i + k])) << (8 * k);
    }
    return static_cast<std::size_t>(detail::mix64(h ^ tail));
  }
};

template <class State>
class RequestTable {
 public:
  [[nodiscard]] State* find(std::string_view id) const noexcept {
    State* const* p = index_.find(id);
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
  detail::FlatHashMap<std::string_view, State*, IdHash> index_;
};

}  // namespace kvoffload
