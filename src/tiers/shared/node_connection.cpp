#include "tiers/shared/node_connection.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
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
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

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

/// Polls `fd` for `events` until `deadline`, in slices that look at `cancel`: 1 ready, 0 the
/// deadline passed, -1 an error (errno) or cancelled (errno ECANCELED).
int poll_until(int fd, short events, std::chrono::steady_clock::time_point deadline,
               const std::atomic<bool>* cancel) {
  for (;;) {
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
      errno = ECANCELED;
      return -1;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) return 0;
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, kCancelPollMs)));
    if (rc > 0) return 1;
    if (rc < 0 && errno != EINTR) return -1;
  }
}

/// A name's resolution, which may outlive its caller: getaddrinfo cannot be interrupted, so
/// a resolution that misses its deadline is left to its thread, which frees it when it ends.
/// (Not getaddrinfo_a: its helper threads are glibc's own, which ThreadSanitizer cannot see.)
struct Resolution {
  std::string host, port;
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  int rc = 0;
  addrinfo* result = nullptr;
  Resolution() = default;
  Resolution(const Resolution&) = delete;
  Resolution& operator=(const Resolution&) = delete;
  ~Resolution() {
    if (result != nullptr) ::freeaddrinfo(result);
  }
};

// Resolutions whose thread still runs (abandoned ones included): a slot map naming many names
// behind a resolver that hangs must not pile up threads.
std::atomic<int> resolutions_running{0};
constexpr int kMaxResolutionsRunning = 16;

/// The addresses of `host` (an IP address at once; a name on a thread of its own, waited for
/// at most `timeout_ms`: a slot map may name any host, and a resolver that hangs must not
/// stall the tier), or null with `why`.
std::shared_ptr<Resolution> resolve(const ClusterAddress& a, int timeout_ms,
                                    const std::atomic<bool>* cancel, std::string& why) {
  auto r = std::make_shared<Resolution>();
  r->host = a.host;
  r->port = std::to_string(a.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  int rc = ::getaddrinfo(r->host.c_str(), r->port.c_str(), &hints, &r->result);
  if (rc == 0) return r;
  if (rc != EAI_NONAME) {
    why = fmt::format("cannot resolve {}: {}", a.host, ::gai_strerror(rc));
    return nullptr;
  }
  if (resolutions_running.fetch_add(1) >= kMaxResolutionsRunning) {
    resolutions_running.fetch_sub(1);
    why = fmt::format("cannot resolve {}: {} resolutions still running", a.host,
                      kMaxResolutionsRunning);
    return nullptr;
  }
  try {
    std::thread([r] {
      addrinfo h{};
      h.ai_family = AF_UNSPEC;
      h.ai_socktype = SOCK_STREAM;
      h.ai_flags = AI_NUMERICSERV;
      addrinfo* found = nullptr;
      const int got = ::getaddrinfo(r->host.c_str(), r->port.c_str(), &h, &found);
      {
        const std::lock_guard lock(r->mutex);
        r->rc = got;
        r->result = got == 0 ? found : nullptr;
        r->done = true;
      }
      r->done_cv.notify_all();
      resolutions_running.fetch_sub(1);
    }).detach();
  } catch (const std::system_error& e) {
    resolutions_running.fetch_sub(1);
    why = fmt::format("cannot resolve {}: {}", a.host, e.what());
    return nullptr;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::unique_lock lock(r->mutex);
  while (!r->done && std::chrono::steady_clock::now() < deadline &&
         (cancel == nullptr || !cancel->load(std::memory_order_relaxed))) {
    r->done_cv.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() +
                                                       std::chrono::milliseconds(kCancelPollMs)));
  }
  if (!r->done) {
    why = fmt::format("resolving {} timed out ({} ms)", a.host, timeout_ms);
    return nullptr;
  }
  if (r->rc != 0) {
    why = fmt::format("cannot resolve {}: {}", a.host, ::gai_strerror(r->rc));
    return nullptr;
  }
  return r;
}

/// A TCP connection within `timeout_ms` (the name resolved within `resolve_ms`), or -1 with
/// `why`. The socket stays non-blocking: every later wait is a poll with a deadline.
int connect_tcp(const ClusterAddress& a, int timeout_ms, int resolve_ms, bool keepalive,
                const std::atomic<bool>* cancel, std::string& why) {
  const std::shared_ptr<Resolution> resolved = resolve(a, resolve_ms, cancel, why);
  if (resolved == nullptr) return -1;
  addrinfo* found = resolved->result;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  int fd = -1;
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      rc = poll_until(fd, POLLOUT, deadline, cancel);
      int err = 0;
      socklen_t len = sizeof err;
      if (rc == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
        rc = 0;
      } else {
        why = rc == 0 ? fmt::format("connect timed out ({} ms)", timeout_ms)
                      : std::strerror(err != 0 ? err : errno);
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
  if (fd < 0) return -1;
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
  SSL_CTX_set_options(ctx_, SSL_OP_NO_RENEGOTIATION);  // a server may not restart the handshake
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
  // A name (not an IP address) is resolved within the connect and reply timeouts together.
  const int fd = connect_tcp(address, o.connect_timeout_ms,
                             o.connect_timeout_ms + o.reply_timeout_ms, o.keepalive, o.cancel, why);
  if (fd < 0) return nullptr;
  std::unique_ptr<NodeConnection> c(new NodeConnection(o));
  c->fd_ = fd;
  c->reply_timeout_ms_ = o.reply_timeout_ms;
  c->min_rate_ = o.min_rate_bytes_per_s;
  c->cancel_ = o.cancel;
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
    // The handshake within the reply timeout, as a command would be.
    const auto deadline = Clock::now() + std::chrono::milliseconds(o.reply_timeout_ms);
    int rc = 0;
    int e = SSL_ERROR_NONE;
    for (;;) {
      {
        const SigpipeBlocked guard;
        rc = SSL_connect(c->ssl_);
      }
      if (rc == 1) break;
      e = SSL_get_error(c->ssl_, rc);
      if ((e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) ||
          !c->wait(e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline)) {
        break;
      }
    }
    if (rc != 1) {
      const long verify = SSL_get_verify_result(c->ssl_);
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
  if (!o.password.empty()) {
    failure = ConnectFailure::auth;
    const std::string_view user = o.username.empty() ? "default" : o.username;
    const std::array<std::string_view, 3> auth{"AUTH", user, o.password};
    RespValue r;
    if (!c->command(auth, r)) {
      failure = ConnectFailure::network;  // not a refusal: nothing answered (TLS expected?)
      why = "AUTH got no reply: " + c->error();
      return nullptr;
    }
    if (r.type != RespType::status) {
      why = fmt::format("AUTH as \"{}\" refused: {}", user,
                        r.type == RespType::error ? std::string_view(r.text)
                                                  : std::string_view("an unexpected reply"));
      return nullptr;
    }
  }
  failure = ConnectFailure::none;
  return c;
}

NodeConnection::~NodeConnection() {
  if (ssl_ != nullptr) SSL_free(ssl_);  // no close_notify: the socket closes anyway
  if (fd_ >= 0) ::close(fd_);
}

bool NodeConnection::fail(IoFailure kind, std::string why) {
  failure_ = kind;
  why_ = std::move(why);
  return false;
}

bool NodeConnection::wait(short events, Clock::time_point deadline) {
  const int rc = poll_until(fd_, events, deadline, cancel_);
  if (rc == 1) return true;
  if (rc == 0) {
    return fail(IoFailure::timeout,
                fmt::format("{} timed out ({} ms)", (events & POLLOUT) != 0 ? "send" : "reply",
                            reply_timeout_ms_));
  }
  return fail(IoFailure::other, errno == ECANCELED ? "cancelled" : std::strerror(errno));
}

bool NodeConnection::write_all(std::span<iovec> iov) {
  std::uint64_t bytes = 0;
  for (const iovec& v : iov) bytes += v.iov_len;
  // The reply timeout, plus the bytes' time at the slowest rate a busy link keeps.
  return write_all(iov,
                   Clock::now() + std::chrono::milliseconds(reply_timeout_ms_) +
                       std::chrono::milliseconds(min_rate_ == 0 ? 0 : bytes * 1000 / min_rate_));
}

bool NodeConnection::write_all(std::span<iovec> iov, Clock::time_point deadline) {
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
        if (errno != EAGAIN) return fail(IoFailure::other, std::strerror(errno));
        if (!wait(POLLOUT, deadline)) return false;
        continue;
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
        if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) {
          if (!wait(e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline)) return false;
          continue;  // the same bytes again, as SSL_write requires
        }
        return fail(IoFailure::other, "TLS write failed: " + ssl_error_text(std::strerror(errno)));
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

long NodeConnection::read_now(char* buf, std::size_t n) {
  for (;;) {
    if (ssl_ == nullptr) {
      const ssize_t got = ::read(fd_, buf, n);
      if (got > 0) return got;
      if (got == 0) {
        (void)fail(IoFailure::closed, "the server closed the connection");
        return 0;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        want_ = POLLIN;
        return kWouldBlock;
      }
      (void)fail(IoFailure::other, std::strerror(errno));
      return -1;
    }
    // SSL_read may write (a TLS 1.3 KeyUpdate): its callers block SIGPIPE around it (once for
    // several reads: the guard costs four system calls).
    const int got = SSL_read(ssl_, buf, static_cast<int>(std::min<std::size_t>(n, INT_MAX)));
    if (got > 0) return got;
    const int e = SSL_get_error(ssl_, got);
    if (e == SSL_ERROR_ZERO_RETURN) {
      (void)fail(IoFailure::closed, "the server closed the connection");
      return 0;
    }
    if (e == SSL_ERROR_SYSCALL && errno == EINTR) continue;
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
      want_ = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
      return kWouldBlock;
    }
    (void)fail(e == SSL_ERROR_SYSCALL && got == 0 ? IoFailure::closed : IoFailure::other,
               "TLS read failed: " + ssl_error_text(std::strerror(errno)));
    return -1;
  }
}

long NodeConnection::read_some(char* buf, std::size_t n, Clock::time_point deadline) {
  for (;;) {
    long got = 0;
    if (ssl_ != nullptr) {
      const SigpipeBlocked guard;
      got = read_now(buf, n);
    } else {
      got = read_now(buf, n);
    }
    if (got != kWouldBlock) return got;
    if (!wait(want_, deadline)) return -1;
  }
}

int NodeConnection::poll_reply(RespValue& reply) {
  // At most kMaxReads reads per call: the caller looks at its deadline and cancel flag in
  // between, also while a peer keeps the socket full.
  constexpr int kMaxReads = 16;
  std::optional<SigpipeBlocked> guard;
  if (ssl_ != nullptr) guard.emplace();  // SSL_read may write
  for (int reads = 0;; ++reads) {
    switch (reader_.parse(reply)) {
      case RespReader::Status::done: return 1;
      case RespReader::Status::error:
        (void)fail(IoFailure::protocol, "protocol error: " + reader_.error());
        return -1;
      case RespReader::Status::more: break;
    }
    if (reads == kMaxReads) return 0;
    const std::span<char> direct = reader_.direct();
    const std::span<char> to = direct.empty() ? reader_.space() : direct;
    const long got = read_now(to.data(), to.size());
    if (got == kWouldBlock) return 0;
    if (got <= 0) return -1;
    if (direct.empty()) {
      reader_.commit(static_cast<std::size_t>(got));
    } else {
      reader_.commit_direct(static_cast<std::size_t>(got));
    }
  }
}

bool NodeConnection::has_pending() const noexcept {
  // Decrypted bytes only (SSL_has_pending also counts a record still arriving, which poll()
  // does see: waking for it would spin until the deadline).
  return ssl_ != nullptr && SSL_pending(ssl_) > 0;
}

bool NodeConnection::timed_out() {
  return fail(IoFailure::timeout, fmt::format("reply timed out ({} ms)", reply_timeout_ms_));
}

bool NodeConnection::read_reply(RespValue& reply) {
  // One deadline for the whole reply, however its bytes trickle in.
  const auto deadline = Clock::now() + std::chrono::milliseconds(reply_timeout_ms_);
  for (;;) {
    switch (reader_.parse(reply)) {
      case RespReader::Status::done: return true;
      case RespReader::Status::error:
        return fail(IoFailure::protocol, "protocol error: " + reader_.error());
      case RespReader::Status::more: break;
    }
    if (Clock::now() >= deadline) return timed_out();  // also while bytes keep coming
    if (cancel_ != nullptr && cancel_->load(std::memory_order_relaxed)) {
      return fail(IoFailure::other, "cancelled");
    }
    const std::span<char> direct = reader_.direct();
    const std::span<char> to = direct.empty() ? reader_.space() : direct;
    const long got = read_some(to.data(), to.size(), deadline);
    if (got <= 0) return false;
    if (direct.empty()) {
      reader_.commit(static_cast<std::size_t>(got));
    } else {
      reader_.commit_direct(static_cast<std::size_t>(got));
    }
  }
}

bool NodeConnection::command(std::span<const std::string_view> args, RespValue& reply) {
  std::string out = fmt::format("*{}\r\n", args.size());
  for (const std::string_view a : args) {
    fmt::format_to(std::back_inserter(out), "${}\r\n", a.size());
    out += a;
    out += "\r\n";
  }
  iovec iov{out.data(), out.size()};
  return write_all(std::span(&iov, 1)) && read_reply(reply);
}

}  // namespace kvoffload::detail
