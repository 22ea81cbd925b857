#pragma once

// For the disk tier's tests: a host pool in ordinary memory whose blocks are filled and checked
// from seeds, and distinct 16-byte keys.

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kvoffload/error.hpp"
#include "kvoffload/job.hpp"
#include "kvoffload/types.hpp"

namespace kvtest {

/// `blocks` host blocks of `block_bytes` each, in ordinary memory.
class TierPool {
 public:
  TierPool(std::int64_t blocks, std::uint64_t block_bytes)
      : block_bytes_(block_bytes), bytes_(static_cast<std::size_t>(blocks) * block_bytes) {}
  /// Throws kvoffload::invalid_argument past the pool (what a tier job naming it must get).
  std::span<std::byte> block(kvoffload::HostBlockId id) {
    if (id < 0 || static_cast<std::size_t>(id + 1) * block_bytes_ > bytes_.size()) {
      throw kvoffload::invalid_argument("test pool: host block " + std::to_string(id) +
                                        " is out of range");
    }
    return {bytes_.data() + static_cast<std::size_t>(id) * block_bytes_, block_bytes_};
  }
  void fill(kvoffload::HostBlockId id, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (std::byte& b : block(id)) b = static_cast<std::byte>(rng());
  }
  /// Whether block `id` holds what fill(id, seed) wrote.
  bool holds(kvoffload::HostBlockId id, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (const std::byte b : block(id)) {
      if (b != static_cast<std::byte>(rng())) return false;
    }
    return true;
  }

 private:
  std::uint64_t block_bytes_;
  std::vector<std::byte> bytes_;
};

/// Key i: 16 bytes distinct for every i, group i % 2.
inline kvoffload::Key tier_key(int i) {
  std::uint8_t b[16] = {};
  for (int k = 0; k < 16; ++k) b[k] = static_cast<std::uint8_t>(i * 37 + k * 11 + 3);
  return kvoffload::Key{kvoffload::BlockHash::from_bytes(b), static_cast<std::uint32_t>(i % 2)};
}

/// A disk tier job of keys first..first+n-1 (tier_key) between host blocks host0.. and slots
/// slot0..
inline kvoffload::TierJob job_of(kvoffload::JobId id, kvoffload::JobKind kind, int first, int n,
                                 kvoffload::HostBlockId host0, std::int64_t slot0) {
  kvoffload::TierJob j;
  j.id = id;
  j.kind = kind;
  for (int i = 0; i < n; ++i) {
    j.keys.push_back(tier_key(first + i));
    j.host_block_ids.push_back(host0 + i);
    j.slots.push_back(slot0 + i);
  }
  return j;
}

}  // namespace kvtest
