#include "common/gmac.hpp"

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <memory>

#include "common/expects.hpp"
#include "common/openssl_error.hpp"

namespace kvoffload::detail {
namespace {

[[noreturn]] void fail(const char* what) {
  throw_openssl_error("GMAC", what);
}

struct CtxFree {
  void operator()(EVP_MAC_CTX* c) const noexcept { EVP_MAC_CTX_free(c); }
};

}  // namespace

OneTimeGmac::OneTimeGmac() : mac_(EVP_MAC_fetch(nullptr, "GMAC", nullptr)) {
  if (mac_ == nullptr) fail("EVP_MAC_fetch(GMAC)");
}

OneTimeGmac::~OneTimeGmac() {
  EVP_MAC_free(mac_);
}

GmacTag OneTimeGmac::of(std::span<const std::byte, kGmacKeyBytes> key,
                        std::span<const std::byte> bytes) {
  // A new context per message: the key changes every time, and a context costs far less than
  // the bytes a value carries.
  const std::unique_ptr<EVP_MAC_CTX, CtxFree> ctx(EVP_MAC_CTX_new(mac_));
  if (ctx == nullptr) fail("EVP_MAC_CTX_new");
  char cipher[] = "AES-256-GCM";
  unsigned char iv[12] = {};
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_CIPHER, cipher, 0),
                               OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_IV, iv, sizeof(iv)),
                               OSSL_PARAM_construct_end()};
  if (EVP_MAC_init(ctx.get(), reinterpret_cast<const unsigned char*>(key.data()), key.size(),
                   params) != 1) {
    fail("EVP_MAC_init");
  }
  if (EVP_MAC_update(ctx.get(), reinterpret_cast<const unsigned char*>(bytes.data()),
                     bytes.size()) != 1) {
    fail("EVP_MAC_update");
  }
  GmacTag out{};
  std::size_t n = 0;
  if (EVP_MAC_final(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), &n, out.size()) != 1 ||
      n != out.size()) {
    fail("EVP_MAC_final");
  }
  return out;
}

void fill_random(std::span<std::byte> out) {
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(out.size())) != 1) {
    fail("RAND_bytes");
  }
}

}  // namespace kvoffload::detail
