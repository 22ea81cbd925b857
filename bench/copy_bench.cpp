// kvoffload-bench copy --backend host|cuda: copy bandwidth over piece sizes, side by side with
// the ceiling measured in the same run (one copy of the same total bytes).

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "bench_common.hpp"
#include "kvoffload/byte_size.hpp"
#include "kvoffload/cuda_backend.hpp"
#include "kvoffload/host_backend.hpp"
#include "scenarios.hpp"

namespace kvbench {
namespace {

using namespace kvoffload;
using Clock = std::chrono::steady_clock;

/// A plan of `piece`-byte copies covering `total` bytes, scattered over every other slot of
/// the destination, like KV pages going to host blocks.
CopyPlan scattered(std::uintptr_t src, std::uintptr_t dst, std::uint64_t total, std::uint64_t piece,
                   JobKind dir) {
  CopyPlan p;
  p.kind = dir;
  const std::uint64_t n = total / piece;
  p.descriptors.reserve(n);
  for (std::uint64_t i = 0; i < n; ++i) {
    // Piece i goes to slot (i * 7) % n: no two neighbours stay neighbours, nothing merges.
    const std::uint64_t slot = (i * 7) % n;
    p.descriptors.push_back({src + i * piece, dst + slot * piece, piece});
  }
  p.total_bytes = n * piece;
  return p;
}

/// The machine's copy ceiling: the same bytes as one memcpy per core, each core a contiguous
/// share, all at once (threads started before the clock; the clock runs from their release to
/// the last one's end).
double all_cores_memcpy_gbps(std::uint8_t* dst, const std::uint8_t* src, std::uint64_t total,
                             unsigned cores) {
  std::vector<std::thread> threads;
  std::atomic<unsigned> ready{0};
  std::atomic<bool> go{false};
  const std::uint64_t share = (total / cores) & ~std::uint64_t{4095};
  for (unsigned c = 0; c < cores; ++c) {
    const std::uint64_t off = c * share;
    const std::uint64_t n = c + 1 == cores ? total - off : share;
    threads.emplace_back([&, off, n] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      std::memcpy(dst + off, src + off, n);
    });
  }
  while (ready.load() < cores) std::this_thread::yield();
  const auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  for (std::thread& t : threads) t.join();
  return static_cast<double>(total) / seconds_since(t0) / 1e9;
}

std::vector<std::uint64_t> piece_sizes(bool quick) {
  std::vector<std::uint64_t> sizes;
  for (std::uint64_t s = 4096; s <= (std::uint64_t{16} << 20); s *= quick ? 16 : 4)
    sizes.push_back(s);
  return sizes;
}

}  // namespace

nlohmann::json run_copy_host(const Options& opt) {
  const std::size_t runs = opt.runs > 0 ? opt.runs : (opt.quick ? 3 : 9);
  const std::uint64_t total = opt.quick ? (std::uint64_t{64} << 20) : (std::uint64_t{512} << 20);
  std::vector<std::uint8_t> src(total, 1), dst(total, 2);  // touched: no page faults timed
  HostBackend backend;
  nlohmann::json rows = nlohmann::json::array();
  const auto sizes = piece_sizes(opt.quick);
  Progress progress("copy host", sizes.size() * runs);
  for (const std::uint64_t piece : sizes) {
    const CopyPlan plan =
        scattered(reinterpret_cast<std::uintptr_t>(src.data()),
                  reinterpret_cast<std::uintptr_t>(dst.data()), total, piece, JobKind::store);
    std::vector<double> ceiling, all_cores, backend_bw;
    // Interleaved: the ceilings and the backend see the same machine state.
    for (std::size_t r = 0; r < runs; ++r) {
      auto t0 = Clock::now();
      std::memcpy(dst.data(), src.data(), plan.total_bytes);
      ceiling.push_back(static_cast<double>(plan.total_bytes) / seconds_since(t0) / 1e9);
      all_cores.push_back(all_cores_memcpy_gbps(dst.data(), src.data(), plan.total_bytes,
                                                static_cast<unsigned>(backend.threads())));
      t0 = Clock::now();
      backend.wait(backend.submit(plan));
      backend_bw.push_back(static_cast<double>(plan.total_bytes) / seconds_since(t0) / 1e9);
      std::vector<BackendResult> done;
      backend.poll(done);
      if (done.empty() || !done[0].ok) throw std::runtime_error("copy bench: a copy failed");
      progress.step(format_bytes(piece));
    }
    const Summary c = summarize(ceiling), b = summarize(backend_bw), a = summarize(all_cores);
    rows.push_back({{"piece_bytes", piece},
                    {"pieces", plan.descriptors.size()},
                    {"host_backend_gbps", to_json(b, "gbps")},
                    {"memcpy_ceiling_gbps", to_json(c, "gbps")},
                    {"ratio_median", b.median / c.median},
                    {"all_cores_memcpy_gbps", to_json(a, "gbps")},
                    {"ratio_to_all_cores_median", b.median / a.median}});
  }
  progress.done();
  return {{"backend", "host"},
          {"threads", backend.threads()},
          {"total_bytes", total},
          {"baseline",
           "one memcpy of the same total bytes, single thread; and the same bytes "
           "split over as many threads as the backend has (the all-core ceiling, "
           "issue 30: >= 0.9 from 64 KiB pieces, >= 0.8 at 4 KiB)"},
          {"results", rows}};
}

nlohmann::json run_copy_cuda(const Options& opt) {
  if (!CudaBackend::available()) {
    return {{"backend", "cuda"}, {"skipped", "no CUDA device"}};
  }
  // Device and pinned host buffers come from the pool and the backend's own allocations; the
  // sweep itself lives in the CUDA-only part (copy_bench_cuda.cpp).
  return run_copy_cuda_sweep(opt);
}

}  // namespace kvbench
