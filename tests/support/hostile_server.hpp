#pragma once

// A hostile RESP server on a loopback port, for the shared tier's deadlines and bounds: it
// answers CLUSTER SLOTS with a map (its own, or one the test gives: ports that do not answer,
// thousands of nodes) and every other command with a reply the test describes, which it can
// drip a byte at a time, stall on, cut off mid-way, or stream far larger than it holds (an
// array of five million integers, a 100 MiB bulk string, a 32 MiB error line) without
// building it in memory. A thread per connection (at most kMaxConnections at once); every
// loop is bounded by stop(), which the destructor calls.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <list>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "support/resp_command.hpp"

namespace kvoffload::test {

/// A reply: `head`, then `body` `repeat` times, then `tail` (e.g. "*5000000\r\n", ":1\r\n",
/// 5000000, ""). "PORT" in head or tail becomes the server's port.
struct HostileReply {
  std::string head;
  std::string body;
  std::size_t repeat = 0;
  std::string tail;
};

struct HostileBehavior {
  HostileReply reply;         ///< to every command but CLUSTER SLOTS
  std::string slots;          ///< the CLUSTER SLOTS answer (empty: every slot is ours)
  int drip_ms = 0;            ///< > 0: the reply a byte at a time, this far apart
  int gap_ms = 0;             ///< > 0: each reply (whole) this long after the one before
  bool stall = false;         ///< never answer (CLUSTER SLOTS still answered)
  std::size_t cut_after = 0;  ///< > 0: close the connection after this many reply bytes
  bool slots_too = false;     ///< drip and stall apply to CLUSTER SLOTS as well
};

class HostileServer {
 public:
  static constexpr int kMaxConnections = 16;

  explicit HostileServer(HostileBehavior b) : b_(std::move(b)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd_, 16) != 0) {
      throw std::runtime_error("hostile RESP server: cannot listen");
    }
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    for (std::string* s : {&b_.reply.head, &b_.reply.tail, &b_.slots}) {
      for (std::size_t at = s->find("PORT"); at != std::string::npos; at = s->find("PORT")) {
        s->replace(at, 4, std::to_string(port_));
      }
    }
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~HostileServer() { stop(); }
  HostileServer(const HostileServer&) = delete;
  HostileServer& operator=(const HostileServer&) = delete;

  void stop() {
    if (stop_.exchange(true)) return;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    acceptor_.join();
    std::lock_guard lock(mutex_);
    for (std::thread& t : workers_) t.join();
  }

  [[nodiscard]] int port() const { return port_; }
  /// Commands other than CLUSTER SLOTS received so far.
  [[nodiscard]] int commands() const { return commands_.load(); }
  [[nodiscard]] int connections() const { return connections_.load(); }

 private:
  void accept_loop() {
    while (!stop_) {
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;
      std::lock_guard lock(mutex_);
      if (++connections_ > 1000 || active_.load() >= kMaxConnections) {
        ::close(c);
        continue;
      }
      ++active_;
      workers_.emplace_back([this, c] {
        serve(c);
        --active_;
      });
    }
  }

  /// Sends `bytes` (dripped, or cut off at the byte budget); false once the client is gone,
  /// the budget is spent or the server stops.
  bool send(int c, std::string_view bytes, bool hostile, std::size_t& sent) {
    if (hostile && b_.drip_ms > 0) {
      for (const char ch : bytes) {
        if (stop_ || (b_.cut_after > 0 && sent >= b_.cut_after)) return false;
        if (::send(c, &ch, 1, MSG_NOSIGNAL) != 1) return false;
        ++sent;
        std::this_thread::sleep_for(std::chrono::milliseconds(b_.drip_ms));
      }
      return true;
    }
    while (!bytes.empty()) {
      if (stop_) return false;
      std::size_t n = bytes.size();
      if (hostile && b_.cut_after > 0) {
        if (sent >= b_.cut_after) return false;
        n = std::min(n, b_.cut_after - sent);
      }
      pollfd p{c, POLLOUT, 0};
      if (::poll(&p, 1, 50) <= 0) continue;  // the client is not reading: look at stop_ again
      const ssize_t w = ::send(c, bytes.data(), n, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (w <= 0) return false;
      bytes.remove_prefix(static_cast<std::size_t>(w));
      sent += static_cast<std::size_t>(w);
    }
    return true;
  }

  bool answer(int c, bool slots) {
    const bool hostile = !slots || b_.slots_too;
    if (hostile && b_.stall) {
      while (!stop_) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return false;
    }
    if (hostile && b_.gap_ms > 0) {
      for (int waited = 0; waited < b_.gap_ms && !stop_; waited += 10) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    std::size_t sent = 0;
    if (slots) {
      return send(c, b_.slots.empty() ? own_slots() : b_.slots, hostile, sent);
    }
    if (!send(c, b_.reply.head, true, sent)) return false;
    for (std::size_t i = 0; i < b_.reply.repeat; ++i) {
      if (!send(c, b_.reply.body, true, sent)) return false;
    }
    if (!send(c, b_.reply.tail, true, sent)) return false;
    return !(b_.cut_after > 0 && sent >= b_.cut_after);
  }

  void serve(int c) {
    std::string in;
    std::array<char, 65536> buf{};
    while (!stop_) {
      pollfd p{c, POLLIN, 0};
      const int r = ::poll(&p, 1, 50);
      if (r == 0) continue;
      const ssize_t n = r > 0 ? ::recv(c, buf.data(), buf.size(), 0) : -1;
      if (n <= 0) break;
      in.append(buf.data(), static_cast<std::size_t>(n));
      if (in.size() > (64 << 20)) break;  // a client flooding us: dropped
      bool open = true;
      for (std::size_t end = resp_command_end(in); open && end != std::string::npos;
           end = resp_command_end(in)) {
        const bool slots = in.substr(0, end).find("SLOTS") != std::string::npos;
        in.erase(0, end);
        if (!slots) ++commands_;
        open = answer(c, slots);
      }
      if (!open) break;
    }
    ::close(c);
  }

  [[nodiscard]] std::string own_slots() const { return one_node_slots(port_); }

  HostileBehavior b_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> commands_{0};
  std::atomic<int> connections_{0};
  std::atomic<int> active_{0};
  std::mutex mutex_;
  std::list<std::thread> workers_;
  std::thread acceptor_;
};

/// The most this process's resident set grew above where it was when the watch started,
/// sampled every 2 ms on a thread of its own (so a peak between two checks is seen).
class RssWatch {
 public:
  RssWatch() : base_(rss_bytes()) {
    thread_ = std::thread([this] {
      while (!done_) {
        const long now = rss_bytes();
        long seen = peak_.load();
        while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
  }
  ~RssWatch() {
    done_ = true;
    thread_.join();
  }
  RssWatch(const RssWatch&) = delete;
  RssWatch& operator=(const RssWatch&) = delete;
  /// Growth in bytes of the peak over the start.
  [[nodiscard]] long growth() const {
    return std::max(0L, std::max(peak_.load(), rss_bytes()) - base_);
  }

  static long rss_bytes() {
    long pages = 0, resident = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
      std::fclose(f);
    }
    return resident * ::sysconf(_SC_PAGESIZE);
  }

 private:
  long base_ = 0;
  std::atomic<long> peak_{0};
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace kvoffload::test
