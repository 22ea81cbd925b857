// kvoffload-bench pool: how long a large host pool takes to become usable (map, first touch,
// registration), faulted by one thread vs all cores, against the plain way of making that much
// fresh memory writable: an all-core memset of a freshly mapped region of the same size and
// page kind (the pool touches one byte a page, so it should not be slower). All in the same run,
// interleaved (the machine is shared and noisy).

#include <sys/mman.h>

#include <cstring>
#include <thread>

#include "bench_common.hpp"
#include "kvoffload/byte_size.hpp"
#include "kvoffload/pinned_host_pool.hpp"
#include "scenarios.hpp"

namespace kvbench {
namespace {

// PegaFlow's published start-up: a 500 GiB pinned pool ready in 33.2 s (another machine; shown
// beside ours, not a ratio).
constexpr double kPegaFlowGiB = 500.0;
constexpr double kPegaFlowSeconds = 33.2;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The baseline: map `bytes` fresh (THP advised or not), memset every byte with `threads`
// threads each owning a contiguous range, unmap. Returns the seconds to the end of the memset.
double memset_fresh(std::uint64_t bytes, bool thp, int threads) {
  const auto start = std::chrono::steady_clock::now();
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("pool bench: mmap of the memset baseline failed");
  if (thp) (void)madvise(p, bytes, MADV_HUGEPAGE);
  auto* base = static_cast<unsigned char*>(p);
  const auto n = static_cast<std::uint64_t>(threads);
  auto fill = [base, bytes, n](std::uint64_t t) {
    const std::uint64_t first = bytes * t / n, last = bytes * (t + 1) / n;
    std::memset(base + first, 0, last - first);
  };
  std::vector<std::thread> workers;
  for (std::uint64_t t = 1; t < n; ++t) workers.emplace_back(fill, t);
  fill(0);
  for (std::thread& w : workers) w.join();
  const double seconds = seconds_since(start);
  munmap(p, bytes);
  return seconds;
}

}  // namespace

nlohmann::json run_pool(const Options& opt, const std::string& size) {
  const std::uint64_t bytes = kvoffload::parse_bytes(size, "--size");
  const std::size_t runs = opt.runs > 0 ? opt.runs : (opt.quick ? 2 : 3);
  const int all = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  const double gib = static_cast<double>(bytes) / kGiB;
  nlohmann::json results = nlohmann::json::array();
  nlohmann::json speedups = nlohmann::json::object();
  nlohmann::json vs_memset = nlohmann::json::object();
  Progress progress("pool " + size, runs * 6);
  for (const auto& [pages, huge] : {std::pair{"4k", kvoffload::HugePages::off},
                                    std::pair{"thp", kvoffload::HugePages::prefer}}) {
    std::vector<double> one, many, memset_all, map_s, fault_s, register_s;
    bool got_huge = false, pinned = false;
    // Interleave the three so drift in the machine's load hits them alike.
    for (std::size_t r = 0; r < runs; ++r) {
      for (const int threads : {1, all}) {
        kvoffload::PoolConfig c;
        c.block_bytes = 2 << 20;
        c.host_bytes = bytes;
        c.huge_pages = huge;
        c.prefault_threads = threads;
        const auto start = std::chrono::steady_clock::now();
        {
          kvoffload::PinnedHostPool pool(c);
          (threads == 1 ? one : many).push_back(seconds_since(start));
          got_huge = pool.report().huge_pages;
          pinned = pool.report().pinned;
          if (threads == all) {
            map_s.push_back(pool.report().map_seconds);
            fault_s.push_back(pool.report().fault_seconds);
            register_s.push_back(pool.report().register_seconds);
          }
        }
        progress.step(std::string(pages) + " x" + std::to_string(threads));
      }
      memset_all.push_back(memset_fresh(bytes, got_huge, all));
      progress.step(std::string(pages) + " memset x" + std::to_string(all));
    }
    const Summary s1 = summarize(one), sn = summarize(many), sm = summarize(memset_all);
    auto row = [&](const Summary& s, const char* what, int threads) {
      nlohmann::json j = to_json(s, "s");
      j["what"] = what;
      j["pages"] = pages;
      j["threads"] = threads;
      j["huge_pages_given"] = got_huge;
      j["gib_per_s"] = gib / s.median;
      return j;
    };
    results.push_back(row(s1, "pool", 1));
    nlohmann::json b = row(sn, "pool", all);
    b["pinned"] = pinned;
    b["map_s"] = summarize(map_s).median;
    b["fault_s"] = summarize(fault_s).median;
    b["register_s"] = summarize(register_s).median;
    results.push_back(b);
    results.push_back(row(sm, "memset_fresh", all));
    speedups[pages] = s1.median / sn.median;
    vs_memset[pages] = sm.median / sn.median;  // > 1: the pool is ready sooner than a memset
  }
  progress.done();
  return {{"bytes", bytes},
          {"size", size},
          {"note",
           "pool = the PinnedHostPool constructor: map + parallel first touch + CUDA registration "
           "(if a device); memset_fresh = mmap of the same size and page kind + an all-core "
           "memset of every byte (the plain way to make fresh memory writable)"},
          {"results", results},
          {"speedup_all_threads_vs_one", speedups},
          {"pool_vs_memset_all_cores", vs_memset},
          {"pegaflow_published",
           {{"gib", kPegaFlowGiB},
            {"seconds", kPegaFlowSeconds},
            {"gib_per_s", kPegaFlowGiB / kPegaFlowSeconds}}}};
}

}  // namespace kvbench
