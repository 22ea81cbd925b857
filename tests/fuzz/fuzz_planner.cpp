// Fuzz target: the copy planner. A random KV layout (tensors over real buffers, groups sharing
// them), a random host region and a random job: the planner must either refuse the job with
// invalid_argument or return descriptors that all lie inside the buffers. The descriptors are
// then executed with memcpy, so AddressSanitizer catches any byte outside them.

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "fuzz_input.hpp"
#include "kvoffload/copy_planner.hpp"
#include "kvoffload/error.hpp"
#include "kvoffload/kv_layout.hpp"

using namespace kvoffload;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  kvfuzz::Input in(data, size);
  const auto num_tensors = static_cast<std::size_t>(in.range(1, 4));
  const auto num_groups = static_cast<std::size_t>(in.range(1, 3));
  const std::int64_t f = in.range(1, 4);
  std::vector<std::vector<std::uint8_t>> memory(num_tensors);
  std::vector<KvTensor> tensors;
  for (std::size_t t = 0; t < num_tensors; ++t) {
    const std::int64_t blocks = in.range(1, 16);
    const std::int64_t page = in.range(1, 64);
    const std::int64_t stride = page + in.range(0, 16);
    memory[t].resize(static_cast<std::size_t>(blocks * stride));
    tensors.push_back({reinterpret_cast<std::uintptr_t>(memory[t].data()),
                       blocks - in.range(0, 1),  // sometimes claims one block less
                       page, stride - in.range(0, 1) * page});
  }
  std::vector<std::vector<GroupTensor>> groups(num_groups);
  for (auto& g : groups) {
    const std::int64_t n = in.range(0, 2);
    for (std::int64_t k = 0; k < n; ++k) {
      g.push_back({static_cast<std::int32_t>(in.range(-1, static_cast<std::int64_t>(num_tensors))),
                   in.range(0, 64)});
    }
  }
  try {
    const KvLayout layout(tensors, groups, f);
    const std::int64_t host_blocks = in.range(1, 8);
    const std::int64_t block_bytes = layout.pool_block_bytes(64) + in.range(-8, 8);
    std::vector<std::uint8_t> host(
        static_cast<std::size_t>(host_blocks * std::max<std::int64_t>(block_bytes, 1)));
    const HostRegion region{reinterpret_cast<std::uintptr_t>(host.data()),
                            host_blocks,
                            block_bytes,
                            in.range(0, 8),
                            block_bytes - in.range(0, 16),
                            in.range(-1, 4)};
    const CopyPlanner planner(layout, region);
    TransferJob job;
    job.id = in.range(0, 100);
    for (std::size_t g = 0; g < num_groups; ++g) {
      const std::int64_t keys = in.range(0, 3);
      for (std::int64_t k = 0; k < keys; ++k) {
        job.keys.push_back({BlockHash::from_bytes(std::vector<std::uint8_t>{1}),
                            static_cast<std::uint32_t>(in.flag() ? g : in.range(0, 3))});
        job.host_block_ids.push_back(static_cast<HostBlockId>(in.range(-1, host_blocks)));
      }
      const std::int64_t ids = in.range(0, 3 * f);
      job.gpu.group_sizes.push_back(in.flag() ? ids : in.range(-1, 8));
      job.gpu.block_indices.push_back(in.range(-1, 12));
      for (std::int64_t i = 0; i < ids; ++i) {
        job.gpu.block_ids.push_back(static_cast<GpuBlockId>(in.range(-2, 17)));
      }
    }
    if (in.flag()) job.gpu.group_sizes.push_back(0);  // one group too many
    CopyPlan plan;
    const JobKind kind = in.flag() ? JobKind::load : JobKind::store;
    planner.plan(job, kind, plan);
    std::uint64_t total = 0;
    for (const CopyDescriptor& d : plan.descriptors) {
      // The host side never spans two registrations (CUDA refuses such a copy call).
      if (region.blocks_per_registration > 0) {
        const std::uintptr_t h = (kind == JobKind::store ? d.dst : d.src) - region.base;
        const auto span = static_cast<std::uintptr_t>(region.blocks_per_registration * block_bytes);
        if (d.bytes > 0 && h / span != (h + d.bytes - 1) / span) std::abort();
      }
      std::memmove(reinterpret_cast<void*>(d.dst), reinterpret_cast<const void*>(d.src), d.bytes);
      total += d.bytes;
    }
    if (total != plan.total_bytes) std::abort();
  } catch (const invalid_argument&) {
    // A clean refusal.
  }
  return 0;
}
