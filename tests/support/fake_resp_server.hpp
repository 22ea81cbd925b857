#pragma once

// A fake RESP server on a loopback port, for bad network input (the cluster client's tests and
// its fuzz target): it answers CLUSTER SLOTS with a map of its own and every other command with
// bytes the test chooses.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>

#include "support/resp_command.hpp"

namespace kvoffload::test {

/// A one-connection-at-a-time RESP server on a loopback port: CLUSTER SLOTS gets a map giving
/// it every slot; any other command gets `answer` (raw bytes, whatever a test needs: a
/// truncated reply, a wrong type, a huge length; "PORT" in it becomes the server's port).
/// Stops in its destructor.
class FakeRespServer {
 public:
  /// `slots`: the answer to CLUSTER SLOTS (empty: a map giving this server every slot).
  /// `hang_up`: close the connection after the first answer (a truncated reply then ends at
  /// once instead of after the client's timeout; later commands get no reply).
  explicit FakeRespServer(std::string answer, std::string slots = {}, bool hang_up = false)
      : answer_(std::move(answer)), slots_(std::move(slots)), hang_up_(hang_up) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd_, 8) != 0) {
      throw std::runtime_error("fake RESP server: cannot listen");
    }
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    if (const std::size_t at = answer_.find("PORT"); at != std::string::npos) {
      answer_.replace(at, 4, std::to_string(port_));
    }
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeRespServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  FakeRespServer(const FakeRespServer&) = delete;
  FakeRespServer& operator=(const FakeRespServer&) = delete;

  [[nodiscard]] int port() const { return port_; }
  [[nodiscard]] int commands() const { return commands_.load(); }

 private:
  void serve() {
    while (!stop_) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      timeval tv{2, 0};  // bounded: a client that stops talking is dropped after 2 s
      ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      std::string in;
      std::array<char, 65536> buf{};
      for (int rounds = 0; rounds < 10000 && !stop_; ++rounds) {
        const ssize_t n = ::recv(c, buf.data(), buf.size(), 0);
        if (n <= 0) break;
        in.append(buf.data(), static_cast<std::size_t>(n));
        // One answer per complete command seen (commands end with "\r\n"; good enough for the
        // small commands the tests send).
        std::size_t pos = 0;
        while ((pos = in.find("\r\n", 0)) != std::string::npos && in[0] == '*') {
          const std::size_t end = resp_command_end(in);
          if (end == std::string::npos) break;
          const std::string command = in.substr(0, end);
          in.erase(0, end);
          const bool slots = command.find("SLOTS") != std::string::npos;
          const std::string reply = slots ? slots_reply() : answer_;
          if (!slots) ++commands_;
          (void)::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
          if (hang_up_ && !slots) {
            ::shutdown(c, SHUT_RDWR);
            break;
          }
        }
      }
      ::close(c);
    }
  }

  [[nodiscard]] std::string slots_reply() const {
    if (!slots_.empty()) return slots_;
    return one_node_slots(port_);
  }

  std::string answer_;
  std::string slots_;
  bool hang_up_ = false;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> commands_{0};
  std::thread thread_;
};

}  // namespace kvoffload::test
