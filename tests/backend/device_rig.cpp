#include "backend/device_rig.hpp"

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kvoffload/types.hpp"

namespace kvtest {

using namespace kvoffload;

namespace {
void ok(int e, const char* what, const DeviceRuntime& rt) {
  if (e != dev::ok) throw std::runtime_error(std::string(what) + ": " + rt.describe(e));
}

/// A synchronous copy through a temporary stream.
void copy_sync(DeviceRuntime& rt, void* dst, const void* src, std::size_t bytes) {
  StreamHandle s = 0;
  ok(rt.stream_create(0, &s), "stream_create", rt);
  ok(rt.memcpy_async(dst, src, bytes, s), "memcpy_async", rt);
  ok(rt.stream_synchronize(s), "stream_synchronize", rt);
  ok(rt.stream_destroy(s), "stream_destroy", rt);
}
}  // namespace

DeviceRig::DeviceRig(std::shared_ptr<DeviceRuntime> runtime, std::int64_t f, std::int64_t page_,
                     std::int64_t blocks_, std::int64_t host_blocks)
    : rt(std::move(runtime)), page(page_), blocks(blocks_) {
  std::vector<KvTensor> tensors;
  const auto bytes = static_cast<std::size_t>(page * blocks);
  for (std::size_t t = 0; t < 4; ++t) {
    void* p = nullptr;
    ok(rt->malloc_device(&p, bytes), "malloc_device", *rt);
    device.push_back(p);
    mirror.emplace_back(bytes);
    for (std::size_t i = 0; i < bytes; ++i) mirror.back()[i] = initial_byte(t, i);
    copy_sync(*rt, p, mirror.back().data(), bytes);
    tensors.push_back({reinterpret_cast<std::uintptr_t>(p), blocks, page, page});
  }
  layout = std::make_unique<KvLayout>(
      tensors,
      std::vector<std::vector<GroupTensor>>{{{0, page}, {1, page}}, {{2, page}, {3, page}}}, f);
  const std::int64_t block = layout->pool_block_bytes();
  pool_bytes = static_cast<std::size_t>(block * host_blocks);
  ok(rt->malloc_host(&pool_memory, pool_bytes), "malloc_host", *rt);
  std::memset(pool_memory, 0x5a, pool_bytes);
  region = {reinterpret_cast<std::uintptr_t>(pool_memory), host_blocks, block, 0, block};
}

DeviceRig::~DeviceRig() {
  (void)rt->device_synchronize();
  for (void* p : device) (void)rt->free_device(p);
  (void)rt->free_host(pool_memory);
}

std::vector<std::uint8_t> DeviceRig::read(std::size_t t) const {
  std::vector<std::uint8_t> out(mirror[t].size());
  copy_sync(*rt, out.data(), device[t], out.size());
  return out;
}

std::vector<std::uint8_t> DeviceRig::pool() const {
  std::vector<std::uint8_t> out(pool_bytes);
  rt->host_access(pool_memory, pool_bytes, false);
  std::memcpy(out.data(), pool_memory, pool_bytes);
  return out;
}

std::vector<std::uint8_t> DeviceRig::expected_pool(const std::vector<TransferJob>& jobs,
                                                   std::vector<std::uint8_t> before) const {
  std::vector<KvTensor> tensors;
  for (const auto& m : mirror) {
    tensors.push_back({reinterpret_cast<std::uintptr_t>(m.data()), blocks, page, page});
  }
  KvLayout mirror_layout(tensors, {{{0, page}, {1, page}}, {{2, page}, {3, page}}},
                         layout->block_size_factor());
  HostRegion r = region;
  r.base = reinterpret_cast<std::uintptr_t>(before.data());
  const CopyPlanner planner(mirror_layout, r);
  CopyPlan plan;
  for (const TransferJob& job : jobs) {
    planner.plan(job, JobKind::store, plan);
    for (const CopyDescriptor& d : plan.descriptors) {
      std::memcpy(reinterpret_cast<void*>(d.dst), reinterpret_cast<const void*>(d.src), d.bytes);
    }
  }
  return before;
}

TransferJob DeviceRig::random_job(JobId id, std::int64_t f, std::mt19937& rng,
                                  std::vector<GpuBlockId>& gpu, std::vector<HostBlockId>& host) {
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

bool same_bytes(const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want) {
  if (got.size() != want.size()) {
    std::fprintf(stderr, "same_bytes: %zu bytes, expected %zu\n", got.size(), want.size());
    return false;
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      std::fprintf(stderr, "same_bytes: byte %zu is %u, expected %u\n", i, got[i], want[i]);
      return false;
    }
  }
  return true;
}

}  // namespace kvtest
