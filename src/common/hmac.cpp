#include "common/hmac.hpp"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include "common/expects.hpp"
#include "common/openssl_error.hpp"

namespace kvoffload::detail {
namespace {

[[noreturn]] void fail(const char* what) {
  throw_openssl_error("HMAC-SHA-256", what);
}

}  // namespace

Hmac::Hmac(std::span<const std::byte> key) {
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (mac == nullptr) fail("EVP_MAC_fetch(HMAC)");
  keyed_ = EVP_MAC_CTX_new(mac);
  EVP_MAC_free(mac);  // the context holds its own reference
  if (keyed_ == nullptr) fail("EVP_MAC_CTX_new");
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  if (EVP_MAC_init(keyed_, reinterpret_cast<const unsigned char*>(key.data()), key.size(),
                   params) != 1) {
    EVP_MAC_CTX_free(keyed_);
    fail("EVP_MAC_init");
  }
}

Hmac::~Hmac() {
  EVP_MAC_CTX_free(ctx_);
  EVP_MAC_CTX_free(keyed_);
}

Hmac& Hmac::begin() {
  EVP_MAC_CTX_free(ctx_);
  ctx_ = EVP_MAC_CTX_dup(keyed_);
  if (ctx_ == nullptr) fail("EVP_MAC_CTX_dup");
  return *this;
}

Hmac& Hmac::update(std::span<const std::byte> bytes) {
  KVOFFLOAD_EXPECTS(ctx_ != nullptr, "HMAC-SHA-256: update() before begin()");
  if (EVP_MAC_update(ctx_, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()) !=
      1) {
    fail("EVP_MAC_update");
  }
  return *this;
}

Hmac& Hmac::update(std::string_view text) {
  return update(std::as_bytes(std::span(text.data(), text.size())));
}

Mac Hmac::finish() {
  KVOFFLOAD_EXPECTS(ctx_ != nullptr, "HMAC-SHA-256: finish() before begin()");
  Mac out{};
  std::size_t n = 0;
  const int rc = EVP_MAC_final(ctx_, reinterpret_cast<unsigned char*>(out.data()), &n, out.size());
  EVP_MAC_CTX_free(ctx_);
  ctx_ = nullptr;
  if (rc != 1 || n != out.size()) fail("EVP_MAC_final");
  return out;
}

Mac Hmac::of(std::span<const std::byte> bytes) {
  return begin().update(bytes).finish();
}

bool mac_equal(const Mac& mac, const std::byte* at) noexcept {
  return CRYPTO_memcmp(mac.data(), at, mac.size()) == 0;
}

Mac derive_subkey(std::span<const std::byte> key, std::string_view label) {
  Hmac h(key);
  return h.begin().update(label).finish();
}

}  // namespace kvoffload::detail
