// A deferred store (the vLLM connector's mode: a step's stores start at the next start_step)
// waits for the engine's work queued when it was submitted (the forward pass whose KV it
// reads), marked then, and not for what the engine queues before start_step (issue 49, item 9).
// Each test fails under the mutation named above it.

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include "backend/device_rig.hpp"
#include "backend/sim_engine.hpp"
#include "kvoffload/cuda_backend.hpp"
#include "kvoffload/testing/sim_device.hpp"
#include "kvoffload/transfer_engine.hpp"

using namespace kvoffload;
using kvtest::DeviceRig;
using kvtest::forward_pass;
using kvtest::host_blocks_hold;
using kvtest::sim_with;
using kvtest::store_job;
using namespace std::chrono_literals;

namespace {

/// The engine's next step, held open on a stream until the test lets it go (or 10 s pass).
/// The flag is shared with the stream's thread, which may read it after this object is gone.
class HeldWork {
 public:
  HeldWork(SimDevice& sim, StreamHandle stream) {
    REQUIRE(sim.launch(stream, "next step (held)", {}, [open = open_] {
      for (int i = 0; i < 2000 && !open->load(); ++i) std::this_thread::sleep_for(5ms);
    }) == dev::ok);
  }
  ~HeldWork() { release(); }
  HeldWork(const HeldWork&) = delete;
  HeldWork& operator=(const HeldWork&) = delete;
  void release() { open_->store(true); }

 private:
  std::shared_ptr<std::atomic<bool>> open_ = std::make_shared<std::atomic<bool>>(false);
};

/// Polls `engine` for up to 5 s until job `id` is reported; its report, if it came.
std::optional<FinishedTransfer> finished_within(TransferEngine& engine, JobId id) {
  for (int i = 0; i < 1000; ++i) {
    for (auto& f : engine.get_finished()) {
      if (f.job == id) return f;
    }
    std::this_thread::sleep_for(5ms);
  }
  return std::nullopt;
}

CudaBackendConfig config_for(const DeviceRig& rig, CopyMode mode, StreamHandle compute) {
  CudaBackendConfig c;
  c.mode = mode;
  c.compute_stream = compute;
  c.host_base = rig.region.base;
  c.host_bytes = rig.pool_bytes;
  return c;
}

}  // namespace

// Mutation caught: the store's compute wait taken at start_step (TransferEngine not marking at
// submit, or the backend ignoring the plan's compute_mark): the store then waits for the held
// next step, and is not done within 5 s.
TEST_CASE("sim: a deferred store does not wait for engine work queued after its submission",
          "[sim][cuda_backend][ordering]") {
  const CopyMode mode = GENERATE(CopyMode::batch, CopyMode::memcpy, CopyMode::kernel);
  const bool switched = GENERATE(false, true);
  INFO("mode " << to_string(mode) << ", compute stream switched before start_step " << switched);
  auto sim = sim_with(61, 1, 5);
  DeviceRig rig(sim, 1, 4096, 32, 16);
  StreamHandle a = 0, b = 0;
  REQUIRE(sim->stream_create(0, &a) == dev::ok);
  REQUIRE(sim->stream_create(0, &b) == dev::ok);
  auto owned = std::make_unique<CudaBackend>(config_for(rig, mode, a), sim);
  CudaBackend& backend = *owned;
  {
    TransferEngineConfig ec;
    ec.defer_stores = true;
    TransferEngine engine(*rig.layout, rig.region, std::move(owned), ec);
    forward_pass(*sim, a, rig, 1, 8, 0x6d);
    engine.submit_store(store_job(1, 1, 8));
    HeldWork next(*sim, a);  // the engine's next step, on the same stream
    if (switched) backend.set_compute_stream(b);
    engine.start_step();
    const auto done = finished_within(engine, 1);
    next.release();
    REQUIRE(done.has_value());
    CHECK(done->ok);
    CHECK(host_blocks_hold(rig, 8, 0x6d));
  }
  REQUIRE(sim->device_synchronize() == dev::ok);
  CHECK(sim->violations().empty());
  REQUIRE(sim->stream_destroy(a) == dev::ok);
  REQUIRE(sim->stream_destroy(b) == dev::ok);
}

// Mutation caught: a mark recorded on the compute stream alone when the engine switched
// streams with the old one's work not done (the store then reads blocks the pass on the old
// stream still writes: a race, and torn bytes in the pool).
TEST_CASE("sim: a deferred store submitted after a stream switch waits for both passes",
          "[sim][cuda_backend][ordering]") {
  const CopyMode mode = GENERATE(CopyMode::batch, CopyMode::kernel);
  auto sim = sim_with(62, 1, 5);
  DeviceRig rig(sim, 1, 4096, 32, 16);
  StreamHandle a = 0, b = 0;
  REQUIRE(sim->stream_create(0, &a) == dev::ok);
  REQUIRE(sim->stream_create(0, &b) == dev::ok);
  auto owned = std::make_unique<CudaBackend>(config_for(rig, mode, a), sim);
  CudaBackend& backend = *owned;
  {
    TransferEngineConfig ec;
    ec.defer_stores = true;
    TransferEngine engine(*rig.layout, rig.region, std::move(owned), ec);
    forward_pass(*sim, a, rig, 1, 8, 0x21);
    backend.set_compute_stream(b);
    forward_pass(*sim, b, rig, 9, 8, 0x42);
    TransferJob job = store_job(1, 1, 16);  // both passes' blocks
    engine.submit_store(job);
    engine.start_step();
    const std::vector<JobId> ids{1};
    engine.wait(ids);
    const auto done = engine.get_finished();
    REQUIRE(done.size() == 1);
    CHECK(done[0].ok);
    CHECK(host_blocks_hold(rig, 8, 0x21));
    CHECK(host_blocks_hold(rig, 8, 0x42, 8));
  }
  REQUIRE(sim->device_synchronize() == dev::ok);
  const auto v = sim->violations();
  for (const auto& line : v) UNSCOPED_INFO(line);
  CHECK(v.empty());
  REQUIRE(sim->stream_destroy(a) == dev::ok);
  REQUIRE(sim->stream_destroy(b) == dev::ok);
}

// Mutation caught: a shed or failed deferred store keeping its mark (an event per store
// lost for the backend's life).
TEST_CASE("sim: marks of deferred stores that never start are given back",
          "[sim][cuda_backend][lifetime]") {
  auto sim = sim_with(63, 1, 5);
  DeviceRig rig(sim, 1, 4096, 32, 16);
  StreamHandle a = 0;
  REQUIRE(sim->stream_create(0, &a) == dev::ok);
  auto owned = std::make_unique<CudaBackend>(config_for(rig, CopyMode::batch, a), sim);
  CudaBackend& backend = *owned;
  {
    TransferEngineConfig ec;
    ec.defer_stores = true;
    ec.max_store_bytes_in_flight =
        std::uint64_t{8} * 4096 * 2;  // one store of 8 blocks in two tensors
    TransferEngine engine(*rig.layout, rig.region, std::move(owned), ec);
    const std::size_t events_before = sim->live_events();
    for (int round = 0; round < 20; ++round) {
      forward_pass(*sim, a, rig, 1, 8, static_cast<std::uint8_t>(round));
      const JobId first = 100 + 2 * static_cast<JobId>(round);
      engine.submit_store(store_job(first, 1, 8));
      engine.submit_store(store_job(first + 1, 9, 8, 8));
      engine.start_step();  // the second is over the bound while the first is copying
      const std::vector<JobId> ids{first, first + 1};
      engine.wait(ids);
      int ok = 0, shed = 0;
      for (int i = 0; i < 1000 && ok + shed < 2; ++i) {
        for (const auto& f : engine.get_finished()) (f.ok ? ok : shed) += 1;
        if (ok + shed < 2) std::this_thread::sleep_for(1ms);
      }
      REQUIRE(ok == 1);
      REQUIRE(shed == 1);
    }
    // A few events of the backend's own (reused), never one per store.
    CHECK(sim->live_events() <= events_before + 4);
    CHECK(backend.stats().jobs_batch == 20);
  }
  REQUIRE(sim->device_synchronize() == dev::ok);
  CHECK(sim->violations().empty());
  REQUIRE(sim->stream_destroy(a) == dev::ok);
}
