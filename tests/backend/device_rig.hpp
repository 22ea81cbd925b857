#pragma once

// A KV cache on a DeviceRuntime (the simulated device or a real GPU): four "device" tensors in
// two groups, a host mirror of their bytes, and a pinned, mapped host pool. Every transfer is
// checked against the CopyPlanner run with memcpy over the mirror (an independent oracle).

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "kvoffload/copy_planner.hpp"
#include "kvoffload/device_runtime.hpp"
#include "kvoffload/job.hpp"
#include "kvoffload/kv_layout.hpp"

namespace kvtest {

class DeviceRig {
 public:
  DeviceRig(std::shared_ptr<kvoffload::DeviceRuntime> rt, std::int64_t f, std::int64_t page,
            std::int64_t blocks, std::int64_t host_blocks);
  ~DeviceRig();
  DeviceRig(const DeviceRig&) = delete;
  DeviceRig& operator=(const DeviceRig&) = delete;

  /// Tensor t's bytes as the device holds them now.
  [[nodiscard]] std::vector<std::uint8_t> read(std::size_t t) const;
  /// The pool's bytes now.
  [[nodiscard]] std::vector<std::uint8_t> pool() const;
  /// What the pool holds after `jobs` are stored from the mirror onto `before` (the oracle).
  [[nodiscard]] std::vector<std::uint8_t> expected_pool(
      const std::vector<kvoffload::TransferJob>& jobs, std::vector<std::uint8_t> before) const;
  /// A random job over two groups: each group up to 3f GPU blocks from a random sub-block,
  /// taking block ids from `gpu` and host blocks from `host`.
  static kvoffload::TransferJob random_job(kvoffload::JobId id, std::int64_t f, std::mt19937& rng,
                                           std::vector<kvoffload::GpuBlockId>& gpu,
                                           std::vector<kvoffload::HostBlockId>& host);

  std::shared_ptr<kvoffload::DeviceRuntime> rt;
  std::int64_t page, blocks;
  std::vector<void*> device;                      // per tensor
  std::vector<std::vector<std::uint8_t>> mirror;  // per tensor, the bytes written at setup
  std::unique_ptr<kvoffload::KvLayout> layout;
  void* pool_memory = nullptr;
  kvoffload::HostRegion region{};
  std::size_t pool_bytes = 0;
};

/// Whether two byte vectors are equal; names the first difference on stderr (large vectors
/// are not printed whole).
bool same_bytes(const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want);

/// The pattern byte i of tensor t starts with.
inline std::uint8_t initial_byte(std::size_t t, std::size_t i) {
  return static_cast<std::uint8_t>((i * 7 + t * 13) ^ (i >> 9));
}

}  // namespace kvtest
