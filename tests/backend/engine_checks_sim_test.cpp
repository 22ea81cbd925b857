// What the CUDA backend refuses of an engine's setup, on the simulated device (issue 49,
// items 3 and 9): jobs while the compute stream captures a CUDA graph (a wait would join the
// capture), and KV tensors that are not memory of the backend's device. Each test fails under
// the mutation named above it.

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "backend/device_rig.hpp"
#include "backend/sim_engine.hpp"
#include "kvoffload/cuda_backend.hpp"
#include "kvoffload/error.hpp"
#include "kvoffload/testing/sim_device.hpp"
#include "kvoffload/transfer_engine.hpp"
#include "kvoffload/worker.hpp"

using namespace kvoffload;
using Catch::Matchers::ContainsSubstring;
using kvtest::DeviceRig;
using kvtest::forward_pass;
using kvtest::host_blocks_hold;
using kvtest::sim_with;
using kvtest::store_job;

namespace {

std::vector<std::string> settled_violations(SimDevice& sim) {
  REQUIRE(sim.device_synchronize() == dev::ok);
  auto v = sim.violations();
  for (const auto& line : v) UNSCOPED_INFO(line);
  return v;
}

FinishedTransfer only_result(TransferEngine& engine, JobId id) {
  const std::vector<JobId> ids{id};
  engine.wait(ids);
  auto done = engine.get_finished();
  REQUIRE(done.size() == 1);
  REQUIRE(done[0].job == id);
  return done[0];
}

}  // namespace

// Mutation caught: submit without the capture check (the job's wait records an event on the
// capturing stream and joins the capture: the simulator reports it).
TEST_CASE("sim: a job submitted while the compute stream captures a graph is refused",
          "[sim][cuda_backend][capture]") {
  const CopyMode mode = GENERATE(CopyMode::batch, CopyMode::memcpy, CopyMode::kernel);
  const bool deferred = GENERATE(false, true);
  INFO("mode " << to_string(mode) << ", deferred " << deferred);
  auto sim = sim_with(71, 1, 5);
  DeviceRig rig(sim, 1, 4096, 32, 16);
  StreamHandle compute = 0;
  REQUIRE(sim->stream_create(0, &compute) == dev::ok);
  CudaBackendConfig c;
  c.mode = mode;
  c.compute_stream = compute;
  c.host_base = rig.region.base;
  c.host_bytes = rig.pool_bytes;
  auto owned = std::make_unique<CudaBackend>(c, sim);
  CudaBackend& backend = *owned;
  {
    TransferEngineConfig ec;
    ec.defer_stores = deferred;
    TransferEngine engine(*rig.layout, rig.region, std::move(owned), ec);
    forward_pass(*sim, compute, rig, 1, 8, 0x5e);
    REQUIRE(sim->stream_synchronize(compute) == dev::ok);
    const auto before = rig.pool();
    REQUIRE(sim->begin_capture(compute) == dev::ok);
    engine.submit_store(store_job(1, 1, 8));
    if (deferred) REQUIRE(sim->end_capture(compute) == dev::ok);  // refused all the same
    engine.start_step();
    const FinishedTransfer refused = only_result(engine, 1);
    CHECK_FALSE(refused.ok);
    CHECK_THAT(refused.error, ContainsSubstring("job 1: refused"));
    CHECK_THAT(refused.error, ContainsSubstring("capturing a CUDA graph"));
    CHECK(rig.pool() == before);  // nothing copied
    CHECK(backend.stats().refused_capturing == 1);
    if (!deferred) REQUIRE(sim->end_capture(compute) == dev::ok);
    // After the capture the same store runs.
    engine.submit_store(store_job(2, 1, 8));
    engine.start_step();
    CHECK(only_result(engine, 2).ok);
    CHECK(host_blocks_hold(rig, 8, 0x5e));
  }
  CHECK(settled_violations(*sim).empty());
  REQUIRE(sim->stream_destroy(compute) == dev::ok);
}

// Mutation caught: a mark taken during a capture (it has no event) given back to the spares as
// event 0 when its store is shed: every later mark and stream switch then fails to record.
TEST_CASE("sim: a store marked during a capture and dropped leaves marking intact",
          "[sim][cuda_backend][capture]") {
  auto sim = sim_with(77, 1, 5);
  DeviceRig rig(sim, 1, 4096, 32, 16);
  StreamHandle compute = 0;
  REQUIRE(sim->stream_create(0, &compute) == dev::ok);
  CudaBackendConfig c;
  c.mode = CopyMode::batch;
  c.compute_stream = compute;
  c.host_base = rig.region.base;
  c.host_bytes = rig.pool_bytes;
  {
    CudaBackend backend(c, sim);
    REQUIRE(sim->begin_capture(compute) == dev::ok);
    const ComputeMark during = backend.mark_compute();
    REQUIRE(during != 0);
    REQUIRE(sim->end_capture(compute) == dev::ok);
    backend.drop_mark(during);  // its store was shed
    for (int i = 0; i < 3; ++i) {
      const ComputeMark after = backend.mark_compute();
      CHECK(after != 0);
      backend.drop_mark(after);
    }
  }
  CHECK(settled_violations(*sim).empty());
  REQUIRE(sim->stream_destroy(compute) == dev::ok);
}

// A capture in global mode on another thread makes CUDA refuse event queries and synchronizes
// (cudaErrorStreamCaptureUnsupported, 900) while it lasts. Mutation caught: poll taking that
// for a failure (the job reported failed and its buffers released while its copies may run).
TEST_CASE("sim: a capture elsewhere refusing queries delays results, never fails them",
          "[sim][cuda_backend][capture]") {
  auto sim = sim_with(78, 1, 5);
  DeviceRig rig(sim, 1, 4096, 32, 16);
  CudaBackendConfig c;
  c.mode = CopyMode::kernel;
  c.host_base = rig.region.base;
  c.host_bytes = rig.pool_bytes;
  CudaBackend backend(c, sim);
  forward_pass(*sim, 0, rig, 1, 8, 0x4e);
  REQUIRE(sim->device_synchronize() == dev::ok);
  const CopyPlanner planner(*rig.layout, rig.region);
  CopyPlan plan;
  planner.plan(store_job(1, 1, 8), JobKind::store, plan);
  const Ticket t = backend.submit(plan);
  REQUIRE(sim->device_synchronize() == dev::ok);  // done, but CUDA will not say so yet
  std::vector<BackendResult> done;
  sim->inject_failure("event_query", 900);
  backend.poll(done);
  CHECK(done.empty());  // asked again later, not failed
  sim->inject_failure("event_synchronize", 900, 0);
  backend.wait(t);  // retried until the capture lets it through
  backend.poll(done);
  REQUIRE(done.size() == 1);
  CHECK(done[0].ok);
  CHECK(host_blocks_hold(rig, 8, 0x4e));
  CHECK(settled_violations(*sim).empty());
}

// Mutation caught: set_compute_stream recording an event on the old stream while it captures
// (later jobs wait for it and join the capture).
TEST_CASE("sim: switching away from a capturing compute stream joins no capture",
          "[sim][cuda_backend][capture]") {
  auto sim = sim_with(72, 1, 5);
  DeviceRig rig(sim, 1, 4096, 32, 16);
  StreamHandle a = 0, b = 0;
  REQUIRE(sim->stream_create(0, &a) == dev::ok);
  REQUIRE(sim->stream_create(0, &b) == dev::ok);
  CudaBackendConfig c;
  c.mode = CopyMode::batch;
  c.compute_stream = a;
  c.host_base = rig.region.base;
  c.host_bytes = rig.pool_bytes;
  auto owned = std::make_unique<CudaBackend>(c, sim);
  CudaBackend& backend = *owned;
  {
    TransferEngine engine(*rig.layout, rig.region, std::move(owned));
    // Work on the old stream before its capture, still running at the switch (other blocks:
    // its order cannot be kept without joining the capture, and nothing here reads them).
    forward_pass(*sim, a, rig, 17, 8, 0x33);
    REQUIRE(sim->begin_capture(a) == dev::ok);
    backend.set_compute_stream(b);
    forward_pass(*sim, b, rig, 1, 8, 0x17);
    engine.submit_store(store_job(1, 1, 8));
    CHECK(only_result(engine, 1).ok);
    CHECK(host_blocks_hold(rig, 8, 0x17));
    REQUIRE(sim->end_capture(a) == dev::ok);
  }
  CHECK(settled_violations(*sim).empty());
  REQUIRE(sim->stream_destroy(a) == dev::ok);
  REQUIRE(sim->stream_destroy(b) == dev::ok);
}

TEST_CASE("sim: loads that need no compute wait run during a capture",
          "[sim][cuda_backend][capture]") {
  auto sim = sim_with(73, 1, 5);
  DeviceRig rig(sim, 1, 4096, 32, 16);
  StreamHandle compute = 0;
  REQUIRE(sim->stream_create(0, &compute) == dev::ok);
  CudaBackendConfig c;
  c.mode = CopyMode::kernel;
  c.compute_stream = compute;
  c.loads_wait_for_compute = false;
  c.host_base = rig.region.base;
  c.host_bytes = rig.pool_bytes;
  {
    TransferEngine engine(*rig.layout, rig.region, std::make_unique<CudaBackend>(c, sim));
    REQUIRE(sim->begin_capture(compute) == dev::ok);
    TransferJob load = store_job(1, 1, 8);
    load.kind = JobKind::load;
    engine.submit_load(load);
    CHECK(only_result(engine, 1).ok);
    REQUIRE(sim->end_capture(compute) == dev::ok);
  }
  CHECK(settled_violations(*sim).empty());
  REQUIRE(sim->stream_destroy(compute) == dev::ok);
}

// Mutation caught: the Worker not calling check_tensors (the first job's kernel would read
// another device's memory, or host memory, and fault).
TEST_CASE("sim: KV tensors that are not the backend device's memory are refused by name",
          "[sim][cuda_backend][worker][devices]") {
  auto sim = sim_with(74, 2, 5);
  enum class Where { device1, host, straddling };
  const Where where = GENERATE(Where::device1, Where::host, Where::straddling);
  INFO("tensor " << static_cast<int>(where));
  void* own = nullptr;
  std::vector<std::uint8_t> host(std::size_t{16} * 512);
  std::uintptr_t base = 0;
  std::int64_t blocks = 16;
  if (where == Where::device1) {
    REQUIRE(sim->set_device(1) == dev::ok);
    REQUIRE(sim->malloc_device(&own, std::size_t{16} * 512) == dev::ok);
    REQUIRE(sim->set_device(0) == dev::ok);
    base = reinterpret_cast<std::uintptr_t>(own);
  } else if (where == Where::host) {
    base = reinterpret_cast<std::uintptr_t>(host.data());
  } else {  // device 0 memory, but the tensor claims more blocks than were allocated
    REQUIRE(sim->malloc_device(&own, std::size_t{16} * 512) == dev::ok);
    base = reinterpret_cast<std::uintptr_t>(own);
    blocks = 64;
  }
  WorkerConfig wc;
  wc.tensors = {{base, blocks, 512, 512}};
  wc.groups = {{{0, 512}}};
  wc.host_blocks = 4;
  wc.backend = BackendKind::cuda;
  wc.runtime = sim;
  wc.cuda_device = 0;
  try {
    Worker w(wc);
    FAIL("the worker accepted a KV tensor that is not device 0's memory");
  } catch (const invalid_argument& e) {
    const std::string what = e.what();
    CHECK_THAT(what, ContainsSubstring("KV tensor 0"));
    CHECK_THAT(what, ContainsSubstring(where == Where::device1 ? "is on device 1"
                                                               : "is not device memory"));
    CHECK_THAT(what, ContainsSubstring("backend is on device 0"));
  }
  if (own != nullptr) REQUIRE(sim->free_device(own) == dev::ok);
  // The same tensor on the right device is accepted (the check is not refusing everything).
  void* good = nullptr;
  REQUIRE(sim->malloc_device(&good, std::size_t{16} * 512) == dev::ok);
  wc.tensors = {{reinterpret_cast<std::uintptr_t>(good), 16, 512, 512}};
  { const Worker w(wc); }
  REQUIRE(sim->free_device(good) == dev::ok);
  CHECK(sim->violations().empty());
}

// Mutation caught: submit without its profiler range (docs/gpu.md promises NVTX ranges naming
// every submission).
TEST_CASE("sim: every submission is a profiler range named by its job", "[sim][cuda_backend]") {
  auto sim = sim_with(75, 1, 5);
  DeviceRig rig(sim, 1, 4096, 32, 16);
  CudaBackendConfig c;
  c.mode = GENERATE(CopyMode::batch, CopyMode::kernel);
  c.host_base = rig.region.base;
  c.host_bytes = rig.pool_bytes;
  {
    TransferEngine engine(*rig.layout, rig.region, std::make_unique<CudaBackend>(c, sim));
    engine.submit_store(store_job(4, 1, 8));
    CHECK(only_result(engine, 4).ok);
    TransferJob load = store_job(5, 9, 8);
    load.kind = JobKind::load;
    engine.submit_load(load);
    CHECK(only_result(engine, 5).ok);
  }
  const auto names = sim->ranges();
  CHECK(std::count(names.begin(), names.end(), "kvoffload store job 4") == 1);
  CHECK(std::count(names.begin(), names.end(), "kvoffload load job 5") == 1);
  CHECK(sim->open_ranges() == 0);
  CHECK(settled_violations(*sim).empty());
}

// Issue 49, item 10: the simulator's two-way model. With a link per direction a store and a
// load at once take about as long as one of them; with one copy engine, as long as both.
// Mutation caught: link_time putting every operation on one link.
TEST_CASE("sim: with a link per direction, a store and a load overlap", "[sim][calibrate]") {
  auto both_at_once = [](int links) {
    SimConfig sc;
    sc.max_delay_us = 0;
    sc.copy_gbps = 0.025;  // 1 MiB in 42 ms
    sc.links = links;
    auto sim = std::make_shared<SimDevice>(sc);
    constexpr std::size_t kBytes = 1 << 20;
    void *d = nullptr, *h = nullptr;
    REQUIRE(sim->malloc_device(&d, 2 * kBytes) == dev::ok);
    REQUIRE(sim->malloc_host(&h, 2 * kBytes) == dev::ok);
    StreamHandle up = 0, down = 0;
    REQUIRE(sim->stream_create(0, &up) == dev::ok);
    REQUIRE(sim->stream_create(0, &down) == dev::ok);
    const auto start = std::chrono::steady_clock::now();
    REQUIRE(sim->memcpy_async(d, h, kBytes, up) == dev::ok);
    REQUIRE(sim->memcpy_async(static_cast<char*>(h) + kBytes, static_cast<char*>(d) + kBytes,
                              kBytes, down) == dev::ok);
    REQUIRE(sim->device_synchronize() == dev::ok);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    REQUIRE(sim->stream_destroy(up) == dev::ok);
    REQUIRE(sim->stream_destroy(down) == dev::ok);
    REQUIRE(sim->free_device(d) == dev::ok);
    REQUIRE(sim->free_host(h) == dev::ok);
    return seconds;
  };
  const double one = both_at_once(1), two = both_at_once(2);
  INFO("one copy engine " << one << " s, a link per direction " << two << " s");
  CHECK(one >= 0.040);      // 2 x 21 ms, one after the other
  CHECK(two >= 0.020);      // each still takes its own time
  CHECK(two < 0.75 * one);  // but at once
}

// calibrate end to end on the simulator's two-way model (its choice itself is
// choose_calibration's, tested with exact numbers in copy_body_test.cpp): it measures every
// mode both ways, leaves no violation, and its thresholds are sizes it measured.
TEST_CASE("sim: calibrate runs under load both ways", "[sim][cuda_backend][calibrate]") {
  SimConfig sc;
  sc.seed = 76;
  sc.max_delay_us = 0;
  sc.copy_gbps = 1;
  sc.links = 2;
  sc.kernel_gbps = 0.5;
  sc.dma_op_us = 40;
  auto sim = std::make_shared<SimDevice>(sc);
  CalibrateOptions o;
  o.bytes = 256 << 10;
  o.max_piece = 64 << 10;
  o.reps = 1;
  const CudaBackendConfig c = calibrate(CudaBackendConfig{}, sim, o);
  for (const std::uint64_t t : {c.store_small_piece_bytes, c.load_small_piece_bytes}) {
    CHECK(t >= 4096);
    CHECK(t <= 128 << 10);
    CHECK((t & (t - 1)) == 0);
  }
  CHECK(c.staged_min_pieces <= 1);
  REQUIRE(sim->device_synchronize() == dev::ok);
  CHECK(sim->violations().empty());
  CHECK(sim->live_allocations() == 0);
}
