// The staged path (issue 49, item 7) on the simulated device: each job's host runs lie at
// 16-byte boundaries of its own slice of the staging ring, so jobs staged at once on different
// streams never touch each other's staging, whatever their pieces' sizes.

#include <cstring>
#include <vector>

#include <catch2/catch_test_macros.hpp>

#include "backend/device_rig.hpp"
#include "backend/sim_engine.hpp"
#include "kvoffload/cuda_backend.hpp"
#include "kvoffload/testing/sim_device.hpp"

using namespace kvoffload;
using kvtest::DeviceRig;

// Mutation caught: a job's staging slice sized by its bytes alone (without each run's padding
// to 16 bytes): the slices of two jobs overlap and their gathers race.
TEST_CASE("sim: staged jobs of odd-sized pieces keep to their own staging",
          "[sim][cuda_backend][staged]") {
  auto sim = kvtest::sim_with(81, 1, 20);
  DeviceRig rig(sim, 1, 4096, 32, 16);
  CudaBackendConfig c;
  c.mode = CopyMode::staged;
  c.store_streams = 2;
  c.staging_bytes = 1 << 20;
  c.host_base = rig.region.base;
  c.host_bytes = rig.pool_bytes;
  CudaBackend backend(c, sim);
  constexpr std::uint64_t kPiece = 100;  // runs of 100 bytes: 12 bytes of padding each
  std::vector<Ticket> tickets;
  for (JobId job = 1; job <= 4; ++job) {
    CopyPlan plan;
    plan.job = job;
    plan.kind = JobKind::store;
    for (std::uint64_t i = 0; i < 16; ++i) {
      const std::uint64_t at = (job - 1) * 16 + i;
      plan.descriptors.push_back({reinterpret_cast<std::uintptr_t>(rig.device[0]) + at * 128,
                                  rig.region.base + at * 512, kPiece});
      plan.total_bytes += kPiece;
    }
    tickets.push_back(backend.submit(plan));
  }
  for (const Ticket t : tickets) backend.wait(t);
  std::vector<BackendResult> done;
  backend.poll(done);
  REQUIRE(done.size() == 4);
  for (const auto& d : done) CHECK(d.ok);
  CHECK(backend.stats().jobs_staged == 4);
  const auto pool = rig.pool();
  for (std::uint64_t at = 0; at < 64; ++at) {
    INFO("piece " << at);
    CHECK(std::memcmp(pool.data() + at * 512, rig.mirror[0].data() + at * 128, kPiece) == 0);
  }
  REQUIRE(sim->device_synchronize() == dev::ok);
  const auto v = sim->violations();
  for (const auto& line : v) UNSCOPED_INFO(line);
  CHECK(v.empty());
}
