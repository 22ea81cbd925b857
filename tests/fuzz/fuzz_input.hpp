#pragma once

// Reads typed values from a fuzzer's input bytes; past the end every read returns 0, so any
// input is a valid program for the harnesses.

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kvfuzz {

class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : p_(data), n_(size) {}

  template <class T>
  T take() {
    T v{};
    const std::size_t k = sizeof(T) < n_ - at_ ? sizeof(T) : n_ - at_;
    if (k > 0) std::memcpy(&v, p_ + at_, k);
    at_ += k;
    return v;
  }
  /// A value in [lo, hi].
  std::int64_t range(std::int64_t lo, std::int64_t hi) {
    const auto span = static_cast<std::uint64_t>(hi - lo) + 1;
    return lo + static_cast<std::int64_t>(take<std::uint32_t>() % span);
  }
  bool flag() { return (take<std::uint8_t>() & 1) != 0; }
  [[nodiscard]] bool done() const { return at_ >= n_; }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
  std::size_t at_ = 0;
};

}  // namespace kvfuzz
