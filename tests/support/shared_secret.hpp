#pragma once

// The fleet secret the tests' shared tiers use: a random one in a file of mode 0600, written
// once per test process (a file rather than the environment: setenv would race the threads
// of tiers already running).

#include <fcntl.h>
#include <unistd.h>

#include <random>
#include <stdexcept>
#include <string>

#include "kvoffload/tiers/tier_config.hpp"

namespace kvoffload::test {

/// The file's path; the file is removed when the process exits.
inline const std::string& shared_secret_file() {
  struct File {
    std::string path = "/tmp/kvoffload-test-secret-" + std::to_string(::getpid());
    File() {
      std::random_device rd;
      std::string secret;
      for (int i = 0; i < 8; ++i) secret += std::to_string(rd());
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0600);
      const bool ok = fd >= 0 && ::write(fd, secret.data(), secret.size()) ==
                                     static_cast<ssize_t>(secret.size());
      if (fd >= 0) ::close(fd);
      if (!ok) throw std::runtime_error("cannot write the test secret " + path);
    }
    ~File() { ::unlink(path.c_str()); }
    File(const File&) = delete;
    File& operator=(const File&) = delete;
  };
  static const File file;
  return file.path;
}

/// A shared tier's store on `nodes`, named `name`, keyed by the test secret.
inline SharedTierConfig shared_store(std::string nodes, std::string name) {
  SharedTierConfig c;
  c.nodes = std::move(nodes);
  c.name = std::move(name);
  c.secret_file = shared_secret_file();
  return c;
}

}  // namespace kvoffload::test
