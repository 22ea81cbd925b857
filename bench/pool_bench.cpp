// kvoffload-bench pool: how long a large host pool takes to become usable, faulted by one
// thread vs all cores, in the same run (a ratio: the machine is shared and noisy).

#include <thread>

#include "bench_common.hpp"
#include "kvoffload/byte_size.hpp"
#include "kvoffload/pinned_host_pool.hpp"
#include "scenarios.hpp"

namespace kvbench {

nlohmann::json run_pool(const Options& opt, const std::string& size) {
  const std::uint64_t bytes = kvoffload::parse_bytes(size, "--size");
  const std::size_t runs = opt.runs > 0 ? opt.runs : (opt.quick ? 2 : 3);
  const int all = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  nlohmann::json results = nlohmann::json::array();
  nlohmann::json speedups = nlohmann::json::object();
  Progress progress("pool " + size, runs * 4);
  for (const auto& [pages, huge] : {std::pair{"4k", kvoffload::HugePages::off},
                                    std::pair{"thp", kvoffload::HugePages::prefer}}) {
    std::vector<double> one, many;
    bool got_huge = false;
    // Interleave the two thread counts so drift in the machine's load hits both alike.
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
          got_huge = pool.report().huge_pages;
          (threads == 1 ? one : many).push_back(seconds_since(start));
        }
        progress.step(std::string(pages) + " x" + std::to_string(threads));
      }
    }
    const Summary s1 = summarize(one), sn = summarize(many);
    nlohmann::json a = to_json(s1, "s");
    a["pages"] = pages;
    a["threads"] = 1;
    a["huge_pages_given"] = got_huge;
    nlohmann::json b = to_json(sn, "s");
    b["pages"] = pages;
    b["threads"] = all;
    b["huge_pages_given"] = got_huge;
    results.push_back(a);
    results.push_back(b);
    speedups[pages] = s1.median / sn.median;
  }
  progress.done();
  return {{"bytes", bytes},
          {"size", size},
          {"note", "allocation = map + parallel first touch + CUDA registration (if a device)"},
          {"results", results},
          {"speedup_all_threads_vs_one", speedups}};
}

}  // namespace kvbench
