#pragma once

// What a fleet's shared tier is keyed by: a secret every engine of the fleet holds and nobody
// else. From it come the keys' names (a keyed PRF of the namespace, group and block hash, so
// a key reveals no prompt hash: whoever can list or test keys learns nothing of what was
// served) and the values' MACs (a one-time key from HMAC-SHA-256 over key name and header,
// GMAC with it over the payload, so a value a writer without the secret forged or moved is
// refused). The secret comes from a file or an environment variable
// (SharedTierConfig::secret_file, secret_env), never from a config string that may be logged.

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "kvoffload/export.hpp"
#include "kvoffload/tiers/tier_config.hpp"
#include "kvoffload/types.hpp"

namespace kvoffload {

namespace detail {
class Hmac;
class ValueMac;
}  // namespace detail

/// The shortest secret accepted, in bytes.
inline constexpr std::size_t shared_secret_min_bytes = 16;
/// The shortest block hash a shared tier takes, in bytes: a shorter one lets a writer look
/// for a colliding prompt, or guess one.
inline constexpr std::size_t shared_hash_min_bytes = 16;

/// The keys' namespace: 16 hex digits of XXH3 of the name, tp_size and block_size_factor.
/// The factor is in it because a key names the hash of a host block's last hash block: with
/// factors 2 and 4, host block 1 of one and host block 0 of the other have the same key but
/// hold different tokens, so engines with different factors must not share keys. Throws
/// invalid_argument for a tp_size or factor below 1.
KVOFFLOAD_EXPORT std::string shared_namespace(std::string_view name, int tp_size,
                                              std::int64_t block_size_factor);

/// A shared tier's names and MAC key under the fleet secret. Not thread-safe: one per thread.
class KVOFFLOAD_EXPORT SharedKeys {
 public:
  /// Loads the secret: from config.secret_file if set, else from the environment variable
  /// config.secret_env; without either, the public "insecure" secret if config.insecure
  /// (logged as a warning), else throws invalid_argument naming the fields. A secret shorter
  /// than shared_secret_min_bytes is refused.
  SharedKeys(const SharedTierConfig& config, std::int64_t block_size_factor);
  ~SharedKeys();
  SharedKeys(const SharedKeys&) = delete;
  SharedKeys& operator=(const SharedKeys&) = delete;

  /// The cluster key of `key`'s row of rank `rank` under the weights' epoch `epoch`
  /// (TierJob::epoch): "kvo:{<32 hex digits>}:<rank>", the digits a keyed PRF of the
  /// namespace, epoch, group and hash (the hash tag keeps a key's ranks in one slot). Blocks
  /// of another epoch have other names: they are never found, and a value's MAC covers its
  /// name, so none can be moved across epochs.
  [[nodiscard]] std::string name(const Key& key, int rank, std::uint64_t epoch) const;
  [[nodiscard]] const std::string& key_namespace() const noexcept { return namespace_; }
  /// Whether a fleet secret was given (false: the public insecure one).
  [[nodiscard]] bool secure() const noexcept { return secure_; }
  /// A new value MAC under the values' MAC key (derived from the secret).
  [[nodiscard]] std::unique_ptr<detail::ValueMac> value_mac() const;
  /// The tag a value whose payload is `bytes` gets (name and header empty): what a tool
  /// measuring the MAC's cost calls.
  [[nodiscard]] std::array<std::byte, 16> mac_of(std::span<const std::byte> bytes) const;

 private:
  std::string namespace_;
  bool secure_ = false;
  std::array<std::byte, 32> mac_key_{};
  std::unique_ptr<detail::Hmac> names_;
  mutable std::unique_ptr<detail::ValueMac> probe_;  // mac_of's
};

}  // namespace kvoffload
