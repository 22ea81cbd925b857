// The CUDA backend's orchestration on the simulated device: ordering against the engine's
// compute stream, shutdown, job lifetimes, devices, error paths and resource rings. These need
// the simulator's hooks (a slow "forward pass", injected failures, leak counts), so they have
// no [gpu] twin; the copies themselves are also checked on a GPU in cuda_backend_test.cpp.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <thread>

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
using namespace std::chrono_literals;

TEST_CASE("sim: stores wait for the compute stream, and the test catches it when they do not",
          "[sim][cuda_backend][ordering]") {
  const bool legacy = GENERATE(false, true);  // the engine's own stream, or the legacy stream 0
  const bool skip = GENERATE(false, true);
  INFO("legacy " << legacy << " skip the wait " << skip);
  auto sim = sim_with(11, 1, 5);
  DeviceRig rig(sim, 1, 4096, 32, 16);
  StreamHandle compute = 0;
  if (!legacy) REQUIRE(sim->stream_create(0, &compute) == dev::ok);
  const CopyMode mode = GENERATE(CopyMode::batch, CopyMode::memcpy, CopyMode::kernel);
  CudaBackendConfig c;
  c.mode = mode;
  c.compute_stream = compute;
  c.host_base = rig.region.base;
  c.host_bytes = rig.pool_bytes;
  auto backend = std::make_unique<CudaBackend>(c, sim);
  backend->unsafe_skip_compute_wait_for_testing(skip);
  TransferEngine engine(*rig.layout, rig.region, std::move(backend));
  forward_pass(*sim, compute, rig, 1, 8, 0xab);
  engine.submit_store(store_job(1, 1, 8));
  const std::vector<JobId> ids{1};
  engine.wait(ids);
  const auto done = engine.get_finished();
  REQUIRE(done.size() == 1);
  REQUIRE(sim->device_synchronize() == dev::ok);  // every operation has run (and been checked)
  if (!skip) {
    CHECK(done[0].ok);
    CHECK(host_blocks_hold(rig, 8, 0xab));  // the forward pass's final bytes
    CHECK(sim->violations().empty());
  } else {
    // Without the wait the store races the forward pass: the simulator reports it.
    const auto v = sim->violations();
    REQUIRE_FALSE(v.empty());
    CHECK_THAT(v.front(), ContainsSubstring("race"));
  }
  if (!legacy) REQUIRE(sim->stream_destroy(compute) == dev::ok);
}

TEST_CASE("sim: loads wait for the compute stream unless told not to",
          "[sim][cuda_backend][ordering]") {
  const bool wait = GENERATE(true, false);
  auto sim = sim_with(12, 1, 5);
  DeviceRig rig(sim, 1, 4096, 32, 16);
  StreamHandle compute = 0;
  REQUIRE(sim->stream_create(0, &compute) == dev::ok);
  CudaBackendConfig c;
  c.mode = CopyMode::batch;
  c.compute_stream = compute;
  c.loads_wait_for_compute = wait;
  CudaBackend backend(c, sim);
  // The forward pass still reads blocks 1..8 when a load overwrites them.
  forward_pass(*sim, compute, rig, 1, 8, 0, /*write=*/false);
  CopyPlan plan;
  plan.job = 1;
  plan.kind = JobKind::load;
  for (std::size_t t = 0; t < 2; ++t) {
    plan.descriptors.push_back(
        {rig.region.base, reinterpret_cast<std::uintptr_t>(rig.device[t]) + 4096, 8 * 4096});
  }
  plan.total_bytes = 2 * 8 * 4096;
  backend.wait(backend.submit(plan));
  std::vector<BackendResult> done;
  backend.poll(done);
  REQUIRE(done.size() == 1);
  REQUIRE(sim->device_synchronize() == dev::ok);  // the forward pass has run (and been checked)
  CHECK(sim->violations().empty() == wait);
}

TEST_CASE("sim: cudaStreamPerThread is refused as the compute stream", "[sim][cuda_backend]") {
  auto sim = sim_with(13);
  CudaBackendConfig c;
  c.compute_stream = per_thread_default_stream;
  CHECK_THROWS_AS(CudaBackend(c, sim), invalid_argument);
  CudaBackend backend(CudaBackendConfig{}, sim);
  CHECK_THROWS_WITH(backend.set_compute_stream(per_thread_default_stream),
                    ContainsSubstring("cudaStreamPerThread"));
  backend.set_compute_stream(0);  // the legacy stream is fine
  backend.set_compute_stream(std::nullopt);
}

TEST_CASE("sim: shutdown with drain finishes everything, without drain cancels the rest",
          "[sim][cuda_backend]") {
  const bool drain = GENERATE(true, false);
  auto sim = sim_with(14, 1, 300);
  DeviceRig rig(sim, 1, 1024, 64, 32);
  // Every job waits for an engine pass held open until well after shutdown begins, so jobs are
  // still queued then whatever the machine's speed (a sanitizer build on a busy machine once
  // drained them all before shutdown).
  StreamHandle compute = 0;
  REQUIRE(sim->stream_create(0, &compute) == dev::ok);
  auto open = std::make_shared<std::atomic<bool>>(false);
  REQUIRE(sim->launch(compute, "engine pass (held)", {}, [open] {
    for (int i = 0; i < 2000 && !open->load(); ++i) std::this_thread::sleep_for(5ms);
  }) == dev::ok);
  CudaBackendConfig c;
  c.mode = CopyMode::memcpy;
  c.compute_stream = compute;
  CudaBackend backend(c, sim);
  std::set<Ticket> tickets;
  for (int i = 0; i < 40; ++i) {
    CopyPlan plan;
    plan.job = static_cast<JobId>(i);
    plan.kind = i % 2 == 0 ? JobKind::store : JobKind::load;
    for (int k = 0; k < 4; ++k) {
      const auto dev_addr = reinterpret_cast<std::uintptr_t>(rig.device[0]) +
                            static_cast<std::uintptr_t>((i % 16 * 4 + k) * 1024);
      const auto host_addr = rig.region.base + static_cast<std::uintptr_t>((i * 4 + k) % 32 * 1024);
      plan.descriptors.push_back(plan.kind == JobKind::store
                                     ? CopyDescriptor{dev_addr, host_addr, 1024}
                                     : CopyDescriptor{host_addr, dev_addr, 1024});
    }
    plan.total_bytes = 4096;
    tickets.insert(backend.submit(plan));
  }
  std::thread release([open] {
    std::this_thread::sleep_for(200ms);
    open->store(true);
  });
  backend.shutdown(drain);  // waits for the GPU work, held until release lets the pass end
  release.join();
  std::vector<BackendResult> done;
  backend.poll(done);
  REQUIRE(done.size() == 40);  // everything reported once, right after shutdown
  std::size_t cancelled = 0;
  for (const auto& r : done) {
    CHECK(tickets.erase(r.ticket) == 1);
    if (drain) CHECK(r.ok);
    if (!r.ok) {
      CHECK_THAT(r.error, ContainsSubstring("cancelled"));
      ++cancelled;
    }
  }
  if (!drain) CHECK(cancelled == 40);  // none could finish before the pass it waits for
  // Later submits fail at once.
  CopyPlan late;
  late.job = 99;
  backend.submit(late);
  done.clear();
  backend.poll(done);
  REQUIRE(done.size() == 1);
  CHECK_FALSE(done[0].ok);
  CHECK_THAT(done[0].error, ContainsSubstring("shut down"));
  REQUIRE(sim->device_synchronize() == dev::ok);
  CHECK(sim->violations().empty());
  REQUIRE(sim->stream_destroy(compute) == dev::ok);
}

TEST_CASE("sim: wait racing poll: every job reported once, none freed under a waiter",
          "[sim][cuda_backend][threads]") {
  auto sim = sim_with(15, 1, 50);
  DeviceRig rig(sim, 1, 1024, 64, 64);
  CudaBackendConfig c;
  c.mode = CopyMode::kernel;
  c.host_base = rig.region.base;
  c.host_bytes = rig.pool_bytes;
  CudaBackend backend(c, sim);
  constexpr int kJobs = 150;
  std::atomic<bool> submitted{false};
  std::vector<BackendResult> done;
  std::thread poller([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while ((!submitted || done.size() < kJobs) && std::chrono::steady_clock::now() < deadline) {
      backend.poll(done);
    }
  });
  for (int i = 0; i < kJobs; ++i) {
    CopyPlan plan;
    plan.job = static_cast<JobId>(i);
    plan.kind = JobKind::store;
    const auto src = reinterpret_cast<std::uintptr_t>(rig.device[0]) +
                     static_cast<std::uintptr_t>(i % 64 * 1024);
    plan.descriptors = {{src, rig.region.base + static_cast<std::uintptr_t>(i % 64 * 1024), 1024}};
    plan.total_bytes = 1024;
    backend.wait(backend.submit(plan));
  }
  submitted = true;
  poller.join();
  REQUIRE(done.size() == kJobs);
  for (int i = 0; i < kJobs; ++i) {
    CHECK(done[static_cast<std::size_t>(i)].job == static_cast<JobId>(i));
    CHECK(done[static_cast<std::size_t>(i)].ok);
  }
  REQUIRE(sim->device_synchronize() == dev::ok);
  CHECK(sim->violations().empty());
}

TEST_CASE("sim: a backend on device 1 works from a thread whose current device is 0",
          "[sim][cuda_backend][devices]") {
  auto sim = sim_with(16, 2, 10);
  REQUIRE(sim->set_device(1) == dev::ok);
  DeviceRig rig(sim, 4, 512, 64, 16);  // its memory and streams on device 1
  REQUIRE(sim->set_device(0) == dev::ok);
  CudaBackendConfig c;
  c.device = 1;
  c.mode = GENERATE(CopyMode::kernel, CopyMode::staged, CopyMode::batch);
  c.staged_min_pieces = 1;
  c.host_base = rig.region.base;
  c.host_bytes = rig.pool_bytes;
  StreamHandle compute = 0;
  REQUIRE(sim->set_device(1) == dev::ok);
  REQUIRE(sim->stream_create(0, &compute) == dev::ok);
  REQUIRE(sim->set_device(0) == dev::ok);
  c.compute_stream = compute;
  {
    TransferEngine engine(*rig.layout, rig.region, std::make_unique<CudaBackend>(c, sim));
    std::mt19937 rng(3);
    std::vector<GpuBlockId> gpu(63);
    std::iota(gpu.begin(), gpu.end(), 1);
    std::vector<HostBlockId> host(16);
    std::iota(host.begin(), host.end(), 0);
    const TransferJob job = DeviceRig::random_job(1, 4, rng, gpu, host);
    const auto before = rig.pool();
    engine.submit_store(job);
    const std::vector<JobId> ids{1};
    engine.wait(ids);
    const auto done = engine.get_finished();
    REQUIRE(done.size() == 1);
    CHECK(done[0].ok);
    CHECK(kvtest::same_bytes(rig.pool(), rig.expected_pool({job}, before)));
    int current = -1;
    REQUIRE(sim->get_device(&current) == dev::ok);
    CHECK(current == 0);  // the caller's device is left as it was
  }
  REQUIRE(sim->device_synchronize() == dev::ok);
  const auto v = sim->violations();
  for (const auto& line : v) UNSCOPED_INFO(line);
  CHECK(v.empty());
  REQUIRE(sim->set_device(1) == dev::ok);
  REQUIRE(sim->stream_destroy(compute) == dev::ok);
  REQUIRE(sim->set_device(0) == dev::ok);
}

TEST_CASE("sim: failing CUDA calls leak nothing and fail only their job",
          "[sim][cuda_backend][errors]") {
  SECTION("construction: every allocation failure is freed") {
    for (const char* call : {"malloc_host", "malloc_device", "stream_create"}) {
      for (int after = 0; after < 3; ++after) {
        auto sim = sim_with(17, 1, 0);
        sim->inject_failure(call, dev::memory_allocation, after);
        try {
          CudaBackend backend(CudaBackendConfig{}, sim);
        } catch (const cuda_error& e) {
          CHECK_THAT(e.what(), ContainsSubstring("device 0"));
        }
        CHECK(sim->live_streams() == 0);
        CHECK(sim->live_events() == 0);
        CHECK(sim->live_allocations() == 0);
      }
    }
  }
  SECTION("submission: a refused call fails the job with its name; the next job is fine") {
    auto sim = sim_with(18, 1, 10);
    DeviceRig rig(sim, 1, 1024, 16, 16);
    for (const char* call : {"memcpy_async", "launch_copy_pieces", "event_record", "event_create",
                             "memcpy_batch_async"}) {
      INFO(call);
      CudaBackendConfig c;
      c.mode = std::string(call) == "memcpy_batch_async" ? CopyMode::batch : CopyMode::kernel;
      c.host_base = rig.region.base;
      c.host_bytes = rig.pool_bytes;
      {
        CudaBackend backend(c, sim);
        sim->inject_failure(call, dev::invalid_value);
        CopyPlan plan;
        plan.job = 5;
        plan.kind = JobKind::store;
        plan.descriptors = {
            {reinterpret_cast<std::uintptr_t>(rig.device[0]), rig.region.base, 1024}};
        plan.total_bytes = 1024;
        backend.submit(plan);
        plan.job = 6;
        backend.wait(backend.submit(plan));
        std::vector<BackendResult> done;
        backend.poll(done);
        REQUIRE(done.size() == 2);
        CHECK_FALSE(done[0].ok);
        CHECK_THAT(done[0].error, ContainsSubstring("job 5"));
        CHECK(done[1].ok);
      }
      CHECK(sim->live_events() == 0);
      CHECK(sim->live_streams() == 0);
    }
    REQUIRE(sim->device_synchronize() == dev::ok);
    CHECK(sim->violations().empty());
  }
}

// Issue 49, item 5: a job's buffers come from rings allocated once, never from an allocation
// of its own (cudaMallocAsync on the default pool can order a load stream after a store
// stream and can fail; a pinned allocation under the backend's lock stalls every thread).
// Mutation caught: any per-job allocation (the injected failure then fails a job).
TEST_CASE("sim: jobs allocate no memory of their own", "[sim][cuda_backend][errors]") {
  auto sim = sim_with(24, 1, 5);
  DeviceRig rig(sim, 2, 1024, 80, 64);
  CudaBackendConfig c;
  c.mode = GENERATE(CopyMode::kernel, CopyMode::batch, CopyMode::automatic);
  c.ring_bytes = 1024;  // a few jobs' piece arrays: some jobs fall back to the copy engines
  c.host_base = rig.region.base;
  c.host_bytes = rig.pool_bytes;
  INFO("mode " << to_string(c.mode));
  CudaBackend backend(c, sim);
  for (const char* call : {"malloc_async", "malloc_host", "malloc_device"}) {
    sim->inject_failure(call, dev::memory_allocation);
  }
  std::mt19937 rng(24);
  std::vector<GpuBlockId> gpu(79);
  std::iota(gpu.begin(), gpu.end(), 1);
  std::vector<HostBlockId> host(64);
  std::iota(host.begin(), host.end(), 0);
  const auto before = rig.pool();
  std::vector<TransferJob> jobs;
  std::vector<Ticket> tickets;
  CopyPlanner planner(*rig.layout, rig.region);
  for (JobId j = 1; j <= 6; ++j) {
    jobs.push_back(DeviceRig::random_job(j, 2, rng, gpu, host));
    CopyPlan plan;
    planner.plan(jobs.back(), JobKind::store, plan);
    tickets.push_back(backend.submit(std::move(plan)));
  }
  std::vector<BackendResult> done;
  for (const Ticket t : tickets) backend.wait(t);
  backend.poll(done);                // gives the rings back
  if (c.mode == CopyMode::kernel) {  // the device-table path too
    TransferJob job;
    job.id = 7;
    job.gpu = {{gpu[0], gpu[1]}, {2, 0}, {0, 0}};
    job.keys = {Key{BlockHash::from_hex("07"), 0}};
    job.host_block_ids = {host[0]};
    void* table = nullptr;
    sim->inject_failure("malloc_device", dev::ok);  // not a job's: the test's own table
    REQUIRE(sim->malloc_device(&table, 8) == dev::ok);
    const std::vector<std::int32_t> ids{static_cast<std::int32_t>(gpu[0]),
                                        static_cast<std::int32_t>(gpu[1])};
    REQUIRE(sim->memcpy_async(table, ids.data(), 8, 0) == dev::ok);
    REQUIRE(sim->stream_synchronize(0) == dev::ok);
    const std::vector<std::int64_t> offsets{0, 2, 2};
    tickets.push_back(backend.submit_device_table(job, JobKind::store, *rig.layout, rig.region,
                                                  static_cast<const std::int32_t*>(table),
                                                  offsets));
    backend.wait(tickets.back());
    backend.poll(done);
    REQUIRE(sim->free_device(table) == dev::ok);
  }
  REQUIRE(done.size() == tickets.size());
  for (const auto& d : done) {
    INFO("job " << d.job << ": " << d.error);
    CHECK(d.ok);
  }
  if (c.mode != CopyMode::kernel) {  // (the device-table job writes blocks of its own)
    CHECK(kvtest::same_bytes(rig.pool(), rig.expected_pool(jobs, before)));
  }
  REQUIRE(sim->device_synchronize() == dev::ok);
  CHECK(sim->violations().empty());
}

TEST_CASE("sim: an unmapped host region turns the kernel modes off instead of faulting",
          "[sim][cuda_backend]") {
  auto sim = sim_with(20, 1, 5);
  DeviceRig rig(sim, 1, 1024, 16, 16);
  std::vector<std::uint8_t> unpinned(16 * 4096);
  CudaBackendConfig c;
  c.mode = CopyMode::kernel;
  c.host_base = reinterpret_cast<std::uintptr_t>(unpinned.data());
  c.host_bytes = unpinned.size();
  CudaBackend backend(c, sim);
  CHECK_FALSE(backend.kernel_available());
  CopyPlan plan;
  plan.job = 1;
  plan.kind = JobKind::store;
  plan.descriptors = {{reinterpret_cast<std::uintptr_t>(rig.device[0]),
                       reinterpret_cast<std::uintptr_t>(unpinned.data()), 1024}};
  plan.total_bytes = 1024;
  CHECK(backend.mode_for(plan) != CopyMode::kernel);
  backend.wait(backend.submit(plan));
  std::vector<BackendResult> done;
  backend.poll(done);
  REQUIRE(done.size() == 1);
  CHECK(done[0].ok);
  CHECK(std::memcmp(unpinned.data(), rig.mirror[0].data(), 1024) == 0);
  CHECK_FALSE(sim->poisoned());
  // The device-table path refuses at once.
  TransferJob job = store_job(2, 1, 1);
  const std::vector<std::int64_t> offsets{0, 1, 1};
  CHECK_THROWS_WITH(
      backend.submit_device_table(job, JobKind::store, *rig.layout, rig.region, nullptr, offsets),
      ContainsSubstring("mapped pinned"));
}

TEST_CASE("sim: tiny upload rings and staging fall back and stay correct under load",
          "[sim][cuda_backend]") {
  auto sim = sim_with(21, 1, 20);
  const std::int64_t f = 4;
  DeviceRig rig(sim, f, 256, 72 * f + 2, 64);
  CudaBackendConfig c;
  c.mode = GENERATE(CopyMode::kernel, CopyMode::staged);
  c.ring_bytes = 2048;         // about 80 pieces per stream
  c.staging_bytes = 8 * 1024;  // a few jobs' worth
  c.staged_min_pieces = 1;
  c.host_base = rig.region.base;
  c.host_bytes = rig.pool_bytes;
  auto owned = std::make_unique<CudaBackend>(c, sim);
  CudaBackend& backend = *owned;
  TransferEngine engine(*rig.layout, rig.region, std::move(owned));
  std::mt19937 rng(9);
  std::vector<GpuBlockId> gpu(static_cast<std::size_t>(72 * f + 1));
  std::iota(gpu.begin(), gpu.end(), 1);
  std::shuffle(gpu.begin(), gpu.end(), rng);
  std::vector<HostBlockId> host(64);
  std::iota(host.begin(), host.end(), 0);
  std::shuffle(host.begin(), host.end(), rng);
  std::vector<TransferJob> jobs;
  std::vector<JobId> ids;
  for (JobId j = 0; j < 8; ++j) {
    jobs.push_back(DeviceRig::random_job(j, f, rng, gpu, host));
    ids.push_back(j);
  }
  const auto before = rig.pool();
  for (const auto& j : jobs) engine.submit_store(j);
  engine.wait(ids);
  const auto done = engine.get_finished();
  REQUIRE(done.size() == jobs.size());
  for (const auto& d : done) CHECK(d.ok);
  CHECK(kvtest::same_bytes(rig.pool(), rig.expected_pool(jobs, before)));
  const CudaBackendStats st = backend.stats();
  CHECK(st.ring_fell_back + st.staged_fell_back > 0);  // the pressure was real
  REQUIRE(sim->device_synchronize() == dev::ok);
  const auto v = sim->violations();
  for (const auto& line : v) UNSCOPED_INFO(line);
  CHECK(v.empty());  // and no ring slot was reused under a queued copy
}

TEST_CASE("sim: a Worker with a compute stream on the simulated device", "[sim][worker]") {
  auto sim = sim_with(22, 1, 5);
  void* kv = nullptr;
  REQUIRE(sim->malloc_device(&kv, 16 * 512) == dev::ok);
  WorkerConfig wc;
  wc.tensors = {{reinterpret_cast<std::uintptr_t>(kv), 16, 512, 512}};
  wc.groups = {{{0, 512}}};
  wc.host_blocks = 4;
  wc.backend = BackendKind::cuda;
  wc.runtime = sim;
  wc.compute_stream = 0;
  wc.copy_mode = CopyMode::batch;
  {
    Worker w(wc);
    StreamHandle compute = 0;
    REQUIRE(sim->stream_create(0, &compute) == dev::ok);
    w.set_compute_stream(compute);
    const auto b = reinterpret_cast<std::uintptr_t>(kv) + 512;
    REQUIRE(sim->launch(compute, "forward pass", {{b, b + 512, true}},
                        [kv] { std::memset(static_cast<char*>(kv) + 512, 0x3c, 512); }) == dev::ok);
    TransferJob job;
    job.id = 1;
    job.gpu = {{1}, {1}, {0}};
    job.keys = {Key{BlockHash::from_hex("01"), 0}};
    job.host_block_ids = {2};
    w.submit(job);
    const std::vector<JobId> ids{1};
    w.wait(ids);
    const auto done = w.get_finished();
    REQUIRE(done.size() == 1);
    CHECK(done[0].ok);
    const auto block = w.host_block(2);
    CHECK(std::all_of(block.begin(), block.begin() + 512,
                      [](std::byte x) { return x == std::byte{0x3c}; }));
    const auto stats = w.cuda_stats();  // the mode asked for is the mode that ran
    REQUIRE(stats.has_value());
    CHECK(stats->jobs_batch == 1);
    CHECK(stats->jobs_batch + stats->jobs_memcpy + stats->jobs_kernel + stats->jobs_staged == 1);
    REQUIRE(sim->stream_destroy(compute) == dev::ok);
  }
  REQUIRE(sim->free_device(kv) == dev::ok);
  REQUIRE(sim->device_synchronize() == dev::ok);
  CHECK(sim->violations().empty());
  WorkerConfig host = wc;
  host.backend = BackendKind::host;
  host.runtime = nullptr;
  CHECK_THROWS_WITH(Worker(host), ContainsSubstring("compute_stream"));
}

TEST_CASE("sim: the device-table path checks on the host what the planner checks",
          "[sim][cuda_backend][compaction]") {
  auto sim = sim_with(23, 1, 0);
  DeviceRig rig(sim, 4, 512, 16, 8);
  CudaBackendConfig c;
  c.host_base = rig.region.base;
  c.host_bytes = rig.pool_bytes;
  CudaBackend backend(c, sim);
  void* table = nullptr;
  REQUIRE(sim->malloc_device(&table, 64) == dev::ok);
  const auto* t = static_cast<const std::int32_t*>(table);
  TransferJob job;
  job.id = 31;
  job.gpu = {{}, {4, 2}, {0, 2}};
  job.keys = {Key{BlockHash::from_hex("01"), 0}, Key{BlockHash::from_hex("02"), 1}};
  job.host_block_ids = {3, 5};
  auto submit = [&](const TransferJob& j, std::vector<std::int64_t> offsets) {
    return backend.submit_device_table(j, JobKind::store, *rig.layout, rig.region, t, offsets);
  };
  CHECK_THROWS_WITH(submit(job, {1, 4, 8}), ContainsSubstring("start at 0"));
  CHECK_THROWS_WITH(submit(job, {0, 4, 3}), ContainsSubstring("job 31 group 1"));
  CHECK_THROWS_WITH(submit(job, {0, 4}), ContainsSubstring("2 table offsets for 2 groups"));
  TransferJob bad = job;
  bad.host_block_ids = {3, 8};  // the pool has 8 blocks: 0..7
  CHECK_THROWS_WITH(submit(bad, {0, 4, 8}), ContainsSubstring("host block 8"));
  bad = job;
  bad.gpu.block_indices = {0, -1};
  CHECK_THROWS_WITH(submit(bad, {0, 4, 8}), ContainsSubstring("job 31 group 1"));
  bad = job;
  bad.host_block_ids = {3};  // group 1 needs one host block too
  bad.keys.pop_back();
  CHECK_THROWS_WITH(submit(bad, {0, 4, 8}), ContainsSubstring("job 31 group 1"));
  std::vector<BackendResult> done;
  backend.poll(done);
  CHECK(done.empty());  // nothing was submitted
  REQUIRE(sim->free_device(table) == dev::ok);
}
