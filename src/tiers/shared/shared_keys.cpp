#include "kvoffload/tiers/shared_keys.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/expects.hpp"
#include "common/hmac.hpp"
#include "common/logging.hpp"
#include "tiers/shared/client_config.hpp"
#include "tiers/shared/value_mac.hpp"

namespace kvoffload {
namespace {

// What an engine configured insecure keys with: public, so it protects against accidents
// (a value moved or damaged) but not against anyone who can write to the cluster.
constexpr std::string_view kInsecureSecret = "kvoffload shared tier: insecure, no fleet secret";

/// A secret's file (`field` names it in errors): a regular file, one trailing newline dropped.
std::string read_secret_file(const std::string& path, std::string_view field = "secret_file") {
  struct stat st {};
  KVOFFLOAD_EXPECTS(::stat(path.c_str(), &st) == 0, "shared tier: {} \"{}\": {}", field, path,
                    std::strerror(errno));
  KVOFFLOAD_EXPECTS(S_ISREG(st.st_mode), "shared tier: {} \"{}\" is not a regular file", field,
                    path);
  if ((st.st_mode & 077) != 0) {
    detail::logger().warn("shared tier: {} \"{}\" can be read by others (mode {:o}); chmod 600 it",
                          field, path, st.st_mode & 0777);
  }
  std::ifstream in(path, std::ios::binary);
  KVOFFLOAD_EXPECTS(in.good(), "shared tier: {} \"{}\" cannot be read", field, path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // One trailing newline (what `echo` and editors add) is not part of the secret.
  if (text.ends_with('\n')) text.pop_back();
  if (text.ends_with('\r')) text.pop_back();
  return text;
}

std::string load_secret(const SharedTierConfig& c, bool& secure) {
  secure = true;
  std::string secret;
  std::string from;
  if (!c.secret_file.empty()) {
    secret = read_secret_file(c.secret_file);
    from = fmt::format("secret_file \"{}\"", c.secret_file);
  } else if (const char* env = c.secret_env.empty() ? nullptr : std::getenv(c.secret_env.c_str());
             env != nullptr && *env != '\0') {
    secret = env;
    from = fmt::format("environment variable {}", c.secret_env);
  } else {
    KVOFFLOAD_EXPECTS(c.insecure,
                      "shared tier: no fleet secret: set secret_file, or the environment "
                      "variable secret_env names (\"{}\"), or insecure = true for a cluster "
                      "nobody else can write to",
                      c.secret_env);
    detail::logger().warn(
        "shared tier: insecure: no fleet secret, so anyone who can write to the cluster can "
        "forge values and anyone who can list its keys can test them");
    secure = false;
    return std::string(kInsecureSecret);
  }
  KVOFFLOAD_EXPECTS(secret.size() >= shared_secret_min_bytes,
                    "shared tier: the fleet secret from {} is {} bytes; at least {} are needed "
                    "(e.g. openssl rand -hex 32)",
                    from, secret.size(), shared_secret_min_bytes);
  return secret;
}

}  // namespace

namespace detail {

ClusterClientConfig cluster_client_config(const SharedTierConfig& c) {
  ClusterClientConfig cc;
  cc.seeds = parse_cluster_nodes(c.nodes, "shared tier: nodes");
  cc.connect_timeout_ms = c.connect_timeout_ms;
  cc.reply_timeout_ms = c.reply_timeout_ms;
  cc.username = c.username;
  if (!c.password_file.empty()) {
    cc.password = read_secret_file(c.password_file, "password_file");
    KVOFFLOAD_EXPECTS(!cc.password.empty(), "shared tier: password_file \"{}\" is empty",
                      c.password_file);
  } else if (const char* env =
                 c.password_env.empty() ? nullptr : std::getenv(c.password_env.c_str());
             env != nullptr && *env != '\0') {
    cc.password = env;
  }
  KVOFFLOAD_EXPECTS(c.username.empty() || !cc.password.empty(),
                    "shared tier: username \"{}\" without a password: set password_file, or "
                    "the environment variable password_env names (\"{}\")",
                    c.username, c.password_env);
  KVOFFLOAD_EXPECTS(c.tls || (c.tls_ca_file.empty() && c.tls_cert_file.empty() &&
                              c.tls_key_file.empty() && c.tls_server_name.empty()),
                    "shared tier: tls_ca_file, tls_cert_file, tls_key_file or tls_server_name "
                    "is set but tls is not: set tls = true");
  KVOFFLOAD_EXPECTS(c.ttl_seconds >= 0, "shared tier: ttl_seconds must be >= 0, got {}",
                    c.ttl_seconds);
  cc.only_seeds = c.only_seeds;
  cc.tls.enabled = c.tls;
  cc.tls.ca_file = c.tls_ca_file;
  cc.tls.cert_file = c.tls_cert_file;
  cc.tls.key_file = c.tls_key_file;
  cc.tls.server_name = c.tls_server_name;
  return cc;
}

}  // namespace detail

// "v4": the value format of version 4 (HMAC-keyed GMAC; 3 had HMAC-SHA-256 over the whole
// value, 2 an unkeyed checksum). Other versions live in other namespaces, so an
// engine of either version sees the other's values as absent (a plain miss) rather than
// finding them and failing their promotion again at every request.
std::string shared_namespace(std::string_view name, int tp_size, std::int64_t block_size_factor) {
  KVOFFLOAD_EXPECTS(tp_size >= 1, "shared tier: tp_size must be >= 1, got {}", tp_size);
  KVOFFLOAD_EXPECTS(block_size_factor >= 1, "shared tier: block_size_factor must be >= 1, got {}",
                    block_size_factor);
  const std::string text = fmt::format("kvoffload shared tier v4\nname={}\ntp={}\nfactor={}\n",
                                       name, tp_size, block_size_factor);
  return fmt::format("{:016x}", XXH3_64bits(text.data(), text.size()));
}

SharedKeys::SharedKeys(const SharedTierConfig& c, std::int64_t block_size_factor)
    : namespace_(shared_namespace(c.name, c.tp_size, block_size_factor)) {
  std::string secret = load_secret(c, secure_);
  const auto bytes = std::as_bytes(std::span(secret.data(), secret.size()));
  mac_key_ = detail::derive_subkey(bytes, "kvoffload shared tier v4: value MACs");
  const detail::Mac names_key = detail::derive_subkey(bytes, "kvoffload shared tier v4: key names");
  names_ = std::make_unique<detail::Hmac>(names_key);
  // The secret itself is not kept: only what was derived from it.
  std::fill(secret.begin(), secret.end(), '\0');
}

SharedKeys::~SharedKeys() = default;

std::string SharedKeys::name(const Key& key, int rank, std::uint64_t epoch) const {
  const std::uint32_t group = key.group;
  const detail::Mac prf = names_->begin()
                              .update(namespace_)
                              .update(std::as_bytes(std::span(&epoch, 1)))
                              .update(std::as_bytes(std::span(&group, 1)))
                              .update(std::as_bytes(std::span(key.hash.data(), key.hash.size())))
                              .finish();
  std::string out = "kvo:{";
  for (std::size_t i = 0; i < 16; ++i) fmt::format_to(std::back_inserter(out), "{:02x}", prf[i]);
  fmt::format_to(std::back_inserter(out), "}}:{}", rank);
  return out;
}

std::unique_ptr<detail::ValueMac> SharedKeys::value_mac() const {
  return std::make_unique<detail::ValueMac>(mac_key_);
}

std::array<std::byte, 16> SharedKeys::mac_of(std::span<const std::byte> bytes) const {
  if (probe_ == nullptr) probe_ = value_mac();
  // A random header per call, as every write draws a nonce: no one-time key tags twice.
  std::array<std::byte, detail::kValueMacHeaderBytes> header{};
  detail::fill_random(header);
  return probe_->tag({}, header, bytes);
}

}  // namespace kvoffload
