#include "kvoffload/copy_planner.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "common/block_math.hpp"
#include "common/expects.hpp"
#include "kvoffload/error.hpp"

namespace kvoffload {

CopyPlanner::CopyPlanner(const KvLayout& layout, const HostRegion& host)
    : layout_(layout), host_(host) {
  KVOFFLOAD_EXPECTS(host.base != 0 && host.num_blocks >= 1, "planner: the host region is empty");
  KVOFFLOAD_EXPECTS(host.blocks_per_registration >= 0,
                    "planner: blocks_per_registration is {} (must be >= 0)",
                    host.blocks_per_registration);
  KVOFFLOAD_EXPECTS(
      host.row_offset >= 0 && host.row_offset + host.row_bytes <= host.block_stride_bytes,
      "planner: host row [{}, {}) does not fit in a host block of {} bytes", host.row_offset,
      host.row_offset + host.row_bytes, host.block_stride_bytes);
  for (std::size_t g = 0; g < layout.num_groups(); ++g) {
    KVOFFLOAD_EXPECTS(layout.host_block_bytes(g) <= host.row_bytes,
                      "planner: group {} needs {} bytes per host block, the host row has {}", g,
                      layout.host_block_bytes(g), host.row_bytes);
    std::int64_t most = INT64_MAX;
    for (const GroupTensor& gt : layout.group(g)) {
      most = std::min(most, layout.tensors()[static_cast<std::size_t>(gt.tensor)].num_blocks);
    }
    max_block_id_.push_back(most - 1);
  }
  // Groups sharing a tensor, joined until nothing changes (a handful of groups).
  const std::size_t G = layout.num_groups();
  tensor_class_.resize(G);
  for (std::size_t g = 0; g < G; ++g) tensor_class_[g] = g;
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t a = 0; a < G; ++a) {
      for (std::size_t b = a + 1; b < G; ++b) {
        if (tensor_class_[a] == tensor_class_[b]) continue;
        bool shared = false;
        for (const GroupTensor& x : layout.group(a)) {
          for (const GroupTensor& y : layout.group(b)) shared = shared || x.tensor == y.tensor;
        }
        if (!shared) continue;
        const std::size_t low = std::min(tensor_class_[a], tensor_class_[b]);
        for (std::size_t& c : tensor_class_) {
          if (c == tensor_class_[a] || c == tensor_class_[b]) c = low;
        }
        changed = true;
      }
    }
  }
}

void CopyPlanner::check_duplicates(const TransferJob& job, JobKind kind) const {
  // Reused per thread: planning allocates nothing once warm.
  thread_local std::vector<std::pair<std::size_t, std::int64_t>> seen;
  seen.clear();
  if (kind == JobKind::load) {  // loads write GPU blocks
    std::size_t at = 0;
    for (std::size_t g = 0; g < layout_.num_groups(); ++g) {
      for (std::int64_t p = 0; p < job.gpu.group_sizes[g]; ++p, ++at) {
        seen.emplace_back(tensor_class_[g], job.gpu.block_ids[at]);
      }
    }
  } else {  // stores write host blocks
    for (const HostBlockId h : job.host_block_ids) seen.emplace_back(layout_.num_groups(), h);
  }
  std::sort(seen.begin(), seen.end());
  const auto twice = std::adjacent_find(seen.begin(), seen.end());
  if (twice == seen.end()) return;
  if (kind == JobKind::load) {
    throw invalid_argument(fmt::format(
        "job {}: GPU block {} is loaded twice (in group {} or a group sharing its tensors): "
        "two copies into one block leave whichever lands last",
        job.id, twice->second, twice->first));
  }
  throw invalid_argument(fmt::format(
      "job {}: host block {} is stored twice: two offloaded blocks cannot share one host block",
      job.id, twice->second));
}

void CopyPlanner::check(const TransferJob& job) const {
  const auto G = static_cast<std::int64_t>(layout_.num_groups());
  check_job_invariants(job, G, layout_.block_size_factor());
  std::size_t at = 0;
  for (std::size_t g = 0; g < layout_.num_groups(); ++g) {
    for (std::int64_t p = 0; p < job.gpu.group_sizes[g]; ++p, ++at) {
      const GpuBlockId id = job.gpu.block_ids[at];
      KVOFFLOAD_EXPECTS(id <= max_block_id_[g],
                        "job {} group {}: GPU block {} is outside the KV cache (0..{})", job.id, g,
                        id, max_block_id_[g]);
    }
  }
  for (std::size_t k = 0; k < job.host_block_ids.size(); ++k) {
    const HostBlockId h = job.host_block_ids[k];
    KVOFFLOAD_EXPECTS(h >= 0 && h < host_.num_blocks,
                      "job {} group {}: host block {} is outside the pool (0..{})", job.id,
                      job.keys[k].group, h, host_.num_blocks - 1);
  }
}

void CopyPlanner::plan(const TransferJob& job, JobKind kind, CopyPlan& out) const {
  check(job);
  check_duplicates(job, kind);
  out.job = job.id;
  out.kind = kind;
  out.descriptors.clear();
  out.total_bytes = 0;
  const std::int64_t f = layout_.block_size_factor();
  std::size_t first_id = 0;   // the group's first entry in gpu.block_ids
  std::size_t first_key = 0;  // ... and in host_block_ids
  // The registration holding the host side of descriptors.back()'s last piece: a piece from
  // another registration starts a new descriptor even when the addresses are adjacent.
  const std::int64_t per_registration = host_.blocks_per_registration;
  std::int64_t last_registration = -1;
  for (std::size_t g = 0; g < layout_.num_groups(); ++g) {
    const std::int64_t size = job.gpu.group_sizes[g];
    const std::int64_t skip = job.gpu.block_indices[g] % f;
    // Tensor by tensor, GPU block by GPU block: consecutive blocks of one tensor are adjacent
    // on both sides when ids are consecutive and the stride equals the page, so they merge.
    for (std::size_t k = 0; k < layout_.group(g).size(); ++k) {
      const GroupTensor& gt = layout_.group(g)[k];
      const KvTensor& t = layout_.tensors()[static_cast<std::size_t>(gt.tensor)];
      const auto page = static_cast<std::uint64_t>(gt.page_bytes);
      for (std::int64_t p = 0; p < size; ++p) {
        const std::int64_t pos = skip + p;
        const HostBlockId host_id =
            job.host_block_ids[first_key + static_cast<std::size_t>(pos / f)];
        const std::uintptr_t gpu =
            t.base +
            static_cast<std::uintptr_t>(job.gpu.block_ids[first_id + static_cast<std::size_t>(p)]) *
                static_cast<std::uintptr_t>(t.block_stride_bytes);
        const std::uintptr_t host =
            host_.base +
            static_cast<std::uintptr_t>(host_id) *
                static_cast<std::uintptr_t>(host_.block_stride_bytes) +
            static_cast<std::uintptr_t>(host_.row_offset + layout_.host_offset(g, k, pos % f));
        const std::uintptr_t src = kind == JobKind::store ? gpu : host;
        const std::uintptr_t dst = kind == JobKind::store ? host : gpu;
        const std::int64_t registration = per_registration > 0 ? host_id / per_registration : 0;
        if (!out.descriptors.empty() && registration == last_registration) {
          CopyDescriptor& last = out.descriptors.back();
          if (last.src + last.bytes == src && last.dst + last.bytes == dst) {
            last.bytes += page;
            continue;
          }
        }
        last_registration = registration;
        out.descriptors.push_back({src, dst, page});
      }
      out.total_bytes += page * static_cast<std::uint64_t>(size);
    }
    first_id += static_cast<std::size_t>(size);
    first_key += static_cast<std::size_t>(detail::host_blocks_spanned(size, skip, f));
  }
  // Large runs first: the backend starts them early and spreads the small ones after.
  std::sort(out.descriptors.begin(), out.descriptors.end(),
            [](const CopyDescriptor& a, const CopyDescriptor& b) {
              return a.bytes != b.bytes ? a.bytes > b.bytes : a.src < b.src;
            });
}

}  // namespace kvoffload
