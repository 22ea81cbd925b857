// Ordering the simulated device must be able to see (issue 26's blind spots): a batch copy's
// source order, stores spread over several streams after one forward pass, a compute stream
// set from a thread on another device, and the device-table path behind a compute stream.
// Each test passes with the backend as it is and fails under the mutation named in it.

#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "backend/device_rig.hpp"
#include "backend/sim_engine.hpp"
#include "kvoffload/cuda_backend.hpp"
#include "kvoffload/testing/sim_device.hpp"
#include "kvoffload/transfer_engine.hpp"
#include "testing/sim_device/sim_device_state.hpp"

using namespace kvoffload;
using Catch::Matchers::ContainsSubstring;
using kvtest::DeviceRig;
using kvtest::forward_pass;
using kvtest::host_blocks_hold;
using kvtest::sim_with;
using kvtest::store_job;
using namespace std::chrono_literals;

namespace {

std::vector<std::string> settled_violations(SimDevice& sim) {
  REQUIRE(sim.device_synchronize() == dev::ok);  // everything has run and been checked
  auto v = sim.violations();
  for (const auto& line : v) UNSCOPED_INFO(line);
  return v;
}

}  // namespace

TEST_CASE("sim: a batch copy with source order any may read before earlier work on its stream",
          "[sim][ordering]") {
  const bool in_order = GENERATE(true, false);
  const bool host_waited = GENERATE(false, true);
  INFO("source in stream order " << in_order << ", host waited " << host_waited);
  auto sim = sim_with(41, 1, 5);
  constexpr std::size_t kBytes = 64 << 10;
  void* d = nullptr;
  void* h = nullptr;
  REQUIRE(sim->malloc_device(&d, kBytes) == dev::ok);
  REQUIRE(sim->malloc_host(&h, kBytes) == dev::ok);
  StreamHandle s = 0;
  REQUIRE(sim->stream_create(0, &s) == dev::ok);
  const auto b = reinterpret_cast<std::uintptr_t>(d);
  REQUIRE(sim->launch(s, "forward pass", {{b, b + kBytes, true}},
                      [d] { std::memset(d, 0x5a, kBytes); }) == dev::ok);
  if (host_waited) REQUIRE(sim->stream_synchronize(s) == dev::ok);
  const CopyDescriptor copy{b, reinterpret_cast<std::uintptr_t>(h), kBytes};
  std::size_t fail = 0;
  REQUIRE(sim->memcpy_batch_async(&copy, 1, in_order, s, &fail) == dev::ok);
  const auto v = settled_violations(*sim);
  if (in_order || host_waited) {
    CHECK(v.empty());
  } else {
    REQUIRE_FALSE(v.empty());  // CUDA may read the source at the call, before the pass ran
    CHECK_THAT(v.front(), ContainsSubstring("source order any"));
  }
  REQUIRE(sim->stream_destroy(s) == dev::ok);
  REQUIRE(sim->free_device(d) == dev::ok);
  REQUIRE(sim->free_host(h) == dev::ok);
}

// Mutation caught: the compute wait attached to the first store stream only.
TEST_CASE("sim: stores after one forward pass wait for it on every stream they land on",
          "[sim][cuda_backend][ordering]") {
  const CopyMode mode =
      GENERATE(CopyMode::batch, CopyMode::memcpy, CopyMode::kernel, CopyMode::staged);
  auto sim = sim_with(42, 1, 5);
  DeviceRig rig(sim, 1, 4096, 40, 32);
  StreamHandle compute = 0;
  REQUIRE(sim->stream_create(0, &compute) == dev::ok);
  CudaBackendConfig c;
  c.mode = mode;
  c.store_streams = 3;
  c.staged_min_pieces = 1;
  c.compute_stream = compute;
  c.host_base = rig.region.base;
  c.host_bytes = rig.pool_bytes;
  {
    TransferEngine engine(*rig.layout, rig.region, std::make_unique<CudaBackend>(c, sim));
    forward_pass(*sim, compute, rig, 1, 24, 0xab);
    // Three stores of that pass's blocks: one on each store stream.
    for (JobId j = 0; j < 3; ++j) engine.submit_store(store_job(j + 1, 1 + 8 * j, 8, 8 * j));
    const std::vector<JobId> ids{1, 2, 3};
    engine.wait(ids);
    const auto done = engine.get_finished();
    REQUIRE(done.size() == 3);
    for (const auto& d : done) CHECK(d.ok);
    for (std::int64_t j = 0; j < 3; ++j) {
      INFO("store " << j + 1);
      CHECK(host_blocks_hold(rig, 8, 0xab, 8 * j));
    }
  }
  CHECK(settled_violations(*sim).empty());
  REQUIRE(sim->stream_destroy(compute) == dev::ok);
}

// Mutation caught: set_compute_stream creating its event without switching to the backend's
// device (the event then belongs to the caller's device 0).
TEST_CASE("sim: a compute stream set from a thread on another device orders the stores",
          "[sim][cuda_backend][ordering][devices]") {
  auto sim = sim_with(43, 2, 5);
  REQUIRE(sim->set_device(1) == dev::ok);
  DeviceRig rig(sim, 1, 4096, 32, 16);  // memory and streams on device 1
  StreamHandle compute = 0;
  REQUIRE(sim->stream_create(0, &compute) == dev::ok);
  REQUIRE(sim->set_device(0) == dev::ok);  // the engine thread's current device is 0
  CudaBackendConfig c;
  c.device = 1;
  c.mode = GENERATE(CopyMode::batch, CopyMode::kernel);
  c.host_base = rig.region.base;
  c.host_bytes = rig.pool_bytes;
  auto owned = std::make_unique<CudaBackend>(c, sim);
  CudaBackend& backend = *owned;
  {
    TransferEngine engine(*rig.layout, rig.region, std::move(owned));
    backend.set_compute_stream(compute);  // from device 0's thread
    forward_pass(*sim, compute, rig, 1, 8, 0x3c);
    engine.submit_store(store_job(1, 1, 8));
    const std::vector<JobId> ids{1};
    engine.wait(ids);
    const auto done = engine.get_finished();
    REQUIRE(done.size() == 1);
    CHECK(done[0].ok);
    CHECK(host_blocks_hold(rig, 8, 0x3c));
  }
  CHECK(settled_violations(*sim).empty());
  REQUIRE(sim->set_device(1) == dev::ok);
  REQUIRE(sim->stream_destroy(compute) == dev::ok);
}

// Mutation caught: the device-table path not waiting for the compute stream before the
// compaction reads the table.
TEST_CASE("sim: the device-table path reads a table the engine writes on its compute stream",
          "[sim][cuda_backend][ordering][compaction]") {
  auto sim = sim_with(44, 1, 5);
  DeviceRig rig(sim, 4, 512, 64, 16);
  StreamHandle compute = 0;
  REQUIRE(sim->stream_create(0, &compute) == dev::ok);
  CudaBackendConfig c;
  c.compute_stream = compute;
  c.host_base = rig.region.base;
  c.host_bytes = rig.pool_bytes;
  CudaBackend backend(c, sim);
  // Group 0: four blocks; group 1 (a window): two null sub-blocks, then two real ids.
  TransferJob job;
  job.id = 51;
  job.gpu = {{5, 6, 7, 8, 20, 21}, {4, 2}, {0, 2}};
  job.keys = {Key{BlockHash::from_hex("01"), 0}, Key{BlockHash::from_hex("02"), 1}};
  job.host_block_ids = {3, 9};
  const std::vector<std::int32_t> ids{5, 6, 7, 8, 0, 0, 20, 21};
  const std::vector<std::int64_t> offsets{0, 4, 8};
  void* table = nullptr;
  REQUIRE(sim->malloc_device(&table, ids.size() * 4) == dev::ok);  // garbage until written
  const auto t = reinterpret_cast<std::uintptr_t>(table);
  REQUIRE(sim->launch(compute, "block table update", {{t, t + ids.size() * 4, true}}, [=] {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::memcpy(table, ids.data(), ids.size() * 4);
  }) == dev::ok);
  const auto before = rig.pool();
  const Ticket ticket =
      backend.submit_device_table(job, JobKind::store, *rig.layout, rig.region,
                                  static_cast<const std::int32_t*>(table), offsets);
  backend.wait(ticket);
  std::vector<BackendResult> done;
  backend.poll(done);
  REQUIRE(done.size() == 1);
  CHECK(done[0].ok);
  CHECK(kvtest::same_bytes(rig.pool(), rig.expected_pool({job}, before)));
  CHECK(settled_violations(*sim).empty());
  REQUIRE(sim->free_device(table) == dev::ok);
  REQUIRE(sim->stream_destroy(compute) == dev::ok);
}

// Mutation caught: set_compute_stream forgetting the stream it switches away from.
TEST_CASE("sim: after a compute stream switch, jobs still wait for the old stream's work",
          "[sim][cuda_backend][ordering]") {
  // A deferred store of the pass on A started after the switch to B (whichever order the
  // engine switches and starts its deferred stores in), or a load overwriting blocks a pass
  // on A still reads.
  enum class Case { switch_then_start, start_then_switch, load };
  const Case what = GENERATE(Case::switch_then_start, Case::start_then_switch, Case::load);
  const bool load = what == Case::load;
  const bool switch_before_start = what == Case::switch_then_start;
  INFO("case " << static_cast<int>(what));
  auto sim = sim_with(45, 1, 5);
  DeviceRig rig(sim, 1, 4096, 32, 16);
  StreamHandle a = 0, b = 0;
  REQUIRE(sim->stream_create(0, &a) == dev::ok);
  REQUIRE(sim->stream_create(0, &b) == dev::ok);
  CudaBackendConfig c;
  c.mode = GENERATE(CopyMode::batch, CopyMode::kernel);
  c.compute_stream = a;
  c.host_base = rig.region.base;
  c.host_bytes = rig.pool_bytes;
  auto owned = std::make_unique<CudaBackend>(c, sim);
  CudaBackend& backend = *owned;
  {
    TransferEngineConfig ec;
    ec.defer_stores = true;
    TransferEngine engine(*rig.layout, rig.region, std::move(owned), ec);
    forward_pass(*sim, a, rig, 1, 8, 0xab, /*write=*/!load);
    TransferJob job = store_job(1, 1, 8);
    if (load) {
      job.kind = JobKind::load;
      backend.set_compute_stream(b);
      engine.submit_load(job);
    } else {
      engine.submit_store(job);  // deferred to the next step
      if (switch_before_start) backend.set_compute_stream(b);
      engine.start_step();
      if (!switch_before_start) backend.set_compute_stream(b);
    }
    const std::vector<JobId> ids{1};
    engine.wait(ids);
    const auto done = engine.get_finished();
    REQUIRE(done.size() == 1);
    CHECK(done[0].ok);
    if (!load) CHECK(host_blocks_hold(rig, 8, 0xab));
  }
  CHECK(settled_violations(*sim).empty());
  REQUIRE(sim->stream_destroy(a) == dev::ok);
  REQUIRE(sim->stream_destroy(b) == dev::ok);
}

TEST_CASE("sim: the copy engine serves the waiting operation of the highest stream priority",
          "[sim][ordering]") {
  // The timing model behind loads-first (issue 30): the backend's load streams have CUDA's
  // greatest priority (the lowest number). Fails if the gate admits in arrival order.
  sim::ExecGate gate;
  gate.enter(0);  // a store's copy is running
  std::vector<int> order;
  std::mutex order_mutex;
  auto op = [&](int priority) {
    sim::ExecGate::Hold hold(gate, priority);
    std::lock_guard lock(order_mutex);
    order.push_back(priority);
  };
  std::thread store(op, 0);  // queued first
  for (int i = 0; i < 2000 && gate.waiting() < 1; ++i) std::this_thread::sleep_for(1ms);
  std::thread load(op, -5);
  for (int i = 0; i < 2000 && gate.waiting() < 2; ++i) std::this_thread::sleep_for(1ms);
  REQUIRE(gate.waiting() == 2);
  gate.leave();
  store.join();
  load.join();
  CHECK(order == std::vector<int>{-5, 0});
}
