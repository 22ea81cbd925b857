#include "tiers/shared/node_connection.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <climits>
#include <csignal>
#include <cstring>

#include "common/expects.hpp"

namespace kvoffload::detail {
namespace {

/// The last OpenSSL error as text (and the queue emptied), or `fallback`.
std::string ssl_error_text(const char* fallback) {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return fallback;
  std::array<char, 256> text{};
  ERR_error_string_n(e, text.data(), text.size());
  return text.data();
}

/// OpenSSL writes with write(2): a peer that closed the connection would raise SIGPIPE and
/// kill an engine that does not ignore it. Blocked around each call, and a SIGPIPE it raised
/// is taken before the mask is restored.
class SigpipeBlocked {
 public:
  SigpipeBlocked() {
    sigset_t pipe_only;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    sigpending(&before_);
    already_pending_ = sigismember(&before_, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_only, &old_);
  }
  ~SigpipeBlocked() {
    if (!already_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        sigset_t pipe_only;
        sigemptyset(&pipe_only);
        sigaddset(&pipe_only, SIGPIPE);
        const timespec zero{};
        (void)sigtimedwait(&pipe_only, nullptr, &zero);
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlocked(const SigpipeBlocked&) = delete;
  SigpipeBlocked& operator=(const SigpipeBlocked&) = delete;

 private:
  sigset_t old_{}, before_{};
  bool already_pending_ = false;
};

timeval to_timeval(int ms) {
  timeval tv{};
  tv.tv_sec = ms / 1000;
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  return tv;
}

/// A TCP connection within `timeout_ms`, or -1 with `why`.
int connect_tcp(const ClusterAddress& a, int timeout_ms, bool keepalive, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(a.port);
  if (const int rc = ::getaddrinfo(a.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    why = fmt::format("cannot resolve {}: {}", a.host, ::gai_strerror(rc));
    return -1;
  }
  int fd = -1;
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = ::poll(&p, 1, timeout_ms);
      int err = 0;
      socklen_t len = sizeof err;
      if (rc == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
        rc = 0;
      } else {
        why = rc == 0 ? "connect timed out" : std::strerror(err != 0 ? err : errno);
        rc = -1;
      }
    } else if (rc != 0) {
      why = std::strerror(errno);
    }
    if (rc != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0) return -1;
  // Blocking from here on, every read and write bounded by the socket timeouts.
  (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  const int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (keepalive) {
    // A peer that vanished without a FIN (a dead machine) is found within about a minute.
    const int idle = 15, interval = 5, count = 3;
    (void)::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
  }
  return fd;
}

bool is_ip_address(const std::string& host) {
  in6_addr a6{};
  in_addr a4{};
  return ::inet_pton(AF_INET, host.c_str(), &a4) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), &a6) == 1;
}

constexpr std::size_t kReadChunk = 64 << 10;
// The reader frees a buffer above this once it is empty (a large value does not stay).
constexpr std::size_t kReaderMaxBuf = 16 << 20;

}  // namespace

TlsContext::TlsContext(const ClusterTls& tls) : server_name_(tls.server_name) {
  ctx_ = SSL_CTX_new(TLS_client_method());
  if (ctx_ == nullptr) throw error("TLS: SSL_CTX_new failed: " + ssl_error_text("unknown"));
  const auto refuse = [&](const std::string& what) {
    SSL_CTX_free(ctx_);
    ctx_ = nullptr;
    throw invalid_argument(what);
  };
  SSL_CTX_set_min_proto_version(ctx_, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER, nullptr);
  if (!tls.ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(ctx_, tls.ca_file.c_str(), nullptr) != 1) {
      refuse(fmt::format("shared tier: tls_ca_file \"{}\" cannot be loaded: {}", tls.ca_file,
                         ssl_error_text("not a PEM CA file")));
    }
  } else if (SSL_CTX_set_default_verify_paths(ctx_) != 1) {
    refuse("shared tier: TLS without tls_ca_file, and the system's CAs cannot be loaded: " +
           ssl_error_text("unknown"));
  }
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    refuse("shared tier: tls_cert_file and tls_key_file go together (a client certificate)");
  }
  if (!tls.cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx_, tls.cert_file.c_str()) != 1) {
      refuse(fmt::format("shared tier: tls_cert_file \"{}\" cannot be loaded: {}", tls.cert_file,
                         ssl_error_text("not a PEM certificate")));
    }
    if (SSL_CTX_use_PrivateKey_file(ctx_, tls.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx_) != 1) {
      refuse(
          fmt::format("shared tier: tls_key_file \"{}\" cannot be loaded or does not match "
                      "tls_cert_file: {}",
                      tls.key_file, ssl_error_text("not a PEM key")));
    }
  }
}

TlsContext::~TlsContext() {
  SSL_CTX_free(ctx_);
}

std::unique_ptr<NodeConnection> NodeConnection::open(const ClusterAddress& address,
                                                     const ConnectionOptions& o,
                                                     ConnectFailure& failure, std::string& why) {
  failure = ConnectFailure::network;
  const int fd = connect_tcp(address, o.connect_timeout_ms, o.keepalive, why);
  if (fd < 0) return nullptr;
  std::unique_ptr<NodeConnection> c(new NodeConnection());
  c->fd_ = fd;
  const timeval tv = to_timeval(o.reply_timeout_ms);
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (o.tls != nullptr) {
    failure = ConnectFailure::tls;
    c->ssl_ = SSL_new(o.tls->get());
    if (c->ssl_ == nullptr || SSL_set_fd(c->ssl_, fd) != 1) {
      why = "TLS: " + ssl_error_text("SSL_new failed");
      return nullptr;
    }
    // The name the certificate must carry: the configured one, else the host connected to
    // (an IP address is checked against the certificate's IP entries).
    const std::string& name = o.tls->server_name().empty() ? address.host : o.tls->server_name();
    X509_VERIFY_PARAM* param = SSL_get0_param(c->ssl_);
    const bool ip = is_ip_address(name);
    if (!ip) {
      (void)SSL_set_tlsext_host_name(c->ssl_, name.c_str());
      X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    }
    if ((ip ? X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str())
            : X509_VERIFY_PARAM_set1_host(param, name.c_str(), 0)) != 1) {
      why = fmt::format("TLS: cannot verify the name \"{}\"", name);
      return nullptr;
    }
    int rc = 0;
    {
      const SigpipeBlocked guard;
      rc = SSL_connect(c->ssl_);
    }
    if (rc != 1) {
      const long verify = SSL_get_verify_result(c->ssl_);
      const int e = SSL_get_error(c->ssl_, rc);
      if (verify == X509_V_OK &&
          (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_SYSCALL)) {
        // No answer in time, or the connection dropped: an outage (a stopped node still
        // accepts TCP), not a TLS refusal.
        failure = ConnectFailure::network;
        why = "TLS handshake got no answer: " +
              ssl_error_text(e == SSL_ERROR_SYSCALL ? "the connection closed" : "timed out");
        return nullptr;
      }
      why = verify != X509_V_OK
                ? fmt::format("TLS: the server's certificate is refused: {}",
                              X509_verify_cert_error_string(verify))
                : "TLS: handshake failed: " + ssl_error_text("the connection closed");
      return nullptr;
    }
  }
  c->reader_ = redisReaderCreateWithFunctions(o.functions);
  if (c->reader_ == nullptr) {
    why = "out of memory";
    return nullptr;
  }
  c->reader_->privdata = o.privdata;
  c->reader_->maxbuf = kReaderMaxBuf;
  if (!o.password.empty()) {
    failure = ConnectFailure::auth;
    const std::string_view user = o.username.empty() ? "default" : o.username;
    const std::array<std::string_view, 3> auth{"AUTH", user, o.password};
    void* raw = nullptr;
    if (!c->command(auth, &raw)) {
      failure = ConnectFailure::network;  // not a refusal: nothing answered (TLS expected?)
      why = "AUTH got no reply: " + c->error();
      return nullptr;
    }
    auto* r = static_cast<redisReply*>(raw);
    const bool ok = r->type == REDIS_REPLY_STATUS;
    if (!ok) {
      why = fmt::format("AUTH as \"{}\" refused: {}", user,
                        r->type == REDIS_REPLY_ERROR ? std::string_view(r->str, r->len)
                                                     : std::string_view("an unexpected reply"));
    }
    freeReplyObject(r);
    if (!ok) return nullptr;
  }
  failure = ConnectFailure::none;
  return c;
}

NodeConnection::~NodeConnection() {
  if (reader_ != nullptr) redisReaderFree(reader_);
  if (ssl_ != nullptr) SSL_free(ssl_);  // no close_notify: the socket closes anyway
  if (fd_ >= 0) ::close(fd_);
}

bool NodeConnection::fail(std::string why) {
  why_ = std::move(why);
  return false;
}

bool NodeConnection::write_all(std::span<iovec> iov) {
  std::size_t first = 0;
  while (first < iov.size()) {
    std::size_t wrote = 0;
    if (ssl_ == nullptr) {
      msghdr m{};
      m.msg_iov = iov.data() + first;
      m.msg_iovlen = std::min<std::size_t>(iov.size() - first, IOV_MAX);
      const ssize_t w = ::sendmsg(fd_, &m, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EINTR) continue;
        return fail(errno == EAGAIN ? "send timed out" : std::strerror(errno));
      }
      wrote = static_cast<std::size_t>(w);
    } else {
      const int n = static_cast<int>(std::min<std::size_t>(iov[first].iov_len, INT_MAX));
      int w = 0;
      {
        const SigpipeBlocked guard;
        w = SSL_write(ssl_, iov[first].iov_base, n);
      }
      if (w <= 0) {
        const int e = SSL_get_error(ssl_, w);
        return fail(e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ
                        ? "send timed out"
                        : "TLS write failed: " + ssl_error_text(std::strerror(errno)));
      }
      wrote = static_cast<std::size_t>(w);
    }
    while (first < iov.size() && wrote >= iov[first].iov_len) wrote -= iov[first++].iov_len;
    if (wrote > 0) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + wrote;
      iov[first].iov_len -= wrote;
    }
  }
  return true;
}

long NodeConnection::read_some(char* buf, std::size_t n) {
  for (;;) {
    if (ssl_ == nullptr) {
      const ssize_t got = ::read(fd_, buf, n);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) why_ = errno == EAGAIN ? "reply timed out" : std::strerror(errno);
      if (got == 0) why_ = "the server closed the connection";
      return got;
    }
    const int got = SSL_read(ssl_, buf, static_cast<int>(std::min<std::size_t>(n, INT_MAX)));
    if (got > 0) return got;
    const int e = SSL_get_error(ssl_, got);
    if (e == SSL_ERROR_ZERO_RETURN) {
      why_ = "the server closed the connection";
      return 0;
    }
    if (e == SSL_ERROR_SYSCALL && errno == EINTR) continue;
    why_ = e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE
               ? "reply timed out"
               : "TLS read failed: " + ssl_error_text(std::strerror(errno));
    return -1;
  }
}

bool NodeConnection::fill() {
  std::array<char, kReadChunk> buf;  // NOLINT(cppcoreguidelines-pro-type-member-init)
  const long got = read_some(buf.data(), buf.size());
  if (got <= 0) return false;
  if (redisReaderFeed(reader_, buf.data(), static_cast<std::size_t>(got)) != REDIS_OK) {
    return fail(reader_->errstr);
  }
  return true;
}

bool NodeConnection::get_reply(void** reply) {
  *reply = nullptr;
  for (;;) {
    if (redisReaderGetReply(reader_, reply) != REDIS_OK) {
      return fail(std::string("protocol error: ") + reader_->errstr);
    }
    if (*reply != nullptr) return true;
    if (!fill()) return false;
  }
}

bool NodeConnection::get_bounded_reply(void** reply, std::size_t max_bytes, bool& oversized) {
  oversized = false;
  *reply = nullptr;
  // The next reply's first line, before the reader parses (and buffers) its body.
  for (;;) {
    const std::string_view ahead(reader_->buf + reader_->pos, reader_->len - reader_->pos);
    const std::size_t eol = ahead.find("\r\n");
    if (eol == std::string_view::npos) {
      if (ahead.size() > 32) return get_reply(reply);  // no bulk string header: the reader says
      if (!fill()) return false;
      continue;
    }
    if (!ahead.starts_with('$')) return get_reply(reply);
    long long length = -1;
    const auto [end, ec] = std::from_chars(ahead.data() + 1, ahead.data() + eol, length);
    if (ec != std::errc{} || end != ahead.data() + eol || length < 0 ||
        static_cast<unsigned long long>(length) <= max_bytes) {
      return get_reply(reply);
    }
    // Too long: skip its bytes (line, body, CRLF) from the buffer, then from the socket.
    const auto total = static_cast<std::size_t>(eol + 2) + static_cast<std::size_t>(length) + 2;
    const std::size_t buffered = std::min(total, ahead.size());
    reader_->pos += buffered;
    std::size_t left = total - buffered;
    std::array<char, kReadChunk> sink;  // NOLINT(cppcoreguidelines-pro-type-member-init)
    while (left > 0) {
      const long got = read_some(sink.data(), std::min(left, sink.size()));
      if (got <= 0) return false;
      left -= static_cast<std::size_t>(got);
    }
    oversized = true;
    return true;
  }
}

bool NodeConnection::command(std::span<const std::string_view> args, void** reply) {
  std::string out = fmt::format("*{}\r\n", args.size());
  for (const std::string_view a : args) {
    fmt::format_to(std::back_inserter(out), "${}\r\n", a.size());
    out += a;
    out += "\r\n";
  }
  iovec iov{out.data(), out.size()};
  return write_all(std::span(&iov, 1)) && get_reply(reply);
}

}  // namespace kvoffload::detail
