#pragma once

// Filling a HostBlockManager the way an engine's steps do (a request's worth of keys a call,
// events taken after each), for the benchmarks that measure what a full manager costs.

#include <cstdint>
#include <functional>
#include <vector>

#include "kvoffload/host_block_manager.hpp"

namespace kvbench {

class ManagerFiller {
 public:
  static constexpr std::size_t kBatch = 64;  // keys per prepare_store, like a request's blocks

  ManagerFiller();
  /// Keys come as requests of kRequest blocks, as the scheduler tells policy reuse
  /// (AccessContext: a new request each, a clock 10 ms a request; its lookup's touch of the
  /// keys before the store, its touch of the blocks after).
  bool requests = false;
  static constexpr std::size_t kRequest = 16;
  /// Stores key_of(i) for i in [first, last) into `m`. Throws runtime_error naming `what` when
  /// the manager has no room for a call's keys.
  void store(kvoffload::HostBlockManager& m, std::uint64_t first, std::uint64_t last,
             const std::function<kvoffload::Key(std::uint64_t)>& key_of, const char* what);

 private:
  std::vector<kvoffload::Key> batch_;
  kvoffload::PreparedStore prepared_;
  std::uint64_t request_ = 0;
};

}  // namespace kvbench
