#pragma once

// Internal: one connection of the cluster client to one node, plain TCP or TLS (OpenSSL),
// authenticated with AUTH when a password is configured, with our bounded reply reader
// (resp_reader.hpp). Every wait has a deadline: the socket is non-blocking and each wait is a
// poll() for what is left of it. The TCP connect gets the connect timeout; the TLS handshake,
// AUTH, each write_all() and each reply read with read_reply() get the reply timeout (a node
// that drip-feeds a reply a byte at a time misses it like one that says nothing); the cluster
// client gives a pipelined batch's replies (poll_reply) one deadline for all. A cancel flag
// (another thread's) ends any wait within kCancelPollMs. Not thread-safe: one per thread.

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "kvoffload/tiers/cluster_client.hpp"
#include "tiers/shared/resp_reader.hpp"

struct ssl_ctx_st;
struct ssl_st;

namespace kvoffload::detail {

/// What a failed connect was: counted apart, since an operator fixes them differently.
enum class ConnectFailure : std::uint8_t { none, network, tls, auth };

/// The TLS settings every connection of a client shares (an SSL_CTX). Throws
/// invalid_argument naming the file for a CA, certificate or key that cannot be loaded.
class TlsContext {
 public:
  explicit TlsContext(const ClusterTls& tls);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;
  [[nodiscard]] ssl_ctx_st* get() const noexcept { return ctx_; }
  [[nodiscard]] const std::string& server_name() const noexcept { return server_name_; }

 private:
  ssl_ctx_st* ctx_ = nullptr;
  std::string server_name_;
};

struct ConnectionOptions {
  int connect_timeout_ms = 200;
  int reply_timeout_ms = 1000;
  std::uint64_t min_rate_bytes_per_s = 0;  ///< a write's deadline allows its bytes at this rate
  const TlsContext* tls = nullptr;         ///< null: plain TCP
  std::string_view username;               ///< AUTH's user (empty: "default")
  std::string_view password;               ///< empty: no AUTH
  bool keepalive = true;
  RespLimits limits{};
  /// Set by another thread to end every wait at once (the connection then fails).
  const std::atomic<bool>* cancel = nullptr;
};

/// How long a wait sleeps at most before it looks at the cancel flag.
inline constexpr int kCancelPollMs = 50;

/// Why a call failed, for the client's counters.
enum class IoFailure : std::uint8_t { none, timeout, closed, protocol, other };

class NodeConnection {
 public:
  /// Connects (TLS handshake, AUTH); nullptr with `failure` and `why` set if it could not.
  static std::unique_ptr<NodeConnection> open(const ClusterAddress& address,
                                              const ConnectionOptions& options,
                                              ConnectFailure& failure, std::string& why);
  ~NodeConnection();
  NodeConnection(const NodeConnection&) = delete;
  NodeConnection& operator=(const NodeConnection&) = delete;

  /// Writes every byte of `iov` (modified as it goes) within the reply timeout; false on an
  /// error or a missed deadline.
  bool write_all(std::span<iovec> iov);
  /// The same, by the caller's deadline (the cluster client's: one for a whole batch).
  bool write_all(std::span<iovec> iov, std::chrono::steady_clock::time_point deadline);
  /// For the next reply only: a bulk string of prefix + into.size() bytes goes to `into`
  /// (RespReader::expect).
  void expect(std::span<std::byte> into, std::size_t prefix) noexcept {
    reader_.expect(into, prefix);
  }
  /// For the next reply only: a smaller memory budget (RespReader::limit_next).
  void limit_next(std::size_t bytes) noexcept { reader_.limit_next(bytes); }
  /// Bytes received and not yet parsed: after a batch's last reply, a protocol violation.
  [[nodiscard]] std::size_t buffered() const noexcept { return reader_.buffered(); }
  /// The next reply, whole, within the reply timeout; false on an error, a missed deadline or
  /// a reply that breaks the protocol or a bound (error() and failure() say which).
  bool read_reply(RespValue& reply);
  /// Sends one command of plain arguments and reads its reply (for set-up commands).
  bool command(std::span<const std::string_view> args, RespValue& reply);
  /// Without waiting (for several nodes read at once): 1, the next reply is in `reply`; 0,
  /// more bytes are needed (poll fd() for want_events()); -1, failed (error(), failure()).
  /// Call again with the same `reply` until it returns 1 or -1.
  int poll_reply(RespValue& reply);
  [[nodiscard]] int fd() const noexcept { return fd_; }
  /// Bytes TLS has received and not yet handed over (poll() cannot see them).
  [[nodiscard]] bool has_pending() const noexcept;
  [[nodiscard]] short want_events() const noexcept { return want_; }
  /// The caller's deadline for the reply being read passed: fails with a timeout.
  bool timed_out();
  /// The caller gives up on this connection (cancelled): fails with `why`.
  bool give_up(IoFailure kind, std::string why) { return fail(kind, std::move(why)); }
  [[nodiscard]] const std::string& error() const noexcept { return why_; }
  [[nodiscard]] IoFailure failure() const noexcept { return failure_; }

 private:
  using Clock = std::chrono::steady_clock;
  explicit NodeConnection(const ConnectionOptions& o) : reader_(o.limits) {}
  /// Waits until the socket is ready for `events` or the deadline passes (false, failure set).
  bool wait(short events, Clock::time_point deadline);
  static constexpr long kWouldBlock = -2;
  /// Reads up to `n` bytes without waiting: > 0 bytes; kWouldBlock (want_ says for what);
  /// else 0 or -1 with the failure set (end of stream, an error).
  long read_now(char* buf, std::size_t n);
  /// read_now, waiting until the deadline: > 0 bytes, else the failure is set.
  long read_some(char* buf, std::size_t n, Clock::time_point deadline);
  bool fail(IoFailure kind, std::string why);

  int fd_ = -1;
  ssl_st* ssl_ = nullptr;
  int reply_timeout_ms_ = 1000;
  std::uint64_t min_rate_ = 0;
  short want_ = 0x001;  // POLLIN
  const std::atomic<bool>* cancel_ = nullptr;
  RespReader reader_;
  std::string why_;
  IoFailure failure_ = IoFailure::none;
};

}  // namespace kvoffload::detail
