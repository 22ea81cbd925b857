#pragma once

// Internal: one connection of the cluster client to one node, plain TCP or TLS (OpenSSL),
// authenticated with AUTH when a password is configured. Our own socket I/O with hiredis's
// reply parser (redisReader) on top, so that TLS, timeouts and the bound on a value's size are
// ours. Blocking sockets with SO_RCVTIMEO/SO_SNDTIMEO of the reply timeout; the connect is
// bounded by the connect timeout. Not thread-safe: one per thread (the client's).

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "kvoffload/tiers/cluster_client.hpp"

struct redisReader;
struct redisReplyObjectFunctions;
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
  const TlsContext* tls = nullptr;  ///< null: plain TCP
  std::string_view username;        ///< AUTH's user (empty: "default")
  std::string_view password;        ///< empty: no AUTH
  bool keepalive = true;
  /// The reader's functions and their privdata (the client's in-place values).
  redisReplyObjectFunctions* functions = nullptr;
  void* privdata = nullptr;
};

class NodeConnection {
 public:
  /// Connects (TLS handshake, AUTH); nullptr with `failure` and `why` set if it could not.
  static std::unique_ptr<NodeConnection> open(const ClusterAddress& address,
                                              const ConnectionOptions& options,
                                              ConnectFailure& failure, std::string& why);
  ~NodeConnection();
  NodeConnection(const NodeConnection&) = delete;
  NodeConnection& operator=(const NodeConnection&) = delete;

  /// Writes every byte of `iov` (modified as it goes); false on an error or a timeout.
  bool write_all(std::span<iovec> iov);
  /// The next reply (a redisReply* built by the options' functions; the caller frees it);
  /// false on an error, a timeout or a protocol error (then `why` says which).
  bool get_reply(void** reply);
  /// Reads the next reply if it is a bulk string of at most `max_bytes`; a longer one is read
  /// and thrown away without being buffered, `oversized` set and *reply null. Replies of
  /// other kinds are read as get_reply does.
  bool get_bounded_reply(void** reply, std::size_t max_bytes, bool& oversized);
  /// Sends one command of plain arguments and reads its reply (for set-up commands).
  bool command(std::span<const std::string_view> args, void** reply);
  [[nodiscard]] const std::string& error() const noexcept { return why_; }

 private:
  NodeConnection() = default;
  /// Reads what the socket has (up to `n` bytes): > 0 bytes, 0 at end of stream, < 0 error.
  long read_some(char* buf, std::size_t n);
  bool fill();  // one read_some into the reader
  bool fail(std::string why);

  int fd_ = -1;
  ssl_st* ssl_ = nullptr;
  redisReader* reader_ = nullptr;
  std::string why_;
};

}  // namespace kvoffload::detail
