// The CUDA backend's lifetimes and limits on the simulated device, each a bug a review found
// (issue 26): a submission that throws half-way, pinned buffers of jobs never polled, plans
// that disagree with themselves, launch shapes and compute streams of another device. (The
// contexts a device switch creates and the compactor's shared temporary storage have bodies
// that also run on a GPU: cuda_backend_test.cpp.)

#include <cstring>
#include <numeric>
#include <random>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "backend/device_rig.hpp"
#include "backend/sim_engine.hpp"
#include "kvoffload/cuda_backend.hpp"
#include "kvoffload/error.hpp"
#include "kvoffload/testing/sim_device.hpp"
#include "kvoffload/transfer_engine.hpp"

using namespace kvoffload;
using Catch::Matchers::ContainsSubstring;
using kvtest::DeviceRig;
using kvtest::sim_with;

namespace {

CopyPlan one_store(const DeviceRig& rig, JobId job, std::uint64_t bytes = 1024) {
  CopyPlan plan;
  plan.job = job;
  plan.kind = JobKind::store;
  plan.descriptors = {{reinterpret_cast<std::uintptr_t>(rig.device[0]), rig.region.base, bytes}};
  plan.total_bytes = bytes;
  return plan;
}

CudaBackendConfig mapped(const DeviceRig& rig, CopyMode mode) {
  CudaBackendConfig c;
  c.mode = mode;
  c.host_base = rig.region.base;
  c.host_bytes = rig.pool_bytes;
  return c;
}

}  // namespace

TEST_CASE("sim: a submission that throws after its job is queued reports the job failed",
          "[sim][cuda_backend][errors]") {
  auto sim = sim_with(31, 1, 10);
  DeviceRig rig(sim, 1, 1024, 16, 16);
  CudaBackend backend(mapped(rig, CopyMode::batch), sim);
  // The batch copy is refused, and formatting its message runs out of memory: the
  // submission throws with the job already queued and no completion event recorded. submit
  // catches it: the job is reported once, failed, and the caller sees no exception.
  sim->inject_failure("memcpy_batch_async", dev::invalid_value);
  sim->inject_throw_in_describe();
  CHECK_NOTHROW(backend.submit(one_store(rig, 7)));
  backend.wait(backend.submit(one_store(rig, 8)));
  std::vector<BackendResult> done;
  backend.poll(done);
  REQUIRE(done.size() == 2);
  CHECK(done[0].job == 7);
  CHECK_FALSE(done[0].ok);  // never "ok" with nothing copied
  CHECK(done[0].bytes == 0);
  CHECK_THAT(done[0].error, ContainsSubstring("job 7: submission did not complete"));
  CHECK_THAT(done[0].error, ContainsSubstring("bad_alloc"));
  CHECK(done[1].ok);
  REQUIRE(sim->device_synchronize() == dev::ok);
  CHECK(sim->violations().empty());
}

TEST_CASE("sim: a backend destroyed with jobs nobody polled frees what they held",
          "[sim][cuda_backend][leaks]") {
  auto sim = sim_with(32, 1, 10);
  DeviceRig rig(sim, 1, 1024, 16, 16);
  const std::size_t before = sim->live_allocations();
  {
    CudaBackendConfig c = mapped(rig, CopyMode::kernel);
    c.ring_bytes = 64;  // smaller than one job's piece array: each runs on the copy engines
    CudaBackend backend(c, sim);
    CopyPlan plan = one_store(rig, 1, 256);
    for (std::uint64_t i = 1; i < 4; ++i) {
      plan.descriptors.push_back(
          {plan.descriptors[0].src + 256 * i, plan.descriptors[0].dst + 256 * i, 256});
      plan.total_bytes += 256;
    }
    backend.wait(backend.submit(plan));
    plan.job = 2;
    backend.submit(plan);
    CHECK(backend.stats().ring_fell_back == 2);
  }  // never polled
  REQUIRE(sim->device_synchronize() == dev::ok);
  CHECK(sim->live_allocations() == before);
  CHECK(sim->live_events() == 0);
  CHECK(sim->violations().empty());
}

TEST_CASE("sim: a plan whose total_bytes disagrees with its copies is refused at submit",
          "[sim][cuda_backend][errors]") {
  auto sim = sim_with(34, 1, 5);
  DeviceRig rig(sim, 1, 1024, 32, 32);
  CudaBackendConfig c = mapped(rig, CopyMode::staged);
  c.staged_min_pieces = 1;
  CudaBackend backend(c, sim);
  CopyPlan plan = one_store(rig, 3);
  plan.descriptors.push_back({plan.descriptors[0].src + 1024, plan.descriptors[0].dst + 1024, 24});
  plan.total_bytes = 1024;  // the copies add up to 1048
  CHECK_THROWS_WITH(
      backend.submit(plan),
      ContainsSubstring("job 3: total_bytes is 1024 but its 2 copies add up to 1048"));
  std::vector<BackendResult> done;
  backend.poll(done);
  CHECK(done.empty());  // nothing was queued
  // Odd piece sizes, staged at 16-byte boundaries, land exactly.
  std::vector<std::uint8_t> want = rig.pool();
  plan.descriptors.clear();
  plan.total_bytes = 0;
  std::uint64_t at = 0;
  for (const std::uint64_t bytes : {100, 1000, 17, 3000, 1}) {
    plan.descriptors.push_back({reinterpret_cast<std::uintptr_t>(rig.device[0]) + at + 5,
                                rig.region.base + 2 * at + 3, bytes});
    std::memcpy(want.data() + 2 * at + 3, rig.mirror[0].data() + at + 5, bytes);
    plan.total_bytes += bytes;
    at += 4096;
  }
  backend.wait(backend.submit(plan));
  backend.poll(done);
  REQUIRE(done.size() == 1);
  CHECK(done[0].ok);
  CHECK(backend.stats().jobs_staged == 1);
  CHECK(kvtest::same_bytes(rig.pool(), want));
  REQUIRE(sim->device_synchronize() == dev::ok);
  CHECK(sim->violations().empty());
}

TEST_CASE("sim: kernel launch shapes are bounded so the warp count cannot wrap",
          "[sim][cuda_backend][errors]") {
  auto sim = sim_with(35, 1, 0);
  CudaBackendConfig c;
  c.kernel_threads = 1024;
  c.kernel_ctas = 1 << 27;  // 2^27 CTAs of 32 warps: 2^32 warps, 0 in 32 bits
  CHECK_THROWS_WITH(CudaBackend(c, sim), ContainsSubstring("kernel_ctas is 134217728"));
  c.kernel_ctas = 0;
  CHECK_THROWS_WITH(CudaBackend(c, sim), ContainsSubstring("kernel_ctas"));
  c.kernel_ctas = 65535;
  CHECK_NOTHROW(CudaBackend(c, sim));
  c.kernel_threads = 48;
  CHECK_THROWS_WITH(CudaBackend(c, sim), ContainsSubstring("kernel_threads is 48"));
}

TEST_CASE("sim: compute streams of another device are refused, once and clearly",
          "[sim][cuda_backend][devices]") {
  auto sim = sim_with(36, 2, 0);
  StreamHandle on0 = 0;
  REQUIRE(sim->stream_create(0, &on0) == dev::ok);
  CudaBackendConfig c;
  c.device = 1;
  CudaBackend backend(c, sim);
  CHECK_THROWS_WITH(backend.set_compute_stream(on0),
                    ContainsSubstring("belongs to device 0, but the backend is on device 1"));
  c.compute_stream = on0;
  CHECK_THROWS_AS(CudaBackend(c, sim), invalid_argument);
  REQUIRE(sim->stream_destroy(on0) == dev::ok);
}
