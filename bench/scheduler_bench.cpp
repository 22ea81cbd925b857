// kvoffload-bench scheduler: the cost of build_step (and lookup) for many running requests.
// --preset reference runs exactly the reference workload of the benchmark issue.

#include <cstring>
#include <random>

#include "alloc_counter.hpp"
#include "bench_common.hpp"
#include "kvoffload/scheduler.hpp"
#include "manager_fill.hpp"
#include "scenarios.hpp"

namespace kvbench {
namespace {

using namespace kvoffload;
using Clock = std::chrono::steady_clock;

std::vector<BlockHash> random_hashes(std::mt19937_64& rng, std::size_t n) {
  std::vector<BlockHash> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint8_t b[16];
    const std::uint64_t x = rng(), y = rng();
    std::memcpy(b, &x, 8);
    std::memcpy(b + 8, &y, 8);
    out.push_back(BlockHash::from_bytes(b));
  }
  return out;
}

struct Workload {
  std::vector<GroupConfig> groups;
  std::int64_t factor = 4;
  int requests = 256;
  std::int64_t prompt = 2048;
  int decode_steps = 64;
  /// A host pool of the blocks the run stores (at host block granularity) rather than the
  /// reference workload's one (a block per 16 tokens), so heap per block counts the blocks.
  bool tight_pool = false;
};

struct WorkloadResult {
  double prefill_seconds = 0;
  std::vector<double> decode_seconds;
  double decode_allocations = 0;  // per decode step, mean
  std::vector<double> decode_allocations_each;
  std::uint64_t prefill_keys = 0;
  double lookup_seconds = 0;  // all requests' lookups
  double heap_bytes = 0;      // the scheduler's heap at the end of the run (mallinfo2)
  double heap_empty = 0;      // ... right after its construction (the pool's own)
  std::int64_t blocks_used = 0;
  std::int64_t blocks_total = 0;
};

/// One run: requests looked up (misses), one prefill step, then decode steps; store jobs
/// completed after every step. Only build_step is timed.
WorkloadResult run_workload(const Workload& w, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  SchedulerConfig c;
  c.groups = w.groups;
  c.block_size_factor = w.factor;
  c.hash_block_size = 16;
  const std::int64_t max_tokens = w.prompt + w.decode_steps + 16;
  const std::int64_t per_request =
      w.tight_pool ? max_tokens / (16 * w.factor) + 2 : max_tokens / 16 + 2;
  c.manager.host_blocks = static_cast<std::int64_t>(w.requests) *
                          static_cast<std::int64_t>(w.groups.size()) * per_request;
  // An engine knows its GPU block count; the workload uses fresh ids up to about this.
  c.gpu_blocks = static_cast<std::int64_t>(w.requests) *
                 static_cast<std::int64_t>(w.groups.size()) * (max_tokens / 16 + 2);
  const std::size_t G = w.groups.size();
  std::vector<std::string> ids;
  std::vector<std::vector<BlockHash>> hashes;
  GpuBlockId next = 1;
  std::vector<ScheduledRequest> step(static_cast<std::size_t>(w.requests));
  WorkloadResult out;
  for (int r = 0; r < w.requests; ++r) {
    ids.push_back("req-" + std::to_string(r));
    hashes.push_back(random_hashes(rng, static_cast<std::size_t>(max_tokens / 16)));
    ScheduledRequest& e = step[static_cast<std::size_t>(r)];
    e.request_id = ids.back();
    e.num_scheduled_tokens = w.prompt;
    e.new_block_ids.resize(G);
    for (std::size_t g = 0; g < G; ++g) {
      const std::int64_t blocks = w.prompt / w.groups[g].gpu_block_size;
      e.new_block_ids[g].reserve(static_cast<std::size_t>(blocks));
      for (std::int64_t k = 0; k < blocks; ++k) e.new_block_ids[g].push_back(next++);
    }
  }
  // What the scheduler holds: the heap from here to the end of the run (the workload's own
  // data is made above; the prefill's job list, freed below, is not counted).
  const double heap0 = heap_in_use();
  Scheduler s(c);
  out.heap_empty = heap_in_use() - heap0;
  for (int r = 0; r < w.requests; ++r) {
    s.update_request(ids[static_cast<std::size_t>(r)], w.prompt,
                     std::span(hashes[static_cast<std::size_t>(r)])
                         .first(static_cast<std::size_t>(w.prompt / 16)));
  }
  auto t0 = Clock::now();
  for (int r = 0; r < w.requests; ++r) (void)s.lookup(ids[static_cast<std::size_t>(r)], 0);
  out.lookup_seconds = seconds_since(t0);
  std::vector<AllocatedGroup> none(G);
  for (int r = 0; r < w.requests; ++r) s.on_allocated(ids[static_cast<std::size_t>(r)], none, 0);
  std::vector<JobReport> reports;
  auto complete = [&](const StepResult& res) {
    reports.clear();
    for (const TransferJob& j : res.store_jobs) reports.push_back({j.id, 1, true});
    (void)s.on_completed(reports);
  };
  t0 = Clock::now();
  StepResult res = s.build_step(step);
  out.prefill_seconds = seconds_since(t0);
  for (const TransferJob& j : res.store_jobs) out.prefill_keys += j.keys.size();
  complete(res);
  std::uint64_t allocs = 0;
  for (int d = 0; d < w.decode_steps; ++d) {
    const std::int64_t computed = w.prompt + d;
    for (int r = 0; r < w.requests; ++r) {
      ScheduledRequest& e = step[static_cast<std::size_t>(r)];
      e.num_computed_tokens = computed;
      e.num_scheduled_tokens = 1;
      for (std::size_t g = 0; g < G; ++g) {
        e.new_block_ids[g].clear();
        if (computed % w.groups[g].gpu_block_size == 0) e.new_block_ids[g].push_back(next++);
      }
      // The engine's update: one more token; a new hash every 16 tokens.
      const std::int64_t tokens = computed + 1;
      const auto& h = hashes[static_cast<std::size_t>(r)];
      s.extend_request(ids[static_cast<std::size_t>(r)], tokens,
                       tokens % 16 == 0
                           ? std::span(h).subspan(static_cast<std::size_t>(tokens / 16 - 1), 1)
                           : std::span<const BlockHash>{});
    }
    const std::uint64_t a0 = allocations();
    t0 = Clock::now();
    res = s.build_step(step);
    out.decode_seconds.push_back(seconds_since(t0));
    allocs += allocations() - a0;
    out.decode_allocations_each.push_back(static_cast<double>(allocations() - a0));
    complete(res);
  }
  out.decode_allocations = static_cast<double>(allocs) / std::max(1, w.decode_steps);
  res = StepResult{};
  out.heap_bytes = heap_in_use() - heap0;
  out.blocks_used = s.cache_stats().blocks_used;
  out.blocks_total = s.cache_stats().blocks_total;
  return out;
}

/// The host block manager's own heap per host block (issue 30's memory target): a manager of
/// `blocks` blocks (default config: LRU), every block stored with a fresh key, its events
/// taken.
double manager_bytes_per_block(std::int64_t blocks, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Key> keys;
  keys.reserve(static_cast<std::size_t>(blocks));
  for (const BlockHash& h : random_hashes(rng, static_cast<std::size_t>(blocks))) {
    keys.push_back(Key{h, 0});
  }
  ManagerFiller fill;
  const double heap0 = heap_in_use();
  ManagerConfig mc;
  mc.host_blocks = blocks;
  HostBlockManager m(mc);
  fill.store(
      m, 0, keys.size(), [&keys](std::uint64_t i) { return keys[i]; }, "manager bench");
  return (heap_in_use() - heap0) / static_cast<double>(blocks);
}

std::vector<GroupConfig> model(int groups) {
  const GroupConfig full{GroupKind::full_attention, 16, 0};
  const GroupConfig window{GroupKind::sliding_window, 16, 1024};
  const GroupConfig mamba{GroupKind::mamba, 16, 0};
  if (groups == 1) return {full};
  if (groups == 2) return {full, window};
  return {full, window, mamba};
}

/// Cost per running request (issue 30): the reference model (3 groups, factor 4, 2048-token
/// prompts) at 256 to 16384 requests. Targets: the decode step's cost per request flat within
/// 1.5x from the smallest to the largest, no allocation in a decode step, at most 100 bytes
/// of scheduler heap per host block.
nlohmann::json requests_sweep(const Options& opt) {
  const std::vector<int> counts =
      opt.quick ? std::vector<int>{64, 256} : std::vector<int>{256, 1024, 4096, 16384};
  const std::size_t runs = opt.runs > 0 ? std::min<std::size_t>(opt.runs, 5) : (opt.quick ? 1 : 3);
  nlohmann::json rows = nlohmann::json::array();
  Progress progress("scheduler requests sweep", counts.size() * runs);
  for (const int n : counts) {
    Workload w;
    w.groups = model(3);
    w.requests = n;
    w.decode_steps = opt.quick ? 8 : 64;
    w.tight_pool = true;
    std::vector<double> per_request, allocs, heap_per_block, empty_per_block, manager_per_block;
    for (std::size_t r = 0; r < runs; ++r) {
      const WorkloadResult res = run_workload(w, 31 + r);
      std::vector<double> d = res.decode_seconds;
      per_request.push_back(summarize(d).median * 1e9 / n);
      allocs.insert(allocs.end(), res.decode_allocations_each.begin(),
                    res.decode_allocations_each.end());
      heap_per_block.push_back(res.heap_bytes /
                               static_cast<double>(std::max<std::int64_t>(res.blocks_used, 1)));
      empty_per_block.push_back(res.heap_empty / static_cast<double>(res.blocks_total));
      manager_per_block.push_back(manager_bytes_per_block(res.blocks_total, 77 + r));
      progress.step(std::to_string(n) + " requests");
    }
    rows.push_back({{"requests", n},
                    {"decode_ns_per_request", to_json(summarize(per_request), "ns")},
                    {"allocations_per_decode_step", summarize(allocs).median},
                    {"allocations_per_decode_step_max", summarize(allocs).max},
                    {"manager_bytes_per_host_block", summarize(manager_per_block).median},
                    {"heap_bytes_per_host_block", summarize(heap_per_block).median},
                    {"heap_bytes_per_pool_block_empty", summarize(empty_per_block).median}});
  }
  progress.done();
  const double first = rows.front()["decode_ns_per_request"]["median_ns"].get<double>();
  const double last = rows.back()["decode_ns_per_request"]["median_ns"].get<double>();
  return {{"model", "full_attention, sliding_window 1024, mamba; factor 4; 2048-token prompts"},
          {"memory_note",
           "manager_bytes_per_host_block: the host block manager (key, state, index slot, LRU "
           "links, free stack) per block of a full pool, the target (100); "
           "heap_bytes_per_host_block: the whole scheduler's heap per stored block, including "
           "every running request's mirror of the engine's block hashes and GPU block ids"},
          {"rows", rows},
          {"per_request_cost_largest_over_smallest", last / first}};
}

}  // namespace

nlohmann::json run_scheduler(const Options& opt, const std::string& preset) {
  // The prefill is one sample a run: 15 runs give a median that a noisy neighbour moves less.
  const std::size_t runs = opt.runs > 0 ? opt.runs : (opt.quick ? 2 : 15);
  nlohmann::json out;
  if (preset == "requests") {
    out["requests_sweep"] = requests_sweep(opt);
    return out;
  }
  {
    // The reference workload.
    Workload w;
    w.groups = model(3);
    if (opt.quick) w.requests = 64;
    std::vector<double> prefill, decode_medians, decode_all, lookups;
    double allocs = 0;
    std::vector<double> allocs_each;
    Progress progress("scheduler reference", runs);
    for (std::size_t r = 0; r < runs; ++r) {
      const WorkloadResult res = run_workload(w, 1000 + r);
      prefill.push_back(res.prefill_seconds * 1e3);
      for (const double d : res.decode_seconds) decode_all.push_back(d * 1e6);
      decode_medians.push_back(summarize([&] {
                                 std::vector<double> v;
                                 for (const double d : res.decode_seconds) v.push_back(d * 1e6);
                                 return v;
                               }())
                                   .median);
      lookups.push_back(res.lookup_seconds * 1e6 / w.requests);
      allocs = std::max(allocs, res.decode_allocations);
      allocs_each.insert(allocs_each.end(), res.decode_allocations_each.begin(),
                         res.decode_allocations_each.end());
      progress.step();
    }
    progress.done();
    const Summary p = summarize(prefill), d = summarize(decode_all);
    out["reference"] = {{"requests", w.requests},
                        {"groups", "full_attention, sliding_window 1024, mamba"},
                        {"block_size_factor", w.factor},
                        {"prefill_step_ms", p.median},
                        {"prefill_step_min_ms", p.min},
                        {"prefill_step_max_ms", p.max},
                        {"decode_step_median_us", d.median},
                        {"decode_step_min_us", d.min},
                        {"decode_step_max_us", d.max},
                        {"allocations_per_decode_step", summarize(allocs_each).median},
                        {"allocations_per_decode_step_mean", allocs},
                        {"allocations_per_decode_step_max", summarize(allocs_each).max},
                        {"note",
                         "allocations: the median decode step stores nothing; the one "
                         "step in 64 that completes a 64-token block makes 256 store "
                         "jobs (about a dozen allocations per job, none per key)"},
                        {"lookup_per_request_us", summarize(lookups).median},
                        {"runs", runs},
                        {"python_reference_decode_ms", 0.47},
                        {"python_reference_prefill_ms", 130.0},
                        {"speedup_decode_vs_python", 470.0 / d.median},
                        {"speedup_prefill_vs_python", 130.0 / p.median}};
  }
  if (preset == "reference") return out;
  // The sweep: 1, 2, 3 groups and factors 1, 4, 16.
  nlohmann::json sweep = nlohmann::json::array();
  const std::vector<int> group_counts{1, 2, 3};
  const std::vector<std::int64_t> factors{1, 4, 16};
  Progress progress("scheduler sweep", group_counts.size() * factors.size());
  for (const int groups : group_counts) {
    for (const std::int64_t f : factors) {
      Workload w;
      w.groups = model(groups);
      w.factor = f;
      w.requests = opt.quick ? 32 : 256;
      w.decode_steps = opt.quick ? 16 : 64;
      std::vector<double> prefill, decode;
      std::uint64_t keys = 0;
      for (std::size_t r = 0; r < std::min<std::size_t>(runs, 3); ++r) {
        const WorkloadResult res = run_workload(w, 7 + r);
        prefill.push_back(res.prefill_seconds * 1e3);
        for (const double d : res.decode_seconds) decode.push_back(d * 1e6);
        keys = res.prefill_keys;
      }
      const Summary p = summarize(prefill), d = summarize(decode);
      sweep.push_back(
          {{"groups", groups},
           {"block_size_factor", f},
           {"requests", w.requests},
           {"prefill_step_ms", p.median},
           {"prefill_ns_per_key", keys > 0 ? p.median * 1e6 / static_cast<double>(keys) : 0},
           {"decode_step_median_us", d.median},
           {"decode_us_per_request", d.median / w.requests}});
      progress.step(std::to_string(groups) + " groups f" + std::to_string(f));
    }
  }
  progress.done();
  out["sweep"] = sweep;
  out["requests_sweep"] = requests_sweep(opt);
  // Lookup of a long prompt: 32k tokens, everything cached.
  {
    SchedulerConfig c;
    c.groups = model(3);
    c.block_size_factor = 4;
    c.manager.host_blocks = 8192;
    Scheduler s(c);
    std::mt19937_64 rng(5);
    const auto hashes = random_hashes(rng, 2048);
    s.update_request("long", 32768, hashes);
    (void)s.lookup("long", 0);
    std::vector<AllocatedGroup> none(3);
    s.on_allocated("long", none, 0);
    ScheduledRequest e{"long", 0, 32768, {}, false};
    GpuBlockId next = 1;
    for (int g = 0; g < 3; ++g) {
      e.new_block_ids.emplace_back();
      for (int k = 0; k < 2048; ++k) e.new_block_ids.back().push_back(next++);
    }
    const StepResult res = s.build_step(std::vector<ScheduledRequest>{e});
    std::vector<JobReport> rep;
    for (const auto& j : res.store_jobs) rep.push_back({j.id, 1, true});
    (void)s.on_completed(rep);
    std::vector<double> t;
    for (int i = 0; i < (opt.quick ? 3 : 21); ++i) {
      const std::string id = "probe-" + std::to_string(i);
      s.update_request(id, 32768, hashes);
      const auto t0 = Clock::now();
      (void)s.lookup(id, 0);
      t.push_back(seconds_since(t0) * 1e6);
    }
    const Summary l = summarize(t);
    out["lookup_32k_tokens"] = to_json(l, "us");
  }
  return out;
}

}  // namespace kvbench
