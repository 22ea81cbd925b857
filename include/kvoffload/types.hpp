#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "kvoffload/export.hpp"

namespace kvoffload {

/// A GPU block id as the engine numbers them. Block 0 is the null block (SEMANTICS: a block
/// outside the sliding window, or not allocated); it is never copied.
using GpuBlockId = std::int32_t;
/// An offloaded block slot in the host pool, 0..host_blocks-1.
using HostBlockId = std::int32_t;
/// Transfer job ids increase from 0 for the lifetime of a scheduler.
using JobId = std::int64_t;

inline constexpr GpuBlockId null_block = 0;

/// A device stream, the one stream type of every API (a cudaStream_t's value). 0 is the
/// legacy default stream.
using StreamHandle = std::uintptr_t;
/// A device event (a cudaEvent_t's value).
using EventHandle = std::uintptr_t;

/// An opaque content hash of 1 to 32 bytes, stored inline so keys never touch the heap.
/// Bytes past size() are zero, so whole-array comparison is equality. A value type: safe to
/// read from any number of threads.
class KVOFFLOAD_EXPORT BlockHash {
 public:
  static constexpr std::size_t max_size = 32;

  BlockHash() = default;

  /// Throws invalid_argument unless 1 <= bytes.size() <= 32.
  static BlockHash from_bytes(std::span<const std::uint8_t> bytes);
  /// Parses 2 to 64 lowercase or uppercase hex digits (an even count). Throws
  /// invalid_argument naming the problem.
  static BlockHash from_hex(std::string_view hex);
  /// Lowercase hex, two digits per byte.
  [[nodiscard]] std::string to_hex() const;

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] const std::uint8_t* data() const noexcept { return bytes_.data(); }

  friend bool operator==(const BlockHash& a, const BlockHash& b) noexcept {
    // Four 8-byte words, inline: this runs for every probe of the manager's tables.
    std::uint64_t x[4], y[4];
    std::memcpy(x, a.bytes_.data(), sizeof(x));
    std::memcpy(y, b.bytes_.data(), sizeof(y));
    return a.size_ == b.size_ &&
           ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3])) == 0;
  }

  /// A 64-bit hash of the bytes for hash tables.
  [[nodiscard]] std::uint64_t fingerprint() const noexcept {
    std::uint64_t w[4];
    std::memcpy(w, bytes_.data(), sizeof(w));
    std::uint64_t h = (w[0] ^ (0x9e3779b97f4a7c15ULL * (size_ + 1U))) * 0xff51afd7ed558ccdULL;
    h = (h ^ (h >> 32) ^ w[1]) * 0xc4ceb9fe1a85ec53ULL;
    h = (h ^ (h >> 29) ^ w[2]) * 0xff51afd7ed558ccdULL;
    h = (h ^ (h >> 32) ^ w[3]) * 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
  }

 private:
  std::array<std::uint8_t, max_size> bytes_{};
  std::uint8_t size_ = 0;
};

/// A host-cache key: the hash of the last hash block an offloaded block covers, tagged with
/// the KV-cache group (SEMANTICS 2).
struct Key {
  BlockHash hash;
  std::uint32_t group = 0;

  friend bool operator==(const Key& a, const Key& b) noexcept {
    return a.group == b.group && a.hash == b.hash;
  }
};

struct KeyHash {
  std::size_t operator()(const Key& key) const noexcept {
    return static_cast<std::size_t>(key.hash.fingerprint() ^
                                    (0x9e3779b97f4a7c15ULL * (key.group + 1ULL)));
  }
};

/// "<hex>/<group>", for messages.
KVOFFLOAD_EXPORT std::string to_string(const Key& key);

}  // namespace kvoffload
