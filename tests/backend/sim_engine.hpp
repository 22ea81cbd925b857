#pragma once

// An engine on the simulated device, for the CUDA backend's [sim] tests: a SimDevice, store
// jobs, a slow "forward pass" on a compute stream, and checks of what landed in the pool.

#include <cstdint>
#include <memory>

#include "backend/device_rig.hpp"
#include "kvoffload/job.hpp"
#include "kvoffload/testing/sim_device.hpp"

namespace kvtest {

std::shared_ptr<kvoffload::SimDevice> sim_with(std::uint64_t seed, int devices = 1,
                                               int delay_us = 30, bool map_host = true);

/// One store job of `n` GPU blocks of group 0 (f = 1) from GPU block `first_block` into host
/// blocks first_host..first_host+n-1.
kvoffload::TransferJob store_job(kvoffload::JobId id, std::int64_t first_block, std::int64_t n,
                                 std::int64_t first_host = 0);

/// The engine's forward pass on `stream`: writes `value` into blocks [first, first + n) of
/// tensors 0 and 1, slowly (a chunk at a time), so an unordered reader sees torn data. With
/// write false it only reads them (for as long).
void forward_pass(kvoffload::SimDevice& sim, kvoffload::StreamHandle stream, DeviceRig& rig,
                  std::int64_t first, std::int64_t n, std::uint8_t value, bool write = true);

/// Whether host blocks first_host..first_host+n-1 hold `value` in tensors 0 and 1's rows.
bool host_blocks_hold(const DeviceRig& rig, std::int64_t n, std::uint8_t value,
                      std::int64_t first_host = 0);

}  // namespace kvtest
