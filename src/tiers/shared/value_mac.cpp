#include "tiers/shared/value_mac.hpp"

#include <openssl/crypto.h>

#include <cstdint>

namespace kvoffload::detail {

GmacTag ValueMac::tag(std::string_view name,
                      std::span<const std::byte, kValueMacHeaderBytes> header,
                      std::span<const std::byte> payload) {
  const auto length = static_cast<std::uint32_t>(name.size());
  Mac one_time = hmac_.begin()
                     .update(std::as_bytes(std::span(&length, 1)))
                     .update(name)
                     .update(header)
                     .finish();
  static_assert(kMacBytes == kGmacKeyBytes);
  const GmacTag tag = gmac_.of(std::span<const std::byte, kGmacKeyBytes>(one_time), payload);
  OPENSSL_cleanse(one_time.data(), one_time.size());
  return tag;
}

bool tag_equal(const GmacTag& tag, const std::byte* at) noexcept {
  return CRYPTO_memcmp(tag.data(), at, tag.size()) == 0;
}

}  // namespace kvoffload::detail
