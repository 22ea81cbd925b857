#pragma once

// How the engine describes a tier's store: the part of a tier the workers run (TierConfig, in
// config.hpp, adds the scheduler's index of it). kvoffload/detail/config_fields.hpp lists these
// fields once for the C API, the Python binding and the replay tool.

#include <cstdint>
#include <string>
#include <variant>

#include "kvoffload/enums.hpp"
#include "kvoffload/export.hpp"

namespace kvoffload {

/// A disk tier's store: slab files under `path` (DiskTier).
struct DiskTierConfig {
  std::string path;                  ///< root directory (a directory per layout under it)
  std::uint64_t capacity_bytes = 0;  ///< bound on this worker's slab files
  /// What makes bytes incompatible beyond the host block layout, given by the engine: the
  /// model's name and revision, the KV dtype, the group specs. Part of the layout digest.
  std::string model;
  std::string dtype;
  int tp_rank = 0;
  int tp_size = 1;
  DiskIo io = DiskIo::automatic;
  int io_depth = 32;   ///< io_uring: slot reads/writes in flight at once
  int io_threads = 4;  ///< threads: parallel pread/pwrite calls
  bool direct_io = true;
  /// C++ only (not in the front ends' field list): re-read every payload at the start-up scan.
  bool verify_payloads_on_scan = false;
};

/// A shared tier's store: a Valkey (or Redis 7) cluster (SharedTier).
struct SharedTierConfig {
  std::string nodes;  ///< seed nodes of the cluster, "host:port[,host:port...]"
  /// What makes KV bytes incompatible, given by the engine: model and revision, KV dtype,
  /// block size. With tp_size and the block size factor it names the keys' namespace (engines
  /// that share blocks must give the same); the worker's own layout goes into each value's
  /// header and is checked.
  std::string name;
  int tp_rank = 0;
  int tp_size = 1;
  int connect_timeout_ms = 200;
  int reply_timeout_ms = 1000;
  int in_flight = 8;  ///< blocks per pipelined batch
  /// The fleet secret (SharedKeys: the keys' names and the values' MACs), every engine of the
  /// fleet the same: a file holding it (one trailing newline is dropped), else the
  /// environment variable secret_env names. At least 16 bytes (openssl rand -hex 32).
  std::string secret_file;
  std::string secret_env = "KVOFFLOAD_SHARED_SECRET";
  /// Without a secret the tier refuses to start unless this is set: then keys and MACs use a
  /// public one, which guards against accidents but not against anyone who can write to the
  /// cluster or list its keys (a warning is logged).
  bool insecure = false;
  /// AUTH (an ACL user): the password from a file (one trailing newline dropped), else the
  /// environment variable password_env names; neither: no AUTH. username empty: "default".
  std::string username;
  std::string password_file;
  std::string password_env = "KVOFFLOAD_SHARED_PASSWORD";
  /// TLS to every node: the server's certificate verified against tls_ca_file (empty: the
  /// system's CAs) and its name against tls_server_name (empty: the host connected to); a
  /// client certificate (tls_cert_file and tls_key_file) if the servers ask for one.
  bool tls = false;
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_server_name;
  /// Values expire this many seconds after they are written (0: never; the cluster's own
  /// eviction policy still applies).
  int ttl_seconds = 0;
  /// Connect to the nodes listed in `nodes` only: a node the cluster names (its slot map, a
  /// MOVED or ASK) that is not listed is unreachable. For deployments that pin their nodes, so
  /// that a forged redirect cannot send blocks elsewhere.
  bool only_seeds = false;
};

/// What a worker runs for one tier: a disk tier or a shared tier.
using TierStore = std::variant<DiskTierConfig, SharedTierConfig>;

/// Medium::disk or Medium::shared, as the store is.
[[nodiscard]] inline Medium medium_of(const TierStore& store) noexcept {
  return std::holds_alternative<DiskTierConfig>(store) ? Medium::disk : Medium::shared;
}

}  // namespace kvoffload
