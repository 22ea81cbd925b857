#pragma once

// HMAC-SHA-256 (OpenSSL's EVP_MAC): the shared tier's value MACs and key names. An Hmac holds
// one key; each begin() starts a message under it. Not thread-safe: one per thread.

#include <array>
#include <cstddef>
#include <span>
#include <string_view>

struct evp_mac_ctx_st;

namespace kvoffload::detail {

inline constexpr std::size_t kMacBytes = 32;
using Mac = std::array<std::byte, kMacBytes>;

class Hmac {
 public:
  /// Throws kvoffload::error if OpenSSL cannot set it up (no SHA-256 provider).
  explicit Hmac(std::span<const std::byte> key);
  ~Hmac();
  Hmac(const Hmac&) = delete;
  Hmac& operator=(const Hmac&) = delete;

  /// Starts a message (whatever the last one left is dropped).
  Hmac& begin();
  Hmac& update(std::span<const std::byte> bytes);
  Hmac& update(std::string_view text);
  /// The message's MAC; the next message needs begin().
  Mac finish();
  /// begin(), update(bytes), finish().
  Mac of(std::span<const std::byte> bytes);

 private:
  evp_mac_ctx_st* keyed_ = nullptr;  // initialised with the key, never updated: copied per message
  evp_mac_ctx_st* ctx_ = nullptr;
};

/// Constant-time comparison of a MAC with the kMacBytes at `at`.
[[nodiscard]] bool mac_equal(const Mac& mac, const std::byte* at) noexcept;

/// kMacBytes of HMAC-SHA-256(key, label): a subkey for one use of a secret.
[[nodiscard]] Mac derive_subkey(std::span<const std::byte> key, std::string_view label);

}  // namespace kvoffload::detail
