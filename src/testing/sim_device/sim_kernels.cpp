// SimDevice's kernels: the copy kernel, the device-table piece builder and the compaction,
// their __host__ __device__ bodies run on the CPU in stream order, with the accesses they make
// checked like any operation's.

#include <algorithm>

#include "kvoffload/copy_planner.hpp"
#include "kvoffload/detail/copy_body.hpp"
#include "kvoffload/testing/sim_device.hpp"
#include "testing/sim_device/sim_device_state.hpp"

namespace kvoffload {

using sim::range;

int SimDevice::launch_copy_pieces(const detail::DevicePiece* pieces, std::uint64_t count, int ctas,
                                  int threads, StreamHandle stream) noexcept {
  std::lock_guard lock(s_->m);
  State::Stream* st = nullptr;
  if (const int e = s_->kernel_stream("launch_copy_pieces", stream, ctas, threads, &st)) return e;
  if (count == 0) return dev::ok;
  const auto warps = static_cast<std::uint64_t>(ctas) * static_cast<std::uint64_t>(threads / 32);
  State::Op op;
  op.name = "copy_pieces kernel";
  op.kernel_copy = true;
  op.plan = [this, pieces, count](std::vector<SimAccess>& acc) {
    const auto base = reinterpret_cast<std::uintptr_t>(pieces);
    if (!s_->device_accessible(base, count * sizeof(detail::DevicePiece))) {
      return dev::illegal_address;
    }
    acc.push_back({base, base + count * sizeof(detail::DevicePiece), false});
    for (std::uint64_t i = 0; i < count; ++i) {
      const detail::DevicePiece& p = pieces[i];
      if (p.bytes == 0) continue;
      if (!s_->device_accessible(p.src, p.bytes) || !s_->device_accessible(p.dst, p.bytes)) {
        return dev::illegal_address;
      }
      acc.push_back({p.src, p.src + p.bytes, false});
      acc.push_back({p.dst, p.dst + p.bytes, true});
    }
    return dev::ok;
  };
  op.run = [pieces, count, warps] {
    for (std::uint64_t w = 0; w < warps; ++w) {
      for (unsigned lane = 0; lane < 32; ++lane)
        detail::copy_pieces(pieces, count, w, warps, lane, 32);
    }
  };
  s_->enqueue(st, std::move(op));
  return dev::ok;
}

int SimDevice::launch_build_pieces(const detail::DeviceJobLayout& layout, const std::int32_t* ids,
                                   const std::int64_t* count, const std::int64_t* group_counts,
                                   const std::int32_t* host_ids, const int* mismatch,
                                   detail::DevicePiece* pieces, std::uint64_t max_pieces, int ctas,
                                   int threads, StreamHandle stream) noexcept {
  std::lock_guard lock(s_->m);
  State::Stream* st = nullptr;
  if (const int e = s_->kernel_stream("launch_build_pieces", stream, ctas, threads, &st)) return e;
  if (max_pieces == 0) return dev::ok;
  State::Op op;
  op.name = "build_pieces kernel";
  std::int64_t hosts = 0;
  for (int g = 0; g < layout.groups; ++g) hosts += layout.host_count[g];
  op.plan = [=, this](std::vector<SimAccess>& acc) {
    auto ok = [&](const void* p, std::size_t n, bool write) {
      if (!s_->device_accessible(reinterpret_cast<std::uintptr_t>(p), n)) return false;
      acc.push_back(range(p, n, write));
      return true;
    };
    const bool good =
        ok(mismatch, sizeof(int), false) && ok(count, 8, false) &&
        ok(group_counts, 8 * static_cast<std::size_t>(layout.groups), false) &&
        ok(host_ids, 4 * static_cast<std::size_t>(hosts), false) &&
        ok(ids, 4 * static_cast<std::size_t>(std::max<std::int64_t>(*count, 0)), false) &&
        ok(pieces, max_pieces * sizeof(detail::DevicePiece), true);
    return good ? dev::ok : dev::illegal_address;
  };
  op.run = [=] {
    for (std::uint64_t x = 0; x < max_pieces; ++x) {
      pieces[x] = detail::build_piece(layout, ids, count, group_counts, host_ids, mismatch, x);
    }
  };
  s_->enqueue(st, std::move(op));
  return dev::ok;
}

int SimDevice::compaction_temp_bytes(std::int64_t max_ids, int /*max_groups*/,
                                     std::size_t* bytes) noexcept {
  {
    std::lock_guard lock(s_->m);
    s_->need_context();  // CUB's size query asks the device for its occupancy
  }
  *bytes = static_cast<std::size_t>(std::max<std::int64_t>(max_ids, 1)) * 4 + 256;
  return dev::ok;
}

int SimDevice::launch_compact(const CompactArgs& a, StreamHandle stream) noexcept {
  std::lock_guard lock(s_->m);
  if (s_->poisoned) return s_->sticky;
  if (const int e = s_->injected("launch_compact")) return e;
  State::Stream* st = s_->find_stream(stream, "launch_compact");
  if (st == nullptr) return dev::invalid_resource_handle;
  if (st->device != s_->current_device()) return dev::invalid_resource_handle;
  if (a.n < 0 || a.groups < 1) return dev::invalid_value;
  State::Op op;
  op.name = "compaction kernels";
  const auto G = static_cast<std::size_t>(a.groups);
  const auto n = static_cast<std::size_t>(a.n);
  op.plan = [this, a, G, n](std::vector<SimAccess>& acc) {
    auto ok = [&](const void* p, std::size_t bytes, bool write) {
      if (p == nullptr && bytes == 0) return true;
      if (!s_->device_accessible(reinterpret_cast<std::uintptr_t>(p), bytes)) return false;
      if (bytes > 0) acc.push_back(range(p, bytes, write));
      return true;
    };
    const bool good =
        ok(a.ids, 4 * n, false) && ok(a.offsets, 8 * (G + 1), false) &&
        ok(a.expected, 8 * G, false) && (a.max_id == nullptr || ok(a.max_id, 8 * G, false)) &&
        ok(a.out, 4 * n, true) && ok(a.count, 8, true) && ok(a.group_counts, 8 * G, true) &&
        ok(a.mismatch, sizeof(int), true) && ok(a.temp, a.temp_bytes, true);
    return good ? dev::ok : dev::illegal_address;
  };
  op.run = [a, G] {
    std::int64_t out = 0;
    int bad = 0;
    for (std::size_t g = 0; g < G; ++g) {
      std::int64_t real = 0;
      for (std::int64_t i = a.offsets[g]; i < a.offsets[g + 1]; ++i) {
        const std::int32_t id = a.ids[i];
        if (!detail::NotNullBlock{}(id)) continue;
        ++real;
        a.out[out++] = id;
        if (id < 0 || (a.max_id != nullptr && id > a.max_id[g])) bad = 1;
      }
      a.group_counts[g] = real;
      if (real != a.expected[g]) bad = 1;
    }
    *a.count = out;
    *a.mismatch = bad;
  };
  s_->enqueue(st, std::move(op));
  return dev::ok;
}

}  // namespace kvoffload
