#pragma once

// For the [cluster] tests: the Valkey cluster ctest starts (scripts/valkey-cluster, fixture
// valkey_cluster), valkey-cli against it, and a fake RESP server for bad network input.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>

#include "kvoffload/cluster_client.hpp"

namespace kvoffload::test {

inline constexpr int kClusterPort = KVOFFLOAD_TEST_CLUSTER_PORT;

inline std::string cluster_seed() {
  return "127.0.0.1:" + std::to_string(kClusterPort);
}

inline ClusterClientConfig cluster_config() {
  ClusterClientConfig c;
  c.seeds = parse_cluster_nodes(cluster_seed(), "test");
  return c;
}

/// Runs a shell command, returning its standard output (throws if it cannot start).
inline std::string shell(const std::string& command) {
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) throw std::runtime_error("popen failed: " + command);
  std::string out;
  std::array<char, 4096> buf{};
  std::size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  pclose(p);
  return out;
}

/// valkey-cli against node `port` (the cluster's first node by default), output trimmed.
inline std::string cli(const std::string& args, int port = kClusterPort) {
  std::string out = shell("valkey-cli -p " + std::to_string(port) + " " + args + " 2>&1");
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

/// scripts/valkey-cluster with the tests' state directory.
inline int cluster_script(const std::string& args) {
  const std::string cmd = std::string("KVOFFLOAD_VALKEY_DIR=") + KVOFFLOAD_TEST_CLUSTER_DIR +
                          " KVOFFLOAD_VALKEY_PORT=" + std::to_string(kClusterPort) + " " +
                          KVOFFLOAD_SOURCE_DIR + "/scripts/valkey-cluster " + args + " > /dev/null";
  return std::system(cmd.c_str());
}

/// The pid of node i (0-based) of the tests' cluster.
inline int cluster_node_pid(int i) {
  std::ifstream f(std::string(KVOFFLOAD_TEST_CLUSTER_DIR) + "/node-" + std::to_string(i) + ".pid");
  int pid = 0;
  f >> pid;
  return pid;
}

/// A one-connection-at-a-time RESP server on a loopback port: CLUSTER SLOTS gets a map giving
/// it every slot; any other command gets `answer` (raw bytes, whatever a test needs: a
/// truncated reply, a wrong type, a huge length; "PORT" in it becomes the server's port).
/// Stops in its destructor.
class FakeRespServer {
 public:
  explicit FakeRespServer(std::string answer) : answer_(std::move(answer)) {
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
          const std::size_t end = command_end(in);
          if (end == std::string::npos) break;
          const std::string command = in.substr(0, end);
          in.erase(0, end);
          const std::string reply =
              command.find("SLOTS") != std::string::npos ? slots_reply() : answer_;
          if (command.find("SLOTS") == std::string::npos) ++commands_;
          (void)::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
        }
      }
      ::close(c);
    }
  }

  /// The end of the first complete RESP array of bulk strings in `in`, or npos.
  static std::size_t command_end(const std::string& in) {
    std::size_t p = in.find("\r\n");
    if (p == std::string::npos) return std::string::npos;
    const long argc = std::stol(in.substr(1, p - 1));
    p += 2;
    for (long i = 0; i < argc; ++i) {
      const std::size_t e = in.find("\r\n", p);
      if (e == std::string::npos || in[p] != '$') return std::string::npos;
      const std::size_t len = std::stoul(in.substr(p + 1, e - p - 1));
      p = e + 2 + len + 2;
      if (p > in.size()) return std::string::npos;
    }
    return p;
  }

  [[nodiscard]] std::string slots_reply() const {
    const std::string port = std::to_string(port_);
    return "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:" + port + "\r\n";
  }

  std::string answer_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> commands_{0};
  std::thread thread_;
};

}  // namespace kvoffload::test
