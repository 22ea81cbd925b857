// [gpu] tests of the CUDA backend; they skip without a device (scripts/gpu-check runs them).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <random>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include "kvoffload/cuda_backend.hpp"
#include "kvoffload/host_backend.hpp"
#include "kvoffload/kv_layout.hpp"
#include "kvoffload/pinned_host_pool.hpp"
#include "kvoffload/transfer_engine.hpp"

using namespace kvoffload;

namespace {

#define CUDA_OK(call) REQUIRE((call) == cudaSuccess)

/// A per-layer K/V layout in device memory (and its host mirror), two groups of two tensors,
/// and a pinned pool.
struct GpuCache {
  GpuCache(std::int64_t f, std::int64_t page, std::int64_t blocks, std::int64_t host_blocks) {
    std::vector<KvTensor> tensors;
    for (int t = 0; t < 4; ++t) {
      void* p = nullptr;
      CUDA_OK(cudaMalloc(&p, static_cast<std::size_t>(page * blocks)));
      device.push_back(p);
      mirror.emplace_back(static_cast<std::size_t>(page * blocks));
      for (std::size_t i = 0; i < mirror.back().size(); ++i) {
        mirror.back()[i] =
            static_cast<std::uint8_t>((i * 7 + static_cast<std::size_t>(t) * 13) ^ (i >> 9));
      }
      CUDA_OK(cudaMemcpy(p, mirror.back().data(), mirror.back().size(), cudaMemcpyHostToDevice));
      tensors.push_back({reinterpret_cast<std::uintptr_t>(p), blocks, page, page});
    }
    layout = std::make_unique<KvLayout>(
        tensors,
        std::vector<std::vector<GroupTensor>>{{{0, page}, {1, page}}, {{2, page}, {3, page}}}, f);
    PoolConfig pc;
    pc.block_bytes = layout->pool_block_bytes();
    pc.host_blocks = host_blocks;
    pc.pinning = Pinning::require;
    pool = std::make_unique<PinnedHostPool>(pc);
    region = {reinterpret_cast<std::uintptr_t>(pool->data()), pool->num_blocks(),
              static_cast<std::int64_t>(pool->block_bytes()), 0,
              static_cast<std::int64_t>(pool->block_bytes())};
  }
  ~GpuCache() {
    for (void* p : device) (void)cudaFree(p);
  }
  std::vector<std::uint8_t> read(std::size_t t) const {
    std::vector<std::uint8_t> out(mirror[t].size());
    (void)cudaMemcpy(out.data(), device[t], out.size(), cudaMemcpyDeviceToHost);
    return out;
  }
  std::vector<void*> device;
  std::vector<std::vector<std::uint8_t>> mirror;
  std::unique_ptr<KvLayout> layout;
  std::unique_ptr<PinnedHostPool> pool;
  HostRegion region;
};

TransferJob job_for(JobId id, std::int64_t f, std::mt19937& rng, std::vector<GpuBlockId>& gpu,
                    std::vector<HostBlockId>& host) {
  TransferJob job;
  job.id = id;
  for (std::uint32_t g = 0; g < 2; ++g) {
    const std::int64_t size = 1 + static_cast<std::int64_t>(rng() % static_cast<unsigned>(3 * f));
    const std::int64_t index = static_cast<std::int64_t>(rng() % static_cast<unsigned>(2 * f));
    job.gpu.group_sizes.push_back(size);
    job.gpu.block_indices.push_back(index);
    for (std::int64_t p = 0; p < size; ++p) {
      job.gpu.block_ids.push_back(gpu.back());
      gpu.pop_back();
    }
    for (std::int64_t h = 0; h < (size + index % f + f - 1) / f; ++h) {
      job.keys.push_back(Key{BlockHash::from_hex("ee"), g});
      job.host_block_ids.push_back(host.back());
      host.pop_back();
    }
  }
  return job;
}

}  // namespace

TEST_CASE("Every copy mode round-trips random jobs byte-exactly, like the HostBackend",
          "[gpu][cuda_backend]") {
  if (!CudaBackend::available()) SKIP("no CUDA device");
  const CopyMode mode = GENERATE(CopyMode::automatic, CopyMode::batch, CopyMode::memcpy,
                                 CopyMode::kernel, CopyMode::staged);
  const std::int64_t f = GENERATE(1, 4, 16);
  INFO("mode " << to_string(mode) << " f " << f);
  GpuCache cache(f, 4096, 512, 256);
  std::mt19937 rng(static_cast<unsigned>(f) * 31 + static_cast<unsigned>(mode));
  std::vector<GpuBlockId> gpu;
  for (GpuBlockId id = 1; id < 512; ++id) gpu.push_back(id);
  std::shuffle(gpu.begin(), gpu.end(), rng);
  std::vector<HostBlockId> host;
  for (HostBlockId id = 0; id < 256; ++id) host.push_back(id);
  std::shuffle(host.begin(), host.end(), rng);

  CudaBackendConfig c;
  c.mode = mode;
  c.small_piece_bytes = 1 << 20;  // make automatic pick the kernel modes for 4 KiB pages
  c.staged_min_pieces = 4;
  TransferEngine engine(*cache.layout, cache.region, std::make_unique<CudaBackend>(c));
  std::vector<TransferJob> stores, loads;
  for (JobId j = 0; j < 6; ++j) stores.push_back(job_for(2 * j, f, rng, gpu, host));
  for (const TransferJob& s : stores) {
    TransferJob l = s;
    l.id = s.id + 1;
    for (auto& id : l.gpu.block_ids) {
      id = gpu.back();
      gpu.pop_back();
    }
    loads.push_back(l);
  }
  std::vector<JobId> all;
  for (const TransferJob& s : stores) {
    engine.submit_store(s);
    all.push_back(s.id);
  }
  engine.wait(all);
  auto done = engine.get_finished();
  REQUIRE(done.size() == stores.size());
  for (const auto& d : done) CHECK(d.ok);
  // The host pool must hold what the HostBackend puts there from the host mirror.
  std::vector<std::uint8_t> host_expect(cache.pool->size_bytes());
  std::memcpy(host_expect.data(), cache.pool->data(), host_expect.size());
  {
    std::vector<KvTensor> mirror_tensors;
    for (std::size_t t = 0; t < 4; ++t) {
      mirror_tensors.push_back(
          {reinterpret_cast<std::uintptr_t>(cache.mirror[t].data()), 512, 4096, 4096});
    }
    KvLayout mirror_layout(mirror_tensors, {{{0, 4096}, {1, 4096}}, {{2, 4096}, {3, 4096}}}, f);
    HostRegion region = cache.region;
    region.base = reinterpret_cast<std::uintptr_t>(host_expect.data());
    TransferEngine host_engine(mirror_layout, region, std::make_unique<HostBackend>());
    for (const TransferJob& s : stores) host_engine.submit_store(s);
    host_engine.wait(all);
    (void)host_engine.get_finished();
  }
  CHECK(std::memcmp(host_expect.data(), cache.pool->data(), host_expect.size()) == 0);
  // Concurrent loads back into fresh blocks.
  all.clear();
  for (const TransferJob& l : loads) {
    engine.submit_load(l);
    all.push_back(l.id);
  }
  engine.wait(all);
  done = engine.get_finished();
  REQUIRE(done.size() == loads.size());
  for (const auto& d : done) CHECK(d.ok);
  for (std::size_t j = 0; j < loads.size(); ++j) {
    std::size_t at = 0;
    for (std::size_t g = 0; g < 2; ++g) {
      for (std::int64_t p = 0; p < loads[j].gpu.group_sizes[g]; ++p, ++at) {
        for (std::size_t k = 0; k < 2; ++k) {
          const std::size_t t = 2 * g + k;
          std::vector<std::uint8_t> page(4096);
          CUDA_OK(cudaMemcpy(
              page.data(),
              static_cast<std::uint8_t*>(cache.device[t]) + loads[j].gpu.block_ids[at] * 4096, 4096,
              cudaMemcpyDeviceToHost));
          CHECK(std::memcmp(page.data(),
                            cache.mirror[t].data() + stores[j].gpu.block_ids[at] * 4096,
                            4096) == 0);
        }
      }
    }
  }
}

TEST_CASE("A failing copy fails its job and nothing else", "[gpu][cuda_backend]") {
  if (!CudaBackend::available()) SKIP("no CUDA device");
  CudaBackendConfig c;
  c.mode = CopyMode::memcpy;
  CudaBackend backend(c);
  void* d = nullptr;
  CUDA_OK(cudaMalloc(&d, 1 << 20));
  void* h = nullptr;
  CUDA_OK(cudaMallocHost(&h, 1 << 20));
  CopyPlan bad;
  bad.job = 1;
  bad.direction = Direction::store;
  bad.descriptors = {{reinterpret_cast<std::uintptr_t>(d), 16, 4096}};  // a wild destination
  bad.total_bytes = 4096;
  CopyPlan good = bad;
  good.job = 2;
  good.descriptors = {
      {reinterpret_cast<std::uintptr_t>(d), reinterpret_cast<std::uintptr_t>(h), 4096}};
  backend.submit(bad);
  backend.wait(backend.submit(good));
  std::vector<BackendResult> done;
  backend.poll(done);
  REQUIRE(done.size() == 2);
  CHECK_FALSE(done[0].ok);
  CHECK_FALSE(done[0].error.empty());
  CHECK(done[1].ok);
  (void)cudaFree(d);
  (void)cudaFreeHost(h);
}

TEST_CASE("The GPU compaction equals the host filter for 1 to 1M ids", "[gpu][compaction]") {
  if (!CudaBackend::available()) SKIP("no CUDA device");
  std::mt19937 rng(3);
  DeviceCompactor compactor(1 << 20, 4);
  for (const std::int64_t n : {1, 1000, 1 << 20}) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
    for (auto& id : ids) id = rng() % 3 == 0 ? 0 : static_cast<std::int32_t>(1 + rng() % 1000);
    const std::vector<std::int64_t> offsets{0, n / 3, n / 2, n};
    std::vector<std::int64_t> expected(3, 0);
    std::vector<std::int32_t> want;
    for (std::size_t g = 0; g < 3; ++g) {
      for (std::int64_t i = offsets[g]; i < offsets[g + 1]; ++i) {
        if (ids[static_cast<std::size_t>(i)] != 0) {
          ++expected[g];
          want.push_back(ids[static_cast<std::size_t>(i)]);
        }
      }
    }
    std::int32_t *d_ids, *d_out;
    std::int64_t *d_offsets, *d_expected, *d_count, *d_groups;
    int* d_mismatch;
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d_ids), ids.size() * 4));
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d_out), ids.size() * 4));
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d_offsets), 4 * 8));
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d_expected), 3 * 8));
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d_count), 8));
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d_groups), 3 * 8));
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d_mismatch), sizeof(int)));
    CUDA_OK(cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_offsets, offsets.data(), 4 * 8, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_expected, expected.data(), 3 * 8, cudaMemcpyHostToDevice));
    compactor.compact(d_ids, n, d_offsets, 3, d_expected, d_out, d_count, d_groups, d_mismatch, 0);
    CUDA_OK(cudaDeviceSynchronize());
    std::int64_t count = 0;
    int mismatch = -1;
    CUDA_OK(cudaMemcpy(&count, d_count, 8, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(&mismatch, d_mismatch, sizeof(int), cudaMemcpyDeviceToHost));
    std::vector<std::int32_t> got(static_cast<std::size_t>(count));
    CUDA_OK(cudaMemcpy(got.data(), d_out, got.size() * 4, cudaMemcpyDeviceToHost));
    CHECK(got == want);
    CHECK(mismatch == 0);
    // A wrong expectation is caught on the device.
    ++expected[1];
    CUDA_OK(cudaMemcpy(d_expected, expected.data(), 3 * 8, cudaMemcpyHostToDevice));
    compactor.compact(d_ids, n, d_offsets, 3, d_expected, d_out, d_count, d_groups, d_mismatch, 0);
    CUDA_OK(cudaMemcpy(&mismatch, d_mismatch, sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(mismatch == 1);
    for (void* p :
         {static_cast<void*>(d_ids), static_cast<void*>(d_out), static_cast<void*>(d_offsets),
          static_cast<void*>(d_expected), static_cast<void*>(d_count), static_cast<void*>(d_groups),
          static_cast<void*>(d_mismatch)}) {
      (void)cudaFree(p);
    }
  }
}

TEST_CASE("The device-table path drops null ids on the GPU and copies like the planner",
          "[gpu][cuda_backend][compaction]") {
  if (!CudaBackend::available()) SKIP("no CUDA device");
  const std::int64_t f = 4;
  GpuCache cache(f, 4096, 64, 16);
  // Group 0: four blocks from sub-block 0; group 1 (a window): its offloaded block's first two
  // sub-blocks are null, so two real ids starting at sub-block 2.
  TransferJob job;
  job.id = 77;
  job.gpu = {{5, 6, 7, 8, 20, 21}, {4, 2}, {0, 2}};
  job.keys = {Key{BlockHash::from_hex("01"), 0}, Key{BlockHash::from_hex("02"), 1}};
  job.host_block_ids = {3, 9};
  const std::vector<std::int32_t> table{5, 6, 7, 8, 0, 0, 20, 21};
  const std::vector<std::int64_t> offsets{0, 4, 8};
  std::int32_t* d_table = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d_table), table.size() * 4));
  CUDA_OK(cudaMemcpy(d_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  CudaBackend backend;
  if (!backend.kernel_available()) SKIP("no mapped pinned memory on this system");
  backend.wait(backend.submit_device_table(job, Direction::store, *cache.layout, cache.region,
                                           d_table, offsets));
  // A job whose group sizes disagree with the table fails.
  TransferJob wrong = job;
  wrong.id = 78;
  wrong.gpu.group_sizes = {4, 3};
  wrong.gpu.block_indices = {0, 1};
  backend.wait(backend.submit_device_table(wrong, Direction::store, *cache.layout, cache.region,
                                           d_table, offsets));
  std::vector<BackendResult> done;
  backend.poll(done);
  REQUIRE(done.size() == 2);
  CHECK(done[0].ok);
  CHECK_FALSE(done[1].ok);
  // The host blocks hold the pages the planner would have copied from the mirror.
  std::vector<KvTensor> mirror_tensors;
  for (std::size_t t = 0; t < 4; ++t) {
    mirror_tensors.push_back(
        {reinterpret_cast<std::uintptr_t>(cache.mirror[t].data()), 64, 4096, 4096});
  }
  KvLayout mirror_layout(mirror_tensors, {{{0, 4096}, {1, 4096}}, {{2, 4096}, {3, 4096}}}, f);
  std::vector<std::uint8_t> expect(cache.pool->size_bytes());
  HostRegion region = cache.region;
  region.base = reinterpret_cast<std::uintptr_t>(expect.data());
  CopyPlan plan;
  CopyPlanner(mirror_layout, region).plan(job, Direction::store, plan);
  for (const auto& d : plan.descriptors) {
    std::memcpy(reinterpret_cast<void*>(d.dst), reinterpret_cast<const void*>(d.src), d.bytes);
  }
  for (const HostBlockId h : job.host_block_ids) {
    const auto off = static_cast<std::size_t>(h) * cache.pool->block_bytes();
    // Sub-blocks 0 and 1 of group 1's block were never written by either path.
    CHECK(std::memcmp(expect.data() + off + (h == 9 ? 2 * 4096 : 0),
                      cache.pool->data() + off + (h == 9 ? 2 * 4096 : 0),
                      h == 9 ? 2 * 4096 : cache.pool->block_bytes()) == 0);
  }
  (void)cudaFree(d_table);
}
