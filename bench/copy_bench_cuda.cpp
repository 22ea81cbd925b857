// The CUDA half of kvoffload-bench copy, calibrate, compact and source-order (compiled with the
// CUDA toolkit).

#include <cuda_runtime_api.h>

#include <thrust/copy.h>
#include <thrust/execution_policy.h>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>

#include "bench_common.hpp"
#include "kvoffload/byte_size.hpp"
#include "kvoffload/copy_planner.hpp"
#include "kvoffload/cuda_backend.hpp"
#include "kvoffload/detail/copy_body.hpp"
#include "kvoffload/device_runtime.hpp"
#include "kvoffload/pinned_host_pool.hpp"
#include "scenarios.hpp"

namespace kvbench {
namespace {

using namespace kvoffload;
using Clock = std::chrono::steady_clock;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e));
}

CopyPlan scattered(std::uintptr_t gpu, std::uintptr_t host, std::uint64_t total,
                   std::uint64_t piece, JobKind dir) {
  CopyPlan p;
  p.kind = dir;
  const std::uint64_t n = total / piece;
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t slot = (i * 7) % n;
    const std::uintptr_t g = gpu + i * piece, h = host + slot * piece;
    p.descriptors.push_back(dir == JobKind::store ? CopyDescriptor{g, h, piece}
                                                  : CopyDescriptor{h, g, piece});
  }
  p.total_bytes = n * piece;
  return p;
}

/// GB/s of one large cudaMemcpyAsync of `bytes` (the PCIe ceiling).
double ceiling_gbps(void* dst, const void* src, std::uint64_t bytes, cudaMemcpyKind kind,
                    cudaStream_t stream) {
  check(cudaMemcpyAsync(dst, src, bytes, kind, stream), "warm-up copy");
  check(cudaStreamSynchronize(stream), "sync");
  const auto t0 = Clock::now();
  check(cudaMemcpyAsync(dst, src, bytes, kind, stream), "ceiling copy");
  check(cudaStreamSynchronize(stream), "sync");
  return static_cast<double>(bytes) / seconds_since(t0) / 1e9;
}

}  // namespace

nlohmann::json run_copy_cuda_sweep(const Options& opt) {
  const std::size_t runs = opt.runs > 0 ? opt.runs : (opt.quick ? 2 : 5);
  const std::uint64_t total =
      opt.copy_total > 0 ? opt.copy_total
                         : (opt.quick ? (std::uint64_t{64} << 20) : (std::uint64_t{1} << 30));
  const std::uint64_t max_piece =
      opt.copy_piece_max > 0 ? opt.copy_piece_max : (std::uint64_t{16} << 20);
  void* gpu = nullptr;
  void* host = nullptr;
  check(cudaMalloc(&gpu, total), "cudaMalloc");
  // The host side: cudaMallocHost, or a Worker's kind of pool (mapped, registered in 1 GiB
  // pieces), to tell the two apart when a mode misses its target.
  std::unique_ptr<PinnedHostPool> pool;
  if (opt.copy_host_pool) {
    PoolConfig pc;
    pc.block_bytes = 2 << 20;
    pc.host_bytes = total;
    pc.pinning = Pinning::require;
    pool = std::make_unique<PinnedHostPool>(pc);
    host = pool->data();
  } else {
    check(cudaMallocHost(&host, total), "cudaMallocHost");
  }
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  nlohmann::json rows = nlohmann::json::array();
  const std::vector<int> ctas =
      opt.copy_ctas.empty() ? std::vector<int>{CudaBackendConfig{}.kernel_ctas} : opt.copy_ctas;
  const CopyMode modes[] = {CopyMode::batch, CopyMode::memcpy, CopyMode::kernel, CopyMode::staged,
                            CopyMode::automatic};
  std::vector<std::uint64_t> sizes;
  for (std::uint64_t s = 4096; s <= max_piece && s <= total; s *= opt.quick ? 16 : 2)
    sizes.push_back(s);
  Progress progress("copy cuda", sizes.size() * (std::size(modes) + 2 * (ctas.size() - 1)));
  for (const std::uint64_t piece : sizes) {
    for (const CopyMode mode : modes) {
      const bool kernel = mode == CopyMode::kernel || mode == CopyMode::staged;
      for (const int cta : kernel ? ctas : std::vector<int>{ctas.front()}) {
        CudaBackendConfig c;
        c.mode = mode;
        c.kernel_ctas = cta;
        c.staging_bytes = std::min<std::uint64_t>(total, std::uint64_t{256} << 20);
        if (pool) {
          c.host_base = reinterpret_cast<std::uintptr_t>(pool->data());
          c.host_bytes = pool->size_bytes();
          c.host_registration_bytes =
              static_cast<std::uint64_t>(pool->blocks_per_registration()) * pool->block_bytes();
        }
        const std::uint64_t job_bytes = std::min<std::uint64_t>(total, std::uint64_t{64} << 20);
        CudaBackend backend(c);
        nlohmann::json row{{"piece_bytes", piece},
                           {"mode", std::string(to_string(mode))},
                           {"kernel_ctas", cta},
                           {"host", pool ? "pool" : "cudaMallocHost"}};
        const CudaBackendStats before = backend.stats();
        for (const std::string dir : {"d2h", "h2d", "both"}) {
          std::vector<double> bw, ratio, cpu_ns;
          for (std::size_t r = 0; r < runs; ++r) {
            const double ceil =
                dir == "h2d" ? ceiling_gbps(gpu, host, total, cudaMemcpyHostToDevice, stream)
                             : ceiling_gbps(host, gpu, total, cudaMemcpyDeviceToHost, stream);
            const std::uint64_t half = total / 2;
            // Jobs of at most job_bytes each (a request's worth), so staged jobs fit the
            // staging buffer instead of silently running as kernel jobs.
            std::vector<CopyPlan> plans;
            auto add = [&](std::uint64_t offset, std::uint64_t bytes, JobKind d) {
              for (std::uint64_t at = 0; at < bytes; at += job_bytes) {
                const std::uint64_t n = std::min(job_bytes, bytes - at);
                if (n < piece) break;
                plans.push_back(scattered(reinterpret_cast<std::uintptr_t>(gpu) + offset + at,
                                          reinterpret_cast<std::uintptr_t>(host) + offset + at, n,
                                          piece, d));
              }
            };
            if (dir == "both") {
              add(0, half, JobKind::store);
              add(half, half, JobKind::load);
            } else {
              add(0, total, dir == "d2h" ? JobKind::store : JobKind::load);
            }
            std::uint64_t bytes = 0, pieces = 0;
            for (const auto& p : plans) {
              bytes += p.total_bytes;
              pieces += p.descriptors.size();
            }
            const auto t0 = Clock::now();
            std::vector<Ticket> tickets;
            for (auto& p : plans) tickets.push_back(backend.submit(p));
            const double submit_s = seconds_since(t0);
            for (const Ticket t : tickets) backend.wait(t);
            const double s = seconds_since(t0);
            std::vector<BackendResult> done;
            backend.poll(done);
            for (const auto& d : done) {
              if (!d.ok) throw std::runtime_error("copy cuda bench: " + d.error);
            }
            bw.push_back(static_cast<double>(bytes) / s / 1e9);
            ratio.push_back(bw.back() / ceil);
            cpu_ns.push_back(submit_s * 1e9 / static_cast<double>(pieces));
          }
          row[dir] = {{"gbps", to_json(summarize(bw), "gbps")},
                      {"ratio_to_one_copy_median", summarize(ratio).median},
                      {"cpu_ns_per_descriptor_median", summarize(cpu_ns).median}};
        }
        // The modes the jobs really ran in (staged falls back to kernel when staging is full;
        // automatic picks per job).
        const CudaBackendStats after = backend.stats();
        row["modes_used"] = {{"batch", after.jobs_batch - before.jobs_batch},
                             {"memcpy", after.jobs_memcpy - before.jobs_memcpy},
                             {"kernel", after.jobs_kernel - before.jobs_kernel},
                             {"staged", after.jobs_staged - before.jobs_staged}};
        rows.push_back(row);
        progress.step(format_bytes(piece) + " " + std::string(to_string(mode)));
      }
    }
  }
  progress.done();
  check(cudaStreamDestroy(stream), "stream");
  check(cudaFree(gpu), "cudaFree");
  if (!pool) check(cudaFreeHost(host), "cudaFreeHost");
  int device = 0;
  cudaDeviceProp prop{};
  (void)cudaGetDevice(&device);
  (void)cudaGetDeviceProperties(&prop, device);
  return {{"backend", "cuda"},
          {"job_bytes", std::min<std::uint64_t>(total, std::uint64_t{64} << 20)},
          {"device", std::string(prop.name)},
          {"total_bytes", total},
          {"baseline", "one cudaMemcpyAsync of the same total bytes"},
          {"results", rows}};
}

nlohmann::json run_calibrate(const Options& /*opt*/) {
  if (!CudaBackend::available()) return {{"skipped", "no CUDA device"}};
  const CudaBackendConfig c = calibrate(CudaBackendConfig{});
  return {{"store_small_piece_bytes", c.store_small_piece_bytes},
          {"load_small_piece_bytes", c.load_small_piece_bytes},
          {"staged_min_pieces", c.staged_min_pieces}};
}

nlohmann::json run_compact(const Options& opt) {
  const std::size_t runs = opt.runs > 0 ? opt.runs : (opt.quick ? 2 : 7);
  nlohmann::json rows = nlohmann::json::array();
  std::mt19937 rng(1);
  const std::int64_t max_n =
      opt.compact_max_ids > 0 ? opt.compact_max_ids : (opt.quick ? (1 << 16) : (1 << 24));
  const bool gpu = CudaBackend::available();
  std::unique_ptr<DeviceCompactor> compactor;
  std::int32_t* d_ids = nullptr;
  std::int32_t* d_out = nullptr;
  std::int64_t* d_small = nullptr;  // offsets (2), expected (1), count (1), group counts (1)
  int* d_flag = nullptr;
  if (gpu) {
    compactor = std::make_unique<DeviceCompactor>(max_n, 1);
    check(cudaMalloc(reinterpret_cast<void**>(&d_ids), static_cast<std::size_t>(max_n) * 4),
          "cudaMalloc");
    check(cudaMalloc(reinterpret_cast<void**>(&d_out), static_cast<std::size_t>(max_n) * 4),
          "cudaMalloc");
    check(cudaMalloc(reinterpret_cast<void**>(&d_small), 5 * 8), "cudaMalloc");
    check(cudaMalloc(reinterpret_cast<void**>(&d_flag), sizeof(int)), "cudaMalloc");
  }
  Progress progress("compact", 0);
  for (std::int64_t n = 1024; n <= max_n; n *= 4) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(n)), out(ids.size());
    for (auto& id : ids) id = rng() % 4 == 0 ? 0 : static_cast<std::int32_t>(1 + rng() % 100000);
    std::vector<double> cpu;
    for (std::size_t r = 0; r < runs; ++r) {
      const auto t0 = Clock::now();
      const auto end = thrust::copy_if(thrust::host, ids.begin(), ids.end(), out.begin(),
                                       detail::NotNullBlock{});
      cpu.push_back(seconds_since(t0) * 1e6);
      if (end == out.begin()) throw std::runtime_error("compact bench: nothing selected");
    }
    nlohmann::json row{{"ids", n}, {"cpu_thrust_us", to_json(summarize(cpu), "us")}};
    if (gpu) {
      check(cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice), "upload");
      const std::int64_t small[3] = {0, n, 0};
      check(cudaMemcpy(d_small, small, 3 * 8, cudaMemcpyHostToDevice), "upload");
      std::vector<double> g;
      for (std::size_t r = 0; r < runs; ++r) {
        check(cudaDeviceSynchronize(), "sync");
        const auto t0 = Clock::now();
        compactor->compact(d_ids, n, d_small, 1, d_small + 2, d_out, d_small + 3, d_small + 4,
                           d_flag, 0);
        check(cudaDeviceSynchronize(), "sync");
        g.push_back(seconds_since(t0) * 1e6);
      }
      row["gpu_cub_us"] = to_json(summarize(g), "us");
    }
    rows.push_back(row);
  }
  progress.done();
  if (gpu) {
    (void)cudaFree(d_ids);
    (void)cudaFree(d_out);
    (void)cudaFree(d_small);
    (void)cudaFree(d_flag);
  }
  return {{"gpu", gpu}, {"results", rows}};
}

nlohmann::json run_source_order(const Options& opt) {
  if (!CudaBackend::available()) return {{"skipped", "no CUDA device"}};
  const std::shared_ptr<DeviceRuntime> rt = cuda_runtime();
  if (!rt->batch_available()) {
    return {{"skipped", "no cuMemcpyBatchAsync (driver older than CUDA 12.8)"}};
  }
  auto ok = [&](int e, const char* what) {
    if (e != dev::ok)
      throw std::runtime_error(std::string("source-order: ") + what + ": " + rt->describe(e));
  };
  const std::size_t runs = opt.runs > 0 ? opt.runs : (opt.quick ? 2 : 5);
  const std::uint64_t total =
      opt.copy_total > 0 ? opt.copy_total
                         : (opt.quick ? (std::uint64_t{64} << 20) : (std::uint64_t{256} << 20));
  const std::uint64_t max_piece =
      opt.copy_piece_max > 0 ? opt.copy_piece_max : (std::uint64_t{1} << 20);
  // One batch call per job of at most job_bytes, as the backend makes one per load job.
  const std::uint64_t job_bytes = std::min<std::uint64_t>(total, std::uint64_t{64} << 20);
  ok(rt->set_device(0), "set_device");
  // Freed on every way out, a throw included.
  struct Resources {
    DeviceRuntime& rt;
    void* gpu = nullptr;
    void* host = nullptr;
    StreamHandle stream = 0;
    ~Resources() {
      if (stream != 0) (void)rt.stream_destroy(stream);
      if (gpu != nullptr) (void)rt.free_device(gpu);
      if (host != nullptr) (void)rt.free_host(host);
    }
  } res{*rt};
  ok(rt->malloc_device(&res.gpu, total), "malloc_device");
  ok(rt->malloc_host(&res.host, total), "malloc_host");
  int least = 0, greatest = 0;
  ok(rt->stream_priority_range(&least, &greatest), "stream_priority_range");
  ok(rt->stream_create(greatest, &res.stream), "stream_create");  // loads: the highest priority
  void* const gpu = res.gpu;
  void* const host = res.host;
  const StreamHandle stream = res.stream;
  auto* h = static_cast<std::uint8_t*>(host);
  for (std::uint64_t i = 0; i + 8 <= total; i += 8) {  // no two pieces alike
    const std::uint64_t word = (i + 1) * 0x9E3779B97F4A7C15ull;
    std::memcpy(h + i, &word, 8);
  }
  std::vector<std::uint8_t> back(total);
  const auto timed = [&](std::uint64_t bytes, auto&& queue) {
    ok(rt->stream_synchronize(stream), "sync");
    const auto t0 = Clock::now();
    queue();
    ok(rt->stream_synchronize(stream), "sync");
    return static_cast<double>(bytes) / seconds_since(t0) / 1e9;
  };
  const auto one_copy = [&] { ok(rt->memcpy_async(gpu, host, total, stream), "one copy"); };
  (void)timed(total, one_copy);  // warm-up
  nlohmann::json rows = nlohmann::json::array();
  std::vector<std::uint64_t> sizes;
  for (std::uint64_t s = 4096; s <= max_piece && s <= total; s *= opt.quick ? 16 : 2)
    sizes.push_back(s);
  std::vector<double> ceiling;
  bool all_right = true;
  Progress progress("source-order", sizes.size());
  for (const std::uint64_t piece : sizes) {
    // Loads: scattered host blocks (slot (i * k) % n, k coprime to n: a permutation) into
    // consecutive device pages.
    std::vector<std::vector<CopyDescriptor>> jobs;
    const std::uint64_t n = total / piece, per_job = std::max<std::uint64_t>(1, job_bytes / piece);
    std::uint64_t k = 7;
    while (std::gcd(k, n) != 1) k += 2;
    for (std::uint64_t i = 0; i < n; ++i) {
      if (i % per_job == 0) jobs.emplace_back();
      const std::uint64_t slot = (i * k) % n;
      jobs.back().push_back({reinterpret_cast<std::uintptr_t>(h + slot * piece),
                             reinterpret_cast<std::uintptr_t>(gpu) + i * piece, piece});
    }
    const auto batches = [&](bool in_stream_order) {
      for (const auto& j : jobs) {
        std::size_t fail = 0;
        const int e = rt->memcpy_batch_async(j.data(), j.size(), in_stream_order, stream, &fail);
        if (e != dev::ok) {
          throw std::runtime_error("source-order: batch copy " + std::to_string(fail) + " of " +
                                   std::to_string(j.size()) + " refused: " + rt->describe(e));
        }
      }
    };
    const std::uint64_t bytes = n * piece;
    const auto any_order = [&] { batches(false); };
    const auto stream_order = [&] { batches(true); };
    (void)timed(bytes, any_order);  // warm-up, both orders
    (void)timed(bytes, stream_order);
    std::vector<double> any, in_order, ratio, one;
    for (std::size_t r = 0; r < runs; ++r) {
      // Interleaved, the first of each pair alternating: both see the same machine state.
      const bool any_first = r % 2 == 0;
      one.push_back(timed(total, one_copy));
      ceiling.push_back(one.back());
      const double a_first = any_first ? timed(bytes, any_order) : 0;
      const double s = timed(bytes, stream_order);
      const double a = any_first ? a_first : timed(bytes, any_order);
      any.push_back(a);
      in_order.push_back(s);
      ratio.push_back(a / s);
    }
    // Every byte where it belongs, in both orders, each after a contiguous copy that puts other
    // bytes there (a batch reordered before it would show): a wrong copy has no speed.
    std::uint64_t wrong[2] = {0, 0};
    for (const bool in_stream_order : {false, true}) {
      (void)timed(bytes, [&] {
        one_copy();
        batches(in_stream_order);
        ok(rt->memcpy_async(back.data(), gpu, bytes, stream), "read back");
      });
      for (std::uint64_t i = 0; i < n; ++i) {
        wrong[in_stream_order ? 1 : 0] +=
            std::memcmp(back.data() + i * piece, h + ((i * k) % n) * piece, piece) != 0;
      }
    }
    all_right = all_right && wrong[0] == 0 && wrong[1] == 0;
    const Summary sa = summarize(any), ss = summarize(in_order);
    rows.push_back({{"piece_bytes", piece},
                    {"pieces", n},
                    {"batch_calls", jobs.size()},
                    {"wrong_pieces_any", wrong[0]},
                    {"wrong_pieces_stream", wrong[1]},
                    {"any_gbps", to_json(sa, "gbps")},
                    {"stream_gbps", to_json(ss, "gbps")},
                    {"ratio_any_to_stream_median", summarize(ratio).median},
                    {"any_ratio_to_one_copy_median", sa.median / summarize(one).median},
                    {"stream_ratio_to_one_copy_median", ss.median / summarize(one).median}});
    progress.step(format_bytes(piece));
  }
  progress.done();
  cudaDeviceProp prop{};
  (void)cudaGetDeviceProperties(&prop, 0);
  return {{"device", std::string(prop.name)},
          {"direction", "h2d (loads): pinned host to device"},
          {"total_bytes", total},
          {"job_bytes", job_bytes},
          {"one_copy_h2d_gbps", to_json(summarize(ceiling), "gbps")},
          {"all_bytes_right", all_right},
          {"baseline",
           "the same batches with source order stream (CU_MEMCPY_SRC_ACCESS_ORDER_STREAM), "
           "interleaved with any (CU_MEMCPY_SRC_ACCESS_ORDER_ANY); ratio > 1: any is faster"},
          {"results", rows}};
}

}  // namespace kvbench
