#pragma once

// Internal: offsets in a fixed buffer, handed out first-in first-out and released in any
// order (the space comes back once every older slice is released too). The CUDA backend uses
// it for its pinned upload rings and its staging buffer. Not thread-safe.

#include <cstdint>
#include <deque>
#include <optional>

namespace kvoffload::detail {

class RingAllocator {
 public:
  static constexpr std::uint64_t kAlign = 64;

  explicit RingAllocator(std::uint64_t capacity = 0) : capacity_(capacity / kAlign * kAlign) {}

  /// The offset of `bytes` (rounded up to kAlign) contiguous bytes, or nothing when the free
  /// space cannot hold them now.
  std::optional<std::uint64_t> allocate(std::uint64_t bytes) {
    const std::uint64_t size = (bytes + kAlign - 1) / kAlign * kAlign;
    if (size == 0 || size > capacity_) return std::nullopt;
    std::uint64_t at = 0;
    if (live_.empty()) {
      head_ = 0;
      at = 0;
    } else {
      const std::uint64_t tail = live_.front().begin;
      const bool wrapped = live_.back().begin < tail;
      // Three cases, each readable on its own line: room after the head, room at the start
      // once not wrapped, room between the head and the oldest slice once wrapped.
      if (!wrapped && capacity_ - head_ >= size) {  // NOLINT(bugprone-branch-clone)
        at = head_;
      } else if (!wrapped && tail >= size) {
        at = 0;
      } else if (wrapped && tail - head_ >= size) {
        at = head_;
      } else {
        return std::nullopt;
      }
    }
    live_.push_back({at, at + size, false});
    head_ = at + size;
    return at;
  }

  /// Returns the slice that starts at `offset` (allocate's result).
  void release(std::uint64_t offset) {
    for (Slice& s : live_) {
      if (s.begin == offset && !s.released) {
        s.released = true;
        break;
      }
    }
    while (!live_.empty() && live_.front().released) live_.pop_front();
    if (live_.empty()) head_ = 0;
  }

  [[nodiscard]] std::uint64_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::size_t live() const noexcept { return live_.size(); }

 private:
  struct Slice {
    std::uint64_t begin, end;
    bool released;
  };
  std::uint64_t capacity_;
  std::uint64_t head_ = 0;
  std::deque<Slice> live_;
};

}  // namespace kvoffload::detail
