#pragma once

// A shared-tier value's MAC under the fleet's value key (SharedKeys): the check that a value
// was written by an engine holding the fleet secret, for this key, and not changed since.
//
//   one-time key = HMAC-SHA-256(value key, u32 length of name | name | header[0..80])
//   tag          = GMAC(AES-256, one-time key, payload)
//
// The header carries a 16-byte random nonce per write, so no two writes share a one-time key
// (GHASH's key would leak from two tags under one key). HMAC binds the name and header (a
// value moved under another key, rank or epoch, or its header changed, gets another one-time
// key); GMAC binds the payload at several times SHA-256's speed, which is what keeps a
// verified read close to what the network delivers. A forgery without the value key needs
// HMAC-SHA-256's output or a GHASH collision (probability about payload/16 / 2^128).
// Not thread-safe: one per thread.

#include <cstddef>
#include <span>
#include <string_view>

#include "common/gmac.hpp"
#include "common/hmac.hpp"

namespace kvoffload::detail {

/// The header bytes the one-time key covers.
inline constexpr std::size_t kValueMacHeaderBytes = 80;

class ValueMac {
 public:
  explicit ValueMac(std::span<const std::byte> value_key) : hmac_(value_key) {}

  [[nodiscard]] GmacTag tag(std::string_view name,
                            std::span<const std::byte, kValueMacHeaderBytes> header,
                            std::span<const std::byte> payload);

 private:
  Hmac hmac_;
  OneTimeGmac gmac_;
};

/// Constant-time comparison of a tag with the kGmacTagBytes at `at`.
[[nodiscard]] bool tag_equal(const GmacTag& tag, const std::byte* at) noexcept;

}  // namespace kvoffload::detail
