#pragma once

// GMAC (AES-256-GCM over authenticated data only, OpenSSL's EVP_MAC) under a key used once:
// the fast half of the shared tier's value MACs (tiers/shared/value_mac.hpp). GHASH under a
// key nobody uses twice is a one-time MAC (a forgery succeeds with probability about
// length/16 / 2^128), and with carry-less multiply it runs at several times SHA-256's speed.
// Not thread-safe: one per thread.

#include <array>
#include <cstddef>
#include <span>

struct evp_mac_st;

namespace kvoffload::detail {

inline constexpr std::size_t kGmacKeyBytes = 32;
inline constexpr std::size_t kGmacTagBytes = 16;
using GmacTag = std::array<std::byte, kGmacTagBytes>;

class OneTimeGmac {
 public:
  /// Throws kvoffload::error if OpenSSL has no GMAC or AES-256-GCM.
  OneTimeGmac();
  ~OneTimeGmac();
  OneTimeGmac(const OneTimeGmac&) = delete;
  OneTimeGmac& operator=(const OneTimeGmac&) = delete;

  /// The tag of `bytes` under `key` (a fixed all-zero IV: the key must never MAC a second
  /// message).
  GmacTag of(std::span<const std::byte, kGmacKeyBytes> key, std::span<const std::byte> bytes);

 private:
  evp_mac_st* mac_ = nullptr;
};

/// Fills `out` from OpenSSL's CSPRNG; throws kvoffload::error if it fails.
void fill_random(std::span<std::byte> out);

}  // namespace kvoffload::detail
