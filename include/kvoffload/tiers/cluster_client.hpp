#pragma once

// A small client for a Valkey (or Redis 7) cluster, what the shared tier talks through: our own
// sockets (plain TCP or TLS through OpenSSL, AUTH with an ACL user), our own bounded reply
// reader, and on top of them the cluster's rules: the slot map (CLUSTER SLOTS), key slots (CRC16
// with hash tags), MOVED and ASK redirects, map refresh, one connection per node, pipelined
// batches, deadlines on connect, on each write and on each batch's replies. A server without
// cluster support (standalone Valkey or Redis) is one node owning every slot. Not thread-safe: one
// per thread.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvoffload/export.hpp"

namespace kvoffload {

struct ClusterAddress {
  std::string host;
  int port = 0;
};

/// Parses "host:port[,host:port...]". Throws invalid_argument naming `field` and the entry.
KVOFFLOAD_EXPORT std::vector<ClusterAddress> parse_cluster_nodes(std::string_view text,
                                                                 std::string_view field);

/// TLS to every node (OpenSSL): the server's certificate is verified against `ca_file` (empty:
/// the system's CAs) and must name `server_name` (empty: the host connected to, an IP address
/// checked against the certificate's IP entries). A client certificate is optional.
struct ClusterTls {
  bool enabled = false;
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  std::string server_name;
};

/// Which nodes are being skipped, shared by clients of one cluster (a tier's presence
/// threads): a node one client found down or slow is skipped by the others until its backoff
/// ends, instead of each paying a deadline to find out. Thread-safe.
class KVOFFLOAD_EXPORT ClusterHealth {
 public:
  using Clock = std::chrono::steady_clock;
  ClusterHealth();
  ~ClusterHealth();
  ClusterHealth(const ClusterHealth&) = delete;
  ClusterHealth& operator=(const ClusterHealth&) = delete;
  /// Until when `address` is skipped (a past time: it is not).
  [[nodiscard]] Clock::time_point down_until(const ClusterAddress& address) const;
  /// Skips `address` until `until` (the later of this and what was set).
  void mark_down(const ClusterAddress& address, Clock::time_point until);
  /// A connection to `address` worked: it is not skipped.
  void mark_up(const ClusterAddress& address);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct ClusterClientConfig {
  std::vector<ClusterAddress> seeds;  ///< any nodes of the cluster; the rest is discovered
  int connect_timeout_ms = 200;
  /// For each write, and for all the replies of a pipelined batch together (from when it was
  /// written, plus the values' time at min_rate_bytes_per_s), however their bytes trickle in;
  /// the TLS handshake, AUTH and the slot map get it too (a stopped or drip-feeding node costs
  /// this once, then is skipped). A round's connects and writes over all nodes stop after
  /// connect + 2 x this (plus its values' time at the minimum rate); a name is resolved within
  /// connect + this.
  int reply_timeout_ms = 1000;
  /// The slowest rate a healthy but busy link is expected to keep: a batch's deadlines get
  /// the time its values take at this rate on top of the reply timeout (reads: the values
  /// read in place; writes: the values sent), so a slow but steady link is not marked down,
  /// while a drip feed still misses. 0: no allowance.
  std::uint64_t min_rate_bytes_per_s = 16ull << 20;
  int max_redirects = 5;  ///< MOVED/ASK hops per command before it fails
  /// A node that failed is not tried again for this long, doubled at each failure in a row up
  /// to max_backoff_ms, each wait drawn from [0.5, 1.5) of it (jitter: a fleet does not
  /// reconnect in step).
  int down_backoff_ms = 500;
  int max_backoff_ms = 8000;
  /// AUTH on every connection when password is set (username empty: "default").
  std::string username;
  std::string password;
  ClusterTls tls;
  bool keepalive = true;  ///< TCP keepalive: a vanished peer is found within about a minute
  /// Connect to the seeds only: nodes the cluster names (slot map, MOVED, ASK) that are not
  /// seeds count as unreachable. For deployments that pin their nodes, and for tests that
  /// must not reach anything else.
  bool only_seeds = false;
  /// The flag cancel() sets (null: the client makes its own). Clients built with one flag are
  /// cancelled together, including one built after it was set (a tier that replaces its
  /// client after a failed batch).
  std::shared_ptr<std::atomic<bool>> cancel{};
  /// Shared with other clients of the cluster (null: this client's own view only).
  std::shared_ptr<ClusterHealth> health{};
};

/// One command: `args` in full (the name first), then, if `value` is not empty, one more
/// argument made of its pieces end to end (a value's header and payload without a copy).
struct ClusterCommand {
  std::string_view key{};  ///< routes the command to the node owning its slot
  std::vector<std::string_view> args{};
  std::vector<std::string_view> value{};
  /// For a large value read (GET): if the reply is a bulk string of exactly reply_prefix +
  /// reply_into.size() bytes, its bytes after the prefix are written to reply_into as they are
  /// parsed (one copy less) and the reply's text is the prefix (ClusterReply::in_place). The
  /// caller must treat reply_into as garbage unless it then accepts the reply.
  /// A longer bulk string (or a shorter one over max_reply_bytes) is not read into memory: it
  /// is skipped and answered as a string with ClusterReply::oversized set.
  std::span<std::byte> reply_into{};
  std::size_t reply_prefix = 0;
  /// The most memory its reply may take (strings and array elements, checked as each header
  /// arrives; a value read in place does not count), up to 8 MiB: a reply over it fails the
  /// command and drops the connection. A status, an integer or an error fits the default.
  std::size_t max_reply_bytes = 64 << 10;
  /// Called right before the command is written (the commands before it already are), so
  /// work on its value (a checksum) overlaps the node's work on the ones before. Called again
  /// if a redirect sends the command again.
  std::function<void()> before_send{};
};

enum class ClusterReplyKind : std::uint8_t {
  string,   ///< a bulk string: text
  nil,      ///< a nil bulk string (GET of a missing key)
  integer,  ///< integer
  status,   ///< a status line: text ("OK")
  array,    ///< an array (its elements are not passed on)
  error,    ///< an error reply from the server: text (MOVED and ASK are followed, not passed)
  failed,   ///< no reply: the node is down or timed out, the map has no owner, too many redirects
};

/// A reply, valid only during the callback that receives it.
struct ClusterReply {
  ClusterReplyKind kind = ClusterReplyKind::failed;
  long long integer = 0;
  std::string_view text;
  bool in_place = false;   ///< a string whose bytes after the prefix went to reply_into
  bool oversized = false;  ///< a string longer than asked for, or too large: skipped, no text
};

struct ClusterStats {
  std::uint64_t commands = 0;        ///< commands run (each once, however often redirected)
  std::uint64_t failed = 0;          ///< commands answered ClusterReplyKind::failed
  std::uint64_t moved = 0;           ///< MOVED redirects followed
  std::uint64_t asked = 0;           ///< ASK redirects followed
  std::uint64_t refreshes = 0;       ///< slot map loads
  std::uint64_t connects = 0;        ///< connections opened
  std::uint64_t connect_errors = 0;  ///< connections that could not be opened (network)
  std::uint64_t tls_errors = 0;      ///< TLS handshakes that failed (certificate, protocol)
  std::uint64_t auth_errors = 0;     ///< connections whose AUTH was refused
  std::uint64_t io_errors = 0;       ///< connections dropped: timeout, reset, bad protocol
  std::uint64_t timeouts = 0;  ///< of io_errors: a write or a batch's replies missed the deadline
  std::uint64_t protocol_errors = 0;  ///< of io_errors: a reply broke the protocol or a bound
  std::uint64_t oversized = 0;        ///< values longer than asked for, skipped unbuffered
};

class KVOFFLOAD_EXPORT ClusterClient {
 public:
  /// Connects to nothing yet. Throws invalid_argument for no seeds or a bad timeout.
  explicit ClusterClient(ClusterClientConfig config);
  ~ClusterClient();
  ClusterClient(const ClusterClient&) = delete;
  ClusterClient& operator=(const ClusterClient&) = delete;

  /// Runs the commands, pipelined (each node gets its commands as one batch), and calls
  /// on_reply(i, reply) once for each command i, in no particular order. Never throws for the
  /// network: a node that is down, slow or talking nonsense answers its commands `failed`
  /// (and is skipped for down_backoff_ms), and the next call reloads the slot map.
  void run(std::span<const ClusterCommand> commands,
           const std::function<void(std::size_t, const ClusterReply&)>& on_reply);
  /// From any thread: every wait of this client ends within about 50 ms and every later
  /// command fails at once (for a bounded shutdown whatever the servers do).
  void cancel() noexcept;
  /// Loads the slot map now; false if no node answered.
  bool refresh();
  [[nodiscard]] ClusterStats stats() const noexcept;
  /// "host:port" of the node owning `slot` in the current map, or empty.
  [[nodiscard]] std::string owner_of(int slot) const;
  /// What went wrong last with a connection ("127.0.0.1:7101: AUTH as \"x\" refused: ..."),
  /// or empty.
  [[nodiscard]] std::string last_error() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The cluster's slot of a key (CRC16 of its hash tag, or of the whole key, mod 16384).
KVOFFLOAD_EXPORT int cluster_key_slot(std::string_view key) noexcept;

}  // namespace kvoffload
