#pragma once

// Internal, for the shared tier on a Valkey/Redis cluster (issue 17): which of the cluster's
// 16384 hash slots a key belongs to. The cluster's rule: CRC16 (XMODEM: polynomial 0x1021,
// initial value 0, no reflection) of the key, modulo 16384; if the key has a hash tag (a '{'
// followed later by a '}' with at least one byte between), only the bytes between the first
// '{' and the first '}' after it are hashed, so keys with the same tag share a slot.

#include <array>
#include <cstdint>
#include <string_view>

namespace kvoffload::detail {

inline constexpr int kClusterSlots = 16384;

namespace cluster_slot_impl {

/// The table for polynomial 0x1021, MSB first, built at compile time.
constexpr std::array<std::uint16_t, 256> make_table() {
  std::array<std::uint16_t, 256> t{};
  for (unsigned i = 0; i < 256; ++i) {
    auto crc = static_cast<std::uint16_t>(i << 8);
    for (int bit = 0; bit < 8; ++bit) {
      crc = static_cast<std::uint16_t>((crc & 0x8000) != 0 ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    t[i] = crc;
  }
  return t;
}

inline constexpr std::array<std::uint16_t, 256> kTable = make_table();

}  // namespace cluster_slot_impl

/// CRC-16/XMODEM of `bytes`.
inline std::uint16_t crc16_xmodem(std::string_view bytes) noexcept {
  std::uint16_t crc = 0;
  for (const char c : bytes) {
    const auto byte = static_cast<std::uint8_t>(c);
    crc = static_cast<std::uint16_t>((crc << 8) ^
                                     cluster_slot_impl::kTable[((crc >> 8) ^ byte) & 0xff]);
  }
  return crc;
}

/// The part of `key` that is hashed: its hash tag if it has one, else the whole key.
inline std::string_view hash_tag(std::string_view key) noexcept {
  const std::size_t open = key.find('{');
  if (open == std::string_view::npos) return key;
  const std::size_t close = key.find('}', open + 1);
  if (close == std::string_view::npos || close == open + 1) return key;  // none, or "{}"
  return key.substr(open + 1, close - open - 1);
}

/// The cluster hash slot of `key`, 0 to 16383.
inline int cluster_slot(std::string_view key) noexcept {
  return crc16_xmodem(hash_tag(key)) % kClusterSlots;
}

}  // namespace kvoffload::detail
