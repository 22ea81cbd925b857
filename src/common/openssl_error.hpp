#pragma once

// OpenSSL's last error as a kvoffload::error: the MAC primitives' (gmac.cpp, hmac.cpp) way to
// fail. The rest of OpenSSL's error queue is cleared, so it is not blamed on a later failure.

#include <openssl/err.h>

#include <string_view>

#include "common/expects.hpp"

namespace kvoffload::detail {

[[noreturn]] inline void throw_openssl_error(std::string_view algorithm, std::string_view call) {
  char text[256] = "unknown error";
  ERR_error_string_n(ERR_get_error(), text, sizeof(text));
  ERR_clear_error();
  throw error(fmt::format("{}: {} failed: {}", algorithm, call, text));
}

}  // namespace kvoffload::detail
