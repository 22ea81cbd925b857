#include "kvoffload/types.hpp"

#include <fmt/format.h>

#include "common/expects.hpp"

namespace kvoffload {
namespace {

int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

BlockHash BlockHash::from_bytes(std::span<const std::uint8_t> bytes) {
  KVOFFLOAD_EXPECTS(!bytes.empty() && bytes.size() <= max_size,
                    "block hash must have 1 to {} bytes, got {}", max_size, bytes.size());
  BlockHash h;
  std::memcpy(h.bytes_.data(), bytes.data(), bytes.size());
  h.size_ = static_cast<std::uint8_t>(bytes.size());
  return h;
}

BlockHash BlockHash::from_hex(std::string_view hex) {
  KVOFFLOAD_EXPECTS(hex.size() >= 2 && hex.size() <= 2 * max_size && hex.size() % 2 == 0,
                    "block hash \"{}\" must have an even number of hex digits, 2 to {}", hex,
                    2 * max_size);
  BlockHash h;
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    const int hi = hex_value(hex[i]);
    const int lo = hex_value(hex[i + 1]);
    KVOFFLOAD_EXPECTS(hi >= 0 && lo >= 0, "block hash \"{}\" is not hexadecimal", hex);
    h.bytes_[i / 2] = static_cast<std::uint8_t>(hi * 16 + lo);
  }
  h.size_ = static_cast<std::uint8_t>(hex.size() / 2);
  return h;
}

std::string BlockHash::to_hex() const {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(2 * static_cast<std::size_t>(size_), '0');
  for (std::size_t i = 0; i < size_; ++i) {
    out[2 * i] = digits[bytes_[i] >> 4];
    out[2 * i + 1] = digits[bytes_[i] & 15];
  }
  return out;
}

std::string to_string(const Key& key) {
  return fmt::format("{}/{}", key.hash.to_hex(), key.group);
}

}  // namespace kvoffload
