#include "backend/sim_engine.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <catch2/catch_test_macros.hpp>

namespace kvtest {

using namespace kvoffload;

std::shared_ptr<SimDevice> sim_with(std::uint64_t seed, int devices, int delay_us, bool map_host) {
  SimConfig c;
  c.seed = seed;
  c.devices = devices;
  c.max_delay_us = delay_us;
  c.map_host_memory = map_host;
  return std::make_shared<SimDevice>(c);
}

TransferJob store_job(JobId id, std::int64_t first_block, std::int64_t n, std::int64_t first_host) {
  TransferJob job;
  job.id = id;
  job.gpu.group_sizes = {n, 0};
  job.gpu.block_indices = {0, 0};
  for (std::int64_t i = 0; i < n; ++i) {
    job.gpu.block_ids.push_back(static_cast<GpuBlockId>(first_block + i));
    job.keys.push_back(Key{BlockHash::from_hex("aa"), 0});
    job.host_block_ids.push_back(static_cast<HostBlockId>(first_host + i));
  }
  return job;
}

void forward_pass(SimDevice& sim, StreamHandle stream, DeviceRig& rig, std::int64_t first,
                  std::int64_t n, std::uint8_t value, bool write) {
  std::vector<SimAccess> acc;
  for (std::size_t t = 0; t < 2; ++t) {
    const auto b = reinterpret_cast<std::uintptr_t>(rig.device[t]) +
                   static_cast<std::uintptr_t>(first * rig.page);
    acc.push_back({b, b + static_cast<std::uintptr_t>(n * rig.page), write});
  }
  void* t0 = rig.device[0];
  void* t1 = rig.device[1];
  const std::int64_t page = rig.page;
  REQUIRE(sim.launch(stream, "forward pass", acc, [=] {
    for (void* t : {t0, t1}) {
      auto* p = static_cast<std::uint8_t*>(t) + first * page;
      for (std::int64_t i = 0; i < n * page; i += 64) {
        if (write) {
          std::memset(p + i, value,
                      static_cast<std::size_t>(std::min<std::int64_t>(64, n * page - i)));
        }
        if (i % 1024 == 0) std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }) == dev::ok);
}

bool host_blocks_hold(const DeviceRig& rig, std::int64_t n, std::uint8_t value,
                      std::int64_t first_host) {
  const auto pool = rig.pool();
  for (std::int64_t h = first_host; h < first_host + n; ++h) {
    const auto* b = pool.data() + h * rig.region.block_stride_bytes;
    for (std::int64_t i = 0; i < 2 * rig.page; ++i) {
      if (b[i] != value) return false;
    }
  }
  return true;
}

}  // namespace kvtest
