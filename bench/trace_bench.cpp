// kvoffload-bench trace (trace_bench.hpp): the Mooncake trace's requests through a real
// Scheduler and Worker (host backend: the "GPU" cache is ordinary memory), with a real disk
// tier below the host cache when asked.

#include "trace_bench.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <unordered_set>

#include "kvoffload/error.hpp"
#include "kvoffload/scheduler.hpp"
#include "kvoffload/tiers/shared_presence.hpp"
#include "kvoffload/worker.hpp"

namespace kvbench {

using namespace kvoffload;

namespace {

constexpr std::size_t kMaxLine = 1 << 20;    // a request's line (the trace's longest: ~3 KB)
constexpr std::size_t kMaxBlocks = 1 << 16;  // hash ids per request
constexpr int kMaxLookups = 100000;          // per request: "retry later" while a tier answers

/// The next line of `in` into `line`, refused past kMaxLine before more is kept. False at
/// the end.
bool bounded_line(std::istream& in, std::string& line, std::size_t number) {
  line.clear();
  int c = 0;
  while ((c = in.get()) != std::char_traits<char>::eof()) {
    if (c == '\n') return true;
    if (line.size() == kMaxLine) {
      throw invalid_argument("trace line " + std::to_string(number) + ": longer than " +
                             std::to_string(kMaxLine) + " bytes");
    }
    line.push_back(static_cast<char>(c));
  }
  return !line.empty();
}

std::int64_t int_field(const nlohmann::json& j, const char* name, std::size_t number) {
  const auto it = j.find(name);
  if (it == j.end() || !it->is_number_integer() || it->get<std::int64_t>() < 0) {
    throw invalid_argument("trace line " + std::to_string(number) + ": \"" + name +
                           "\" must be a non-negative integer");
  }
  return it->get<std::int64_t>();
}

BlockHash hash_of(std::uint64_t id) {
  std::uint8_t bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<std::uint8_t>(id >> (8 * i));
  return BlockHash::from_bytes(bytes);
}

/// Tokens of block i of a request: block_tokens, the last one what remains of the prompt.
std::int64_t block_tokens_of(const TraceRequest& r, std::size_t i, std::int64_t block_tokens) {
  if (i + 1 < r.hash_ids.size()) return block_tokens;
  const std::int64_t rest =
      r.input_length - block_tokens * static_cast<std::int64_t>(r.hash_ids.size() - 1);
  return std::clamp<std::int64_t>(rest, 0, block_tokens);
}

std::int64_t prompt_tokens(const TraceRequest& r, std::int64_t block_tokens) {
  std::int64_t t = 0;
  for (std::size_t i = 0; i < r.hash_ids.size(); ++i) t += block_tokens_of(r, i, block_tokens);
  return t;
}

double peak_rss_mib() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

/// One engine: scheduler, worker (host backend) and its tiers, for requests of up to
/// `max_blocks` blocks.
class TraceEngine {
 public:
  TraceEngine(const TraceOptions& o, std::size_t max_blocks)
      : gpu_((max_blocks + 2) * static_cast<std::size_t>(o.block_bytes)) {
    const auto bt = o.block_tokens;
    SchedulerConfig sc;
    sc.groups = {GroupConfig{GroupKind::full_attention, bt, 0}};
    sc.hash_block_size = bt;
    sc.manager.host_blocks =
        std::max<std::int64_t>(1, static_cast<std::int64_t>(o.host_tokens) / bt);
    sc.manager.policy = o.policy == "arc" ? EvictionPolicyKind::arc : EvictionPolicyKind::lru;
    sc.manager.store_threshold = o.store_threshold;
    sc.manager.enable_events = false;
    // A weights identity of its own: slots a previous run left in the directory are never
    // found (another epoch), so every run starts empty.
    sc.weights = "trace-bench-" +
                 std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
    const bool disk = o.disk_tokens > 0;
    if (disk) {
      if (o.disk_dir.empty()) throw invalid_argument("trace: --disk-tokens needs --disk DIR");
      const auto slots = static_cast<std::uint64_t>(o.disk_tokens) / static_cast<std::uint64_t>(bt);
      DiskTierConfig d;
      d.path = o.disk_dir;
      // A slot: a 4 KiB header and the block, rounded up to 4 KiB.
      const std::uint64_t slot_bytes =
          4096 + (static_cast<std::uint64_t>(o.block_bytes) + 4095) / 4096 * 4096;
      d.capacity_bytes = std::max<std::uint64_t>(1, slots) * slot_bytes;
      d.model = "mooncake-trace";
      d.dtype = "bytes";
      TierConfig t;
      t.medium = Medium::disk;
      t.blocks = 1;  // the worker's slots, once it is open
      t.policy = sc.manager.policy;
      t.store_threshold = o.store_threshold;
      t.store = d;
      sc.tiers.push_back(t);
    }
    WorkerConfig wc;
    wc.tensors.push_back({reinterpret_cast<std::uintptr_t>(gpu_.data()),
                          static_cast<std::int64_t>(max_blocks + 2), o.block_bytes, o.block_bytes});
    wc.groups = {{{0, o.block_bytes}}};
    wc.threads = 2;
    worker_ = std::make_unique<Worker>(derive_worker_config(sc, std::move(wc)));
    if (disk) sc.tiers[0].blocks = worker_->tier(0).num_slots();
    scheduler_ = std::make_unique<Scheduler>(sc, make_scheduler_services(sc));
    ids_.reserve(max_blocks + 1);
    for (std::size_t i = 0; i <= max_blocks; ++i) ids_.push_back(static_cast<GpuBlockId>(i + 1));
  }

  Scheduler& scheduler() { return *scheduler_; }
  [[nodiscard]] double scheduler_seconds() const { return scheduler_seconds_; }

  /// Replays one request; returns how many of its leading blocks were hits, and which of
  /// them came from host memory (host[i]) rather than a tier.
  std::size_t replay(const std::string& id, const TraceRequest& r, std::int64_t bt,
                     std::vector<char>& host) {
    const std::size_t n = r.hash_ids.size();
    hashes_.clear();
    for (const std::uint64_t h : r.hash_ids) hashes_.push_back(hash_of(h));
    host.assign(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
      host[i] = scheduler_->manager().peek(Key{hashes_[i], 0}) != LookupResult::miss ? 1 : 0;
    }
    const std::int64_t tokens = static_cast<std::int64_t>(n) * bt + 1;  // one more: computed
    std::optional<std::int64_t> hit;
    timed([&] { scheduler_->update_request(id, tokens, hashes_); });
    for (int i = 0; i < kMaxLookups; ++i) {
      timed([&] { hit = scheduler_->lookup(id, 0); });
      if (hit) break;
      step({});  // a promotion from a tier
    }
    if (!hit) throw error("trace: request " + id + ": the lookup never answered");
    const std::vector<GpuBlockId> blocks(ids_.begin(), ids_.begin() + static_cast<long>(n + 1));
    timed([&] {
      scheduler_->on_allocated(id, std::vector<AllocatedGroup>{AllocatedGroup{blocks, 0}}, *hit);
    });
    const ScheduledRequest e{id, *hit, tokens - *hit, {blocks}, false};
    step(std::span(&e, 1));  // its load and its store
    timed([&] { scheduler_->on_finished(id); });
    for (int i = 0; i < 16 && scheduler_->num_jobs_in_flight() > 0; ++i) step({});
    step({});  // the write-through of what it stored
    return static_cast<std::size_t>(*hit / bt);
  }

 private:
  template <class F>
  void timed(F&& f) {
    const auto start = std::chrono::steady_clock::now();
    f();
    scheduler_seconds_ += seconds_since(start);
  }

  /// One engine step: build, run every job on the worker, wait, report.
  void step(std::span<const ScheduledRequest> scheduled) {
    StepResult out;
    timed([&] { out = scheduler_->build_step(scheduled); });
    std::vector<JobId> ids;
    for (const TransferJob& j : out.load_jobs) {
      worker_->submit(j);
      ids.push_back(j.id);
    }
    for (const TransferJob& j : out.store_jobs) {
      worker_->submit(j);
      ids.push_back(j.id);
    }
    for (const TierJob& j : out.tier_jobs) {
      worker_->submit_tier(j);
      ids.push_back(j.id);
    }
    worker_->start_step();
    worker_->wait(ids);
    std::vector<JobReport> reports;
    for (const FinishedTransfer& f : worker_->get_finished()) reports.push_back({f.job, 1, f.ok});
    timed([&] { (void)scheduler_->on_completed(reports); });
  }

  std::vector<std::byte> gpu_;
  std::unique_ptr<Worker> worker_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<GpuBlockId> ids_;
  std::vector<BlockHash> hashes_;
  double scheduler_seconds_ = 0;
};

}  // namespace

std::vector<TraceRequest> read_mooncake_trace(std::istream& in, std::size_t limit,
                                              std::int64_t block_tokens) {
  std::vector<TraceRequest> out;
  std::string line;
  for (std::size_t number = 1; (limit == 0 || out.size() < limit) && bounded_line(in, line, number);
       ++number) {
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      throw invalid_argument("trace line " + std::to_string(number) + ": not JSON: " + e.what());
    }
    if (!j.is_object()) {
      throw invalid_argument("trace line " + std::to_string(number) + ": not a JSON object");
    }
    TraceRequest r;
    r.timestamp_ms = int_field(j, "timestamp", number);
    r.input_length = int_field(j, "input_length", number);
    const auto ids = j.find("hash_ids");
    if (ids == j.end() || !ids->is_array() || ids->empty() || ids->size() > kMaxBlocks) {
      throw invalid_argument("trace line " + std::to_string(number) +
                             ": \"hash_ids\" must be an array of 1 to " +
                             std::to_string(kMaxBlocks) + " ids");
    }
    for (const auto& id : *ids) {
      if (!id.is_number_unsigned()) {
        throw invalid_argument("trace line " + std::to_string(number) +
                               ": \"hash_ids\" holds a value that is not a non-negative integer");
      }
      r.hash_ids.push_back(id.get<std::uint64_t>());
    }
    // The last block holds what remains of the prompt: 1 to block_tokens tokens.
    const auto n = static_cast<std::int64_t>(r.hash_ids.size());
    if (r.input_length <= block_tokens * (n - 1) || r.input_length > block_tokens * n) {
      throw invalid_argument("trace line " + std::to_string(number) + ": \"input_length\" " +
                             std::to_string(r.input_length) + " does not fit " + std::to_string(n) +
                             " blocks of " + std::to_string(block_tokens) + " tokens");
    }
    out.push_back(std::move(r));
  }
  return out;
}

double infinite_hit_ratio(const std::vector<TraceRequest>& trace, std::int64_t block_tokens) {
  std::unordered_set<std::uint64_t> seen;
  std::int64_t hit = 0, total = 0;
  for (const TraceRequest& r : trace) {
    std::size_t i = 0;
    while (i < r.hash_ids.size() && seen.contains(r.hash_ids[i])) {
      hit += block_tokens_of(r, i, block_tokens);
      ++i;
    }
    total += prompt_tokens(r, block_tokens);
    seen.insert(r.hash_ids.begin(), r.hash_ids.end());
  }
  return total > 0 ? static_cast<double>(hit) / static_cast<double>(total) : 0.0;
}

nlohmann::json run_trace(const Options& opt, const TraceOptions& o) {
  if (o.block_tokens < 1) throw invalid_argument("trace: --block-tokens must be at least 1");
  if (o.block_bytes < 64 || o.block_bytes > (1 << 20)) {
    throw invalid_argument("trace: --block-bytes must be 64 to 1048576");
  }
  // Whole blocks, at least one, and memory (the host pool) and disk this machine could hold.
  for (const auto& [name, tokens] :
       {std::pair{"--host-tokens", o.host_tokens}, std::pair{"--disk-tokens", o.disk_tokens}}) {
    const double blocks = tokens / static_cast<double>(o.block_tokens);
    const bool host = std::string_view(name) == "--host-tokens";
    if (!(blocks >= (host ? 1.0 : 0.0)) || blocks * static_cast<double>(o.block_bytes) > 1e12) {
      throw invalid_argument(std::string("trace: ") + name + " must be " +
                             (host ? "at least one block" : "0 or more") +
                             " and its blocks at most 1e12 bytes");
    }
  }
  if (o.policy != "lru" && o.policy != "arc") {
    throw invalid_argument("trace: --policy must be lru or arc");
  }
  std::vector<TraceRequest> trace;
  if (o.file == "-") {
    trace = read_mooncake_trace(std::cin, o.limit, o.block_tokens);
  } else {
    std::ifstream in(o.file);
    if (!in) throw invalid_argument("trace: cannot open " + o.file);
    trace = read_mooncake_trace(in, o.limit, o.block_tokens);
  }
  if (trace.empty()) throw invalid_argument("trace: " + o.file + " holds no request");
  std::size_t max_blocks = 0;
  for (const TraceRequest& r : trace) max_blocks = std::max(max_blocks, r.hash_ids.size());

  TraceEngine engine(o, max_blocks);
  const bool disk = o.disk_tokens > 0;
  std::int64_t total = 0, hit_host = 0, hit_tier = 0;
  std::vector<char> host;
  Progress progress("trace", trace.size());
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t k = 0; k < trace.size(); ++k) {
    const TraceRequest& r = trace[k];
    const std::size_t hit_blocks = engine.replay("r" + std::to_string(k), r, o.block_tokens, host);
    for (std::size_t i = 0; i < hit_blocks; ++i) {
      (host[i] != 0 ? hit_host : hit_tier) += block_tokens_of(r, i, o.block_tokens);
    }
    total += prompt_tokens(r, o.block_tokens);
    if (k % 100 == 99 || k + 1 == trace.size()) progress.step();
  }
  progress.done();
  const double seconds = seconds_since(start);
  const double bound = infinite_hit_ratio(trace, o.block_tokens);
  const auto ratio = [&](std::int64_t t) {
    return total > 0 ? static_cast<double>(t) / static_cast<double>(total) : 0.0;
  };
  const double hit_ratio = ratio(hit_host + hit_tier);
  const double trace_seconds =
      static_cast<double>(trace.back().timestamp_ms - trace.front().timestamp_ms) / 1000.0;
  const CacheStats cs = engine.scheduler().cache_stats();
  const auto bb = static_cast<std::uint64_t>(o.block_bytes);
  nlohmann::json tiers = {{"host",
                           {{"hit_ratio", ratio(hit_host)},
                            {"capacity_tokens", cs.blocks_total * o.block_tokens},
                            {"bytes_stored", cs.blocks_stored * bb},
                            {"bytes_loaded", cs.blocks_loaded * bb},
                            // Stores that found no room (a request's blocks beyond what
                            // the cache can free): those blocks are not stored.
                            {"stores_without_room", cs.stores_without_room},
                            {"stores_skipped", cs.stores_skipped}}}};
  if (disk) {
    const TierStats ts = engine.scheduler().tier_stats(0);
    tiers["disk"] = {{"hit_ratio", ratio(hit_tier)},
                     {"capacity_tokens", ts.blocks_total * o.block_tokens},
                     {"bytes_stored", ts.blocks_written * bb},
                     {"bytes_loaded", ts.promotions * bb},
                     {"failed_promotions", ts.failed_promotions},
                     {"promotions_without_room", ts.promotions_without_room},
                     {"writes_queue_full", ts.writes_queue_full},
                     {"writes_skipped", ts.writes_skipped},
                     {"writes_without_room", ts.writes_without_room}};
  }
  const auto full_bytes = [&](double tokens_) {
    return tokens_ * static_cast<double>(o.model_bytes_per_token);
  };
  nlohmann::json out = {{"format", "mooncake"},
                        {"requests", trace.size()},
                        {"prompt_tokens", total},
                        {"block_tokens", o.block_tokens},
                        {"block_bytes", o.block_bytes},
                        {"policy", o.policy},
                        {"store_threshold", o.store_threshold},
                        {"hit_ratio", hit_ratio},
                        {"infinite_hit_ratio", bound},
                        {"fraction_of_bound", bound > 0 ? hit_ratio / bound : 0.0},
                        {"tiers", tiers},
                        {"scheduler_seconds_per_request",
                         engine.scheduler_seconds() / static_cast<double>(trace.size())},
                        {"requests_per_second", static_cast<double>(trace.size()) / seconds},
                        {"trace_seconds", trace_seconds},
                        {"speedup_over_arrival", seconds > 0 ? trace_seconds / seconds : 0.0},
                        {"peak_rss_mib", peak_rss_mib()},
                        {"full_size",
                         {{"bytes_per_token", o.model_bytes_per_token},
                          {"host_bytes", full_bytes(o.host_tokens)},
                          {"disk_bytes", full_bytes(o.disk_tokens)}}}};
  std::cerr << "trace: " << trace.size() << " requests, " << total << " prompt tokens: hit ratio "
            << hit_ratio << " (host " << ratio(hit_host) << (disk ? ", disk " : "")
            << (disk ? std::to_string(ratio(hit_tier)) : std::string()) << "), bound " << bound
            << " (" << (bound > 0 ? hit_ratio / bound : 0.0) << " of it); "
            << static_cast<double>(trace.size()) / seconds << " requests/s; at "
            << o.model_bytes_per_token << " bytes per token the host cache would need "
            << full_bytes(o.host_tokens) / (1 << 30) << " GiB\n";
  (void)opt;
  return out;
}

}  // namespace kvbench
