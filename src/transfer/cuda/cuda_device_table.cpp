// CudaBackend::submit_device_table: a block table already on the GPU, compacted (CUB),
// checked and turned into copy pieces on the device, with no host round trip.

#include <algorithm>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "common/block_math.hpp"
#include "common/expects.hpp"
#include "kvoffload/cuda_backend.hpp"
#include "transfer/cuda/cuda_backend_impl.hpp"

namespace kvoffload {

using detail::align16;
using detail::DevicePiece;
using detail::Scope;

Ticket CudaBackend::submit_device_table(const TransferJob& job, JobKind kind,
                                        const KvLayout& layout, const HostRegion& host,
                                        const std::int32_t* table,
                                        std::span<const std::int64_t> offsets) {
  using detail::DeviceJobLayout;
  Impl& s = *impl_;
  const detail::Range range(
      *s.rt, fmt::format("kvoffload {} job {} (device table)", to_string(kind), job.id));
  const auto G = static_cast<int>(layout.num_groups());
  KVOFFLOAD_EXPECTS(kernel_available(),
                    "job {}: the device-table path needs mapped pinned host memory", job.id);
  KVOFFLOAD_EXPECTS(G <= DeviceJobLayout::kMaxGroups, "job {}: {} groups, the device path takes {}",
                    job.id, G, DeviceJobLayout::kMaxGroups);
  KVOFFLOAD_EXPECTS(offsets.size() == layout.num_groups() + 1,
                    "job {}: {} table offsets for {} groups (need groups + 1)", job.id,
                    offsets.size(), G);
  KVOFFLOAD_EXPECTS(offsets[0] == 0, "job {}: table offsets must start at 0, not {}", job.id,
                    offsets[0]);
  for (int g = 0; g < G; ++g) {
    KVOFFLOAD_EXPECTS(
        offsets[static_cast<std::size_t>(g) + 1] >= offsets[static_cast<std::size_t>(g)],
        "job {} group {}: table offsets decrease ({} then {})", job.id, g,
        offsets[static_cast<std::size_t>(g)], offsets[static_cast<std::size_t>(g) + 1]);
  }
  KVOFFLOAD_EXPECTS(table != nullptr || offsets[static_cast<std::size_t>(G)] == 0,
                    "job {}: no block table", job.id);
  check_job_shape(job, G, layout.block_size_factor());
  for (std::size_t i = 0; i < job.host_block_ids.size(); ++i) {
    KVOFFLOAD_EXPECTS(job.host_block_ids[i] >= 0 && job.host_block_ids[i] < host.num_blocks,
                      "job {}: host block {} at position {} is outside the host region (0 to {})",
                      job.id, job.host_block_ids[i], i, host.num_blocks - 1);
  }
  DeviceJobLayout L{};
  L.groups = G;
  L.block_size_factor = layout.block_size_factor();
  L.host_base = host.base;
  L.host_stride = static_cast<std::uint64_t>(host.block_stride_bytes);
  L.store = kind == JobKind::store;
  std::int64_t first_host = 0;
  std::uint64_t total = 0;
  for (int g = 0; g < G; ++g) {
    const auto gi = static_cast<std::size_t>(g);
    const auto& tensors = layout.group(gi);
    KVOFFLOAD_EXPECTS(tensors.size() <= DeviceJobLayout::kMaxTensors,
                      "job {} group {}: {} tensors, the device path takes {}", job.id, g,
                      tensors.size(), DeviceJobLayout::kMaxTensors);
    KVOFFLOAD_EXPECTS(host.row_offset + layout.host_block_bytes(gi) <= host.block_stride_bytes,
                      "job {} group {}: its host block does not fit the host region's stride",
                      job.id, g);
    const std::int64_t size = job.gpu.group_sizes[gi];
    const std::int64_t index = job.gpu.block_indices[gi];
    const std::int64_t f = L.block_size_factor;
    L.block_index[g] = index;
    L.first_host[g] = first_host;
    L.host_count[g] = detail::host_blocks_spanned(size, index, f);
    L.expected[g] = size;
    first_host += L.host_count[g];
    L.tensors[g] = static_cast<int>(tensors.size());
    L.max_tensors = std::max(L.max_tensors, L.tensors[g]);
    std::int64_t blocks = INT32_MAX;
    for (std::size_t k = 0; k < tensors.size(); ++k) {
      const KvTensor& t = layout.tensors()[static_cast<std::size_t>(tensors[k].tensor)];
      blocks = std::min(blocks, t.num_blocks);
      L.tensor[g][k] = {t.base, static_cast<std::uint64_t>(t.block_stride_bytes),
                        static_cast<std::uint64_t>(tensors[k].page_bytes),
                        static_cast<std::uint64_t>(host.row_offset + layout.host_offset(gi, k, 0))};
      total += static_cast<std::uint64_t>(tensors[k].page_bytes * size);
    }
    L.max_id[g] = blocks - 1;
  }
  const std::int64_t n = offsets[static_cast<std::size_t>(G)];
  const auto H = job.host_block_ids.size();

  auto owned = std::make_shared<Impl::Job>();
  owned->rt = s.rt;
  owned->plan.job = job.id;
  owned->plan.kind = kind;
  owned->plan.total_bytes = total;
  owned->mode = CopyMode::kernel;
  owned->start = std::chrono::steady_clock::now();
  std::lock_guard lock(s.mutex);
  owned->ticket = s.next_ticket++;
  Impl::Job& j = *owned;
  s.in_order[L.store ? 0 : 1].push_back(std::move(owned));
  // From here on nothing throws out of submit_device_table: the job is queued, and any
  // failure fails it.
  std::optional<Scope> scope;
  std::optional<std::size_t> picked;
  try {
    if (s.stopping) {
      j.error = fmt::format("job {}: backend is shut down", job.id);
      return j.ticket;
    }
    try {
      scope.emplace(*s.rt, s.config.device);
    } catch (const cuda_error& e) {
      j.error = fmt::format("job {} (device table): {}", job.id, e.what());
      return j.ticket;
    }
    if (!s.capture_free(j, true, std::nullopt)) return j.ticket;  // failed, with its error
    ++s.stats.jobs_device_table;
    std::size_t si = s.pick_stream(L.store);
    picked = si;
    StreamHandle stream = s.streams[si];
    // Inputs, laid out alike in pinned memory and on the device: offsets, expected, max ids,
    // host ids; then the flag the device writes back.
    const std::size_t o_offsets = 0;
    const std::size_t o_expected = o_offsets + align16(8 * offsets.size());
    const std::size_t o_max = o_expected + align16(8 * static_cast<std::size_t>(G));
    const std::size_t o_host = o_max + align16(8 * static_cast<std::size_t>(G));
    const std::size_t inputs = o_host + align16(4 * std::max<std::size_t>(H, 1));
    const std::size_t o_flag = inputs;
    const std::size_t pinned_bytes = o_flag + 16;
    std::size_t temp_bytes = 0;
    int e = s.rt->compaction_temp_bytes(std::max<std::int64_t>(n, 1), G, &temp_bytes);
    if (e == dev::ok) e = s.rt->event_create(&j.done);
    if (e != dev::ok) j.done = 0;
    const auto pieces = static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(L.max_tensors);
    const std::size_t o_temp = align16(inputs);
    const std::size_t o_count = o_temp + align16(temp_bytes);
    const std::size_t o_groups = o_count + 16;
    const std::size_t o_out = o_groups + align16(8 * static_cast<std::size_t>(G));
    const std::size_t o_dflag =
        o_out + align16(4 * static_cast<std::size_t>(std::max<std::int64_t>(n, 1)));
    const std::size_t o_pieces = o_dflag + 16;
    const std::size_t scratch_bytes = o_pieces + pieces * sizeof(DevicePiece) + 16;
    // The picked stream's rings, else those of the direction's other streams.
    const std::size_t first = L.store ? 0 : static_cast<std::size_t>(s.config.store_streams);
    const auto count =
        static_cast<std::size_t>(L.store ? s.config.store_streams : s.config.load_streams);
    bool reserved = e != dev::ok || s.reserve_upload(j, si, pinned_bytes, scratch_bytes);
    for (std::size_t k = 0; !reserved && k < count; ++k) {
      if (first + k == si || !s.reserve_upload(j, first + k, pinned_bytes, scratch_bytes)) continue;
      reserved = true;
      si = first + k;
      picked = si;
      stream = s.streams[si];
    }
    if (!reserved) {
      j.error = fmt::format(
          "job {} (device table): its inputs and scratch ({} and {} bytes) fit no stream's "
          "upload rings now (ring_bytes {} each); nothing was copied",
          job.id, pinned_bytes, scratch_bytes, s.config.ring_bytes);
      s.release(j);
      return j.ticket;  // failed; nothing queued
    }
    if (e == dev::ok) {
      std::byte* p = j.upload.host;
      s.rt->host_access(p, pinned_bytes, true);
      std::memcpy(p + o_offsets, offsets.data(), 8 * offsets.size());
      std::memcpy(p + o_expected, job.gpu.group_sizes.data(), 8 * static_cast<std::size_t>(G));
      std::memcpy(p + o_max, L.max_id, 8 * static_cast<std::size_t>(G));
      for (std::size_t i = 0; i < H; ++i) {
        const auto id = static_cast<std::int32_t>(job.host_block_ids[i]);
        std::memcpy(p + o_host + 4 * i, &id, 4);
      }
      std::memset(p + o_flag, 0, 16);
      j.mismatch = reinterpret_cast<const int*>(p + o_flag);
    }
    // The engine writes the table on its compute stream: wait before the first read of it.
    if (e == dev::ok) e = s.wait_for_compute(stream, true, std::nullopt);
    if (e == dev::ok) e = s.rt->memcpy_async(j.upload.device, j.upload.host, inputs, stream);
    std::byte* d = j.upload.device;
    auto* d_flag = reinterpret_cast<int*>(d + o_dflag);
    if (e == dev::ok) {
      CompactArgs a;
      a.ids = table;
      a.n = n;
      a.offsets = reinterpret_cast<const std::int64_t*>(d + o_offsets);
      a.groups = G;
      a.expected = reinterpret_cast<const std::int64_t*>(d + o_expected);
      a.max_id = reinterpret_cast<const std::int64_t*>(d + o_max);
      a.out = reinterpret_cast<std::int32_t*>(d + o_out);
      a.count = reinterpret_cast<std::int64_t*>(d + o_count);
      a.group_counts = reinterpret_cast<std::int64_t*>(d + o_groups);
      a.mismatch = d_flag;
      a.temp = d + o_temp;
      a.temp_bytes = temp_bytes;
      e = s.rt->launch_compact(a, stream);
    }
    auto* d_pieces = reinterpret_cast<DevicePiece*>(d + o_pieces);
    if (e == dev::ok && pieces > 0) {
      // Reads the flag the compaction wrote (same stream): a failed check builds empty pieces.
      e = s.rt->launch_build_pieces(L, reinterpret_cast<const std::int32_t*>(d + o_out),
                                    reinterpret_cast<const std::int64_t*>(d + o_count),
                                    reinterpret_cast<const std::int64_t*>(d + o_groups),
                                    reinterpret_cast<const std::int32_t*>(d + o_host), d_flag,
                                    d_pieces, pieces, s.config.kernel_ctas, s.config.kernel_threads,
                                    stream);
      if (e == dev::ok) {
        e = s.rt->launch_copy_pieces(d_pieces, pieces, s.config.kernel_ctas,
                                     s.config.kernel_threads, stream);
      }
    }
    if (e == dev::ok) e = s.rt->memcpy_async(j.upload.host + o_flag, d_flag, sizeof(int), stream);
    if (e == dev::ok) e = s.rt->event_record(j.done, stream);
    if (e == dev::ok) {
      j.recorded = true;
      j.failed = false;
    } else {
      s.fail_submission(j, si, e, "device table");
    }
  } catch (const std::exception& e) {
    s.abandon(j, picked, e.what());  // reported once, by poll
  } catch (...) {
    s.abandon(j, picked, "an unknown exception");
  }
  return j.ticket;
}

}  // namespace kvoffload
