// A pool registered with the device in several pieces: CUDA refuses a copy call whose host
// range crosses from one registration into the next (cudaErrorInvalidValue, seen on an H200
// although both pieces are pinned and adjacent). Jobs over consecutive host blocks across the
// seams must still run in every copy mode, byte for byte, on the simulated device (which
// refuses such copies as CUDA does) and on a GPU.

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include "kvoffload/device.hpp"
#include "kvoffload/device_runtime.hpp"
#include "kvoffload/testing/sim_device.hpp"
#include "kvoffload/worker.hpp"
#include "sim_engine.hpp"

using namespace kvoffload;

namespace {

constexpr std::int64_t kPage = 4096;
constexpr std::int64_t kFactor = 2;
constexpr std::int64_t kGpuBlocks = 64;
constexpr std::int64_t kHostBlocks = 16;
constexpr std::int64_t kPerRegistration = 4;  // host blocks per registration: seams at 4, 8, 12

std::uint8_t pattern(std::size_t i) {
  return static_cast<std::uint8_t>((i * 31 + 7) ^ (i >> 12));
}

TransferJob job_over(JobId id, JobKind kind, GpuBlockId first_gpu, HostBlockId first_host,
                     int host_blocks) {
  TransferJob j;
  j.id = id;
  j.kind = kind;
  j.request_id = "seam";
  for (int h = 0; h < host_blocks; ++h) {
    j.keys.push_back(
        Key{BlockHash::from_bytes(std::vector<std::uint8_t>{static_cast<std::uint8_t>(h + 1)}), 0});
    j.host_block_ids.push_back(first_host + h);
  }
  const int n = host_blocks * static_cast<int>(kFactor);
  for (int p = 0; p < n; ++p) j.gpu.block_ids.push_back(first_gpu + p);
  j.gpu.group_sizes = {n};
  j.gpu.block_indices = {0};
  return j;
}

void round_trips_across_seams(const std::shared_ptr<DeviceRuntime>& rt, CopyMode mode) {
  INFO("mode " << to_string(mode));
  const auto bytes = static_cast<std::size_t>(kGpuBlocks * kPage);
  REQUIRE(rt->set_device(0) == dev::ok);
  void* kv = nullptr;
  REQUIRE(rt->malloc_device(&kv, bytes) == dev::ok);
  std::vector<std::uint8_t> host(bytes);
  for (std::size_t i = 0; i < bytes; ++i) host[i] = pattern(i);
  REQUIRE(rt->memcpy_async(kv, host.data(), bytes, 0) == dev::ok);
  REQUIRE(rt->stream_synchronize(0) == dev::ok);
  {
    WorkerConfig wc;
    wc.tensors = {{reinterpret_cast<std::uintptr_t>(kv), kGpuBlocks, kPage, kPage}};
    wc.groups = {{{0, kPage}}};
    wc.block_size_factor = kFactor;
    wc.host_blocks = kHostBlocks;
    wc.backend = BackendKind::cuda;
    wc.runtime = rt;
    wc.copy_mode = mode;
    wc.host_register_chunk_bytes = kPerRegistration * kFactor * kPage;
    Worker w(wc);
    // Store GPU blocks 1..24 (0 is the null block) into host blocks 2..13: consecutive on both
    // sides, so the planner would merge them into one copy across the seams at 4, 8 and 12 if it
    // were allowed to.
    w.submit(job_over(1, JobKind::store, 1, 2, 12));
    w.wait(std::vector<JobId>{1});
    auto done = w.get_finished();
    REQUIRE(done.size() == 1);
    INFO(done[0].error);
    REQUIRE(done[0].ok);
    for (int h = 0; h < 12; ++h) {
      const auto block = w.host_block(2 + h);
      const auto* want = host.data() + static_cast<std::size_t>((1 + h * kFactor) * kPage);
      CHECK(std::memcmp(block.data(), want, static_cast<std::size_t>(kFactor * kPage)) == 0);
    }
    // Load them back into GPU blocks 32..55, over bytes that differ.
    std::vector<std::uint8_t> zero(bytes / 2, 0);
    REQUIRE(rt->memcpy_async(static_cast<char*>(kv) + bytes / 2, zero.data(), bytes / 2, 0) ==
            dev::ok);
    REQUIRE(rt->stream_synchronize(0) == dev::ok);
    w.submit(job_over(2, JobKind::load, 32, 2, 12));
    w.wait(std::vector<JobId>{2});
    done = w.get_finished();
    REQUIRE(done.size() == 1);
    INFO(done[0].error);
    REQUIRE(done[0].ok);
    std::vector<std::uint8_t> back(static_cast<std::size_t>(24 * kPage));
    REQUIRE(rt->memcpy_async(back.data(), static_cast<char*>(kv) + bytes / 2, back.size(), 0) ==
            dev::ok);
    REQUIRE(rt->stream_synchronize(0) == dev::ok);
    CHECK(std::memcmp(back.data(), host.data() + kPage, back.size()) == 0);
  }
  REQUIRE(rt->free_device(kv) == dev::ok);
}

}  // namespace

TEST_CASE("sim: jobs across the pool's registration seams run in every copy mode",
          "[sim][worker]") {
  const CopyMode mode = GENERATE(CopyMode::batch, CopyMode::memcpy, CopyMode::kernel,
                                 CopyMode::staged, CopyMode::automatic);
  auto sim = kvtest::sim_with(41, 1, 5);
  round_trips_across_seams(sim, mode);
  REQUIRE(sim->device_synchronize() == dev::ok);
  const auto v = sim->violations();
  for (const auto& line : v) UNSCOPED_INFO(line);
  CHECK(v.empty());
}

TEST_CASE("gpu: jobs across the pool's registration seams run in every copy mode", "[gpu]") {
  if (cuda_device_count() == 0) SKIP("no CUDA device");
  for (const CopyMode mode : {CopyMode::batch, CopyMode::memcpy, CopyMode::kernel, CopyMode::staged,
                              CopyMode::automatic}) {
    round_trips_across_seams(cuda_runtime(), mode);
  }
}
