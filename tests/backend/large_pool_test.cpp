// A large pool registered in many pieces (issue 49, item 4): how long it takes to become usable
// (map, first touch, registration), and jobs in its first and last blocks and across three of
// its registration seams, in every copy mode, byte for byte. On the simulated device at a small
// size (the logic); on a GPU with 48 GiB in 1 GiB registrations (tag [gpu_large]: the GPU
// bundle runs it as a part of its own, KVOFFLOAD_LARGE_POOL_BYTES to change the size and
// KVOFFLOAD_LARGE_POOL_JSON to write its timings).

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch_test_macros.hpp>

#include "kvoffload/byte_size.hpp"
#include "kvoffload/cuda_backend.hpp"
#include "kvoffload/device.hpp"
#include "kvoffload/device_runtime.hpp"
#include "kvoffload/pinned_host_pool.hpp"
#include "kvoffload/testing/sim_device.hpp"
#include "kvoffload/transfer_engine.hpp"
#include "sim_engine.hpp"

using namespace kvoffload;

namespace {

constexpr std::int64_t kPage = 4096;
constexpr std::int64_t kFactor = 2;
constexpr std::int64_t kGpuBlocks = 64;  // 1..24 stored from, 32..55 loaded into
constexpr int kSpan = 12;                // host blocks per job

std::uint8_t pattern(std::size_t i) {
  return static_cast<std::uint8_t>((i * 29 + 3) ^ (i >> 11));
}

TransferJob job_at(JobId id, JobKind kind, GpuBlockId first_gpu, HostBlockId first_host) {
  TransferJob j;
  j.id = id;
  j.kind = kind;
  j.request_id = "large-pool";
  for (int h = 0; h < kSpan; ++h) {
    j.keys.push_back(
        Key{BlockHash::from_bytes(std::vector<std::uint8_t>{static_cast<std::uint8_t>(h + 1)}), 0});
    j.host_block_ids.push_back(first_host + h);
  }
  for (int p = 0; p < kSpan * kFactor; ++p) j.gpu.block_ids.push_back(first_gpu + p);
  j.gpu.group_sizes = {kSpan * kFactor};
  j.gpu.block_indices = {0};
  return j;
}

FinishedTransfer run_one(TransferEngine& engine, const TransferJob& job) {
  if (job.kind == JobKind::store) {
    engine.submit_store(job);
  } else {
    engine.submit_load(job);
  }
  engine.wait(std::vector<JobId>{job.id});
  auto done = engine.get_finished();
  REQUIRE(done.size() == 1);
  return done[0];
}

/// Where the jobs go: the first and last kSpan blocks, and kSpan blocks centred on each of
/// three seams (the first, the middle and the last).
std::vector<HostBlockId> places(const PinnedHostPool& pool) {
  const std::int64_t n = pool.num_blocks();
  const std::int64_t per = pool.blocks_per_registration();
  std::vector<HostBlockId> at{0, static_cast<HostBlockId>(n - kSpan)};
  REQUIRE(per > kSpan);
  const std::int64_t seams = (n - 1) / per;  // seams at per, 2 per, ...
  REQUIRE(seams >= 3);
  for (const std::int64_t s : {std::int64_t{1}, (seams + 1) / 2, seams}) {
    at.push_back(static_cast<HostBlockId>(s * per - kSpan / 2));
  }
  return at;
}

/// Stores GPU blocks 1..24 into each place, checks the host bytes, loads them back into GPU
/// blocks 32..55 over zeros, checks those; in every mode.
void ends_and_seams(const std::shared_ptr<DeviceRuntime>& rt, const PinnedHostPool& pool) {
  const auto bytes = static_cast<std::size_t>(kGpuBlocks * kPage);
  void* kv = nullptr;
  REQUIRE(rt->malloc_device(&kv, bytes) == dev::ok);
  std::vector<std::uint8_t> host(bytes);
  for (std::size_t i = 0; i < bytes; ++i) host[i] = pattern(i);
  const KvLayout layout({{reinterpret_cast<std::uintptr_t>(kv), kGpuBlocks, kPage, kPage}},
                        {{{0, kPage}}}, kFactor);
  const auto block = static_cast<std::int64_t>(pool.block_bytes());
  const HostRegion region{reinterpret_cast<std::uintptr_t>(pool.data()),
                          pool.num_blocks(),
                          block,
                          0,
                          block,
                          pool.blocks_per_registration()};
  JobId id = 1;
  for (const CopyMode mode : {CopyMode::batch, CopyMode::memcpy, CopyMode::kernel, CopyMode::staged,
                              CopyMode::automatic}) {
    INFO("mode " << to_string(mode));
    CudaBackendConfig c;
    c.mode = mode;
    c.staging_bytes = 1 << 20;
    c.host_base = region.base;
    c.host_bytes = static_cast<std::uint64_t>(pool.num_blocks()) * pool.block_bytes();
    c.host_registration_bytes =
        static_cast<std::uint64_t>(pool.blocks_per_registration()) * pool.block_bytes();
    TransferEngine engine(layout, region, std::make_unique<CudaBackend>(c, rt));
    for (const HostBlockId first : places(pool)) {
      INFO("host blocks " << first << ".." << first + kSpan - 1);
      REQUIRE(rt->memcpy_async(kv, host.data(), bytes, 0) == dev::ok);
      REQUIRE(rt->stream_synchronize(0) == dev::ok);
      const FinishedTransfer stored = run_one(engine, job_at(id++, JobKind::store, 1, first));
      INFO(stored.error);
      REQUIRE(stored.ok);
      for (int h = 0; h < kSpan; ++h) {
        const std::byte* got = pool.data() + (first + h) * block;
        rt->host_access(got, static_cast<std::size_t>(kFactor * kPage), false);
        const auto* want = host.data() + static_cast<std::size_t>((1 + h * kFactor) * kPage);
        REQUIRE(std::memcmp(got, want, static_cast<std::size_t>(kFactor * kPage)) == 0);
      }
      std::vector<std::uint8_t> zero(bytes / 2, 0);
      REQUIRE(rt->memcpy_async(static_cast<char*>(kv) + bytes / 2, zero.data(), bytes / 2, 0) ==
              dev::ok);
      REQUIRE(rt->stream_synchronize(0) == dev::ok);
      const FinishedTransfer loaded = run_one(engine, job_at(id++, JobKind::load, 32, first));
      INFO(loaded.error);
      REQUIRE(loaded.ok);
      std::vector<std::uint8_t> back(static_cast<std::size_t>(kSpan * kFactor * kPage));
      REQUIRE(rt->memcpy_async(back.data(), static_cast<char*>(kv) + bytes / 2, back.size(), 0) ==
              dev::ok);
      REQUIRE(rt->stream_synchronize(0) == dev::ok);
      REQUIRE(std::memcmp(back.data(), host.data() + kPage, back.size()) == 0);
    }
  }
  REQUIRE(rt->free_device(kv) == dev::ok);
}

PoolConfig pool_config(std::uint64_t bytes, std::uint64_t chunk,
                       const std::shared_ptr<DeviceRuntime>& rt) {
  PoolConfig pc;
  pc.block_bytes = kFactor * kPage;
  pc.host_bytes = bytes;
  pc.pinning = Pinning::require;
  pc.register_chunk_bytes = chunk;
  pc.device = 0;
  pc.runtime = rt;
  return pc;
}

}  // namespace

TEST_CASE("sim: jobs at a pool's ends and across its registration seams in every mode",
          "[sim][worker]") {
  auto sim = kvtest::sim_with(47, 1, 0);
  const PinnedHostPool pool(pool_config(std::uint64_t{8} << 20, std::uint64_t{1} << 20, sim));
  REQUIRE(pool.blocks_per_registration() == 128);
  ends_and_seams(sim, pool);
  REQUIRE(sim->device_synchronize() == dev::ok);
  const auto v = sim->violations();
  for (const auto& line : v) UNSCOPED_INFO(line);
  CHECK(v.empty());
}

TEST_CASE("gpu: a 48 GiB pool in 1 GiB registrations: start-up time and jobs at its ends and seams",
          "[gpu_large]") {
  if (cuda_device_count() == 0) SKIP("no CUDA device");
  const char* size = std::getenv("KVOFFLOAD_LARGE_POOL_BYTES");
  const std::uint64_t bytes = parse_bytes(size != nullptr ? size : "48GiB", "pool size");
  const auto start = std::chrono::steady_clock::now();
  const PinnedHostPool pool(pool_config(bytes, std::uint64_t{1} << 30, cuda_runtime()));
  const double ready =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const PoolReport& r = pool.report();
  REQUIRE(r.pinned);
  const double gib = static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0);
  // PegaFlow's published start-up, for the comparison: 500 GiB ready in 33.2 s.
  const std::string json = "{\"bytes\": " + std::to_string(bytes) +
                           ", \"ready_s\": " + std::to_string(ready) +
                           ", \"map_s\": " + std::to_string(r.map_seconds) +
                           ", \"fault_s\": " + std::to_string(r.fault_seconds) +
                           ", \"register_s\": " + std::to_string(r.register_seconds) +
                           ", \"gib_per_s\": " + std::to_string(gib / ready) +
                           ", \"huge_pages\": " + (r.huge_pages ? "true" : "false") +
                           ", \"pegaflow_gib_per_s\": " + std::to_string(500.0 / 33.2) + "}";
  WARN("large-pool " << json);
  if (const char* path = std::getenv("KVOFFLOAD_LARGE_POOL_JSON")) std::ofstream(path) << json;
  ends_and_seams(cuda_runtime(), pool);
}
