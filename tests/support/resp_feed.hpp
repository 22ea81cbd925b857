#pragma once

// Feeding a RespReader the way a node connection does: into the value's in-place destination
// when it has one, else into its buffer. For the reader's tests and its fuzz target.

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <string_view>

#include "tiers/shared/resp_reader.hpp"

namespace kvoffload::test {

/// Copies up to `step` bytes of `bytes` into `r` and commits them; returns how many (0 once
/// `bytes` is empty or the reader has no room).
inline std::size_t feed_some(detail::RespReader& r, std::string_view bytes, std::size_t step) {
  const std::span<char> direct = r.direct();
  const std::span<char> to = direct.empty() ? r.space() : direct;
  const std::size_t n = std::min({step, to.size(), bytes.size()});
  if (n > 0) std::memcpy(to.data(), bytes.data(), n);
  if (direct.empty()) {
    r.commit(n);
  } else {
    r.commit_direct(n);
  }
  return n;
}

}  // namespace kvoffload::test
