#pragma once

// A fresh directory under the system's temporary directory, removed at the end of the test.

#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>

namespace kvtest {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "kvoffload-test") {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() /
           (prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace kvtest
