// kvoffload-bench trace (trace_bench.hpp): the Mooncake trace's requests through a real
// Scheduler and Worker (TraceEngine), with a real disk tier and a real shared tier below the
// host cache when asked, paced by the trace's arrival times when asked.

#include "trace_bench.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <thread>

#include "kvoffload/error.hpp"
#include "kvoffload/tiers/shared_tier.hpp"
#include "trace_engine.hpp"

namespace kvbench {

using namespace kvoffload;

namespace {

constexpr double kLateSeconds = 0.1;              // a request started this far behind its time
constexpr std::int64_t kMaxStartWaitMs = 600000;  // --start-at at most 10 minutes ahead

double peak_rss_mib() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

void check_options(const TraceOptions& o) {
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
  if (o.policy != "lru" && o.policy != "arc" && o.policy != "reuse") {
    throw invalid_argument("trace: --policy must be lru, arc or reuse");
  }
  if (!(o.hint_accuracy >= 0 && o.hint_accuracy <= 1)) {
    throw invalid_argument("trace: --hint-accuracy must be 0 (no hint) to 1");
  }
  const double shared_blocks = o.shared_tokens / static_cast<double>(o.block_tokens);
  if (!(shared_blocks >= 1.0 && shared_blocks <= 1e8)) {
    throw invalid_argument("trace: --shared-tokens must be 1 to 1e8 blocks");
  }
  if (!(o.pace == 0 || (o.pace >= 0.1 && o.pace <= 1e9))) {
    throw invalid_argument("trace: --pace must be 0 (no pacing) or 0.1 to 1e9");
  }
  const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  if (o.start_at_ms < 0 || (o.start_at_ms > 0 && o.start_at_ms > now_ms + kMaxStartWaitMs)) {
    throw invalid_argument("trace: --start-at must be 0 or at most 10 minutes from now (Unix ms)");
  }
}

std::vector<TraceRequest> read_trace(const TraceOptions& o) {
  std::vector<TraceRequest> trace;
  if (o.file == "-") {
    trace = read_mooncake_trace(std::cin, o.limit, o.block_tokens);
  } else {
    std::ifstream in(o.file);
    if (!in) throw invalid_argument("trace: cannot open " + o.file);
    trace = read_mooncake_trace(in, o.limit, o.block_tokens);
  }
  if (trace.empty()) throw invalid_argument("trace: " + o.file + " holds no request");
  return trace;
}

/// What the replay adds up, token-weighted.
struct Tally {
  std::int64_t total = 0;
  std::int64_t host = 0;
  std::vector<std::int64_t> tier;  ///< per tier
  std::int64_t unattributed = 0;   ///< hit tokens neither in host memory nor promoted
  /// First lookup to loaded, by where its hits came from: "miss", "host", "tier".
  std::map<std::string, std::vector<double>> seconds;
  std::size_t late = 0;
  double max_lag = 0;

  void add(const TraceRequest& r, const Replayed& p, std::int64_t bt) {
    // Blocks not in host memory before the request came from the tiers that promoted them
    // (a request's promotions are its own: one request at a time), nearest tier first.
    std::vector<std::uint64_t> left = p.promoted;
    bool from_tier = false;
    for (std::size_t i = 0; i < p.hit_blocks; ++i) {
      const std::int64_t t = block_tokens_of(r, i, bt);
      if (p.host[i] != 0) {
        host += t;
        continue;
      }
      from_tier = true;
      std::size_t k = 0;
      while (k < left.size() && left[k] == 0) ++k;
      if (k == left.size()) {
        unattributed += t;  // a hit no tier promoted (none expected): counted, not guessed
        continue;
      }
      tier[k] += t;
      --left[k];
    }
    total += prompt_tokens(r, bt);
    seconds[p.hit_blocks == 0 ? "miss"
            : from_tier       ? "tier"
                              : "host"]
        .push_back(p.seconds_to_loaded);
  }
};

nlohmann::json tier_json(const TraceEngine& engine, Scheduler& s, std::size_t t, double ratio,
                         std::int64_t bt, std::uint64_t bb) {
  const TierStats ts = s.tier_stats(t);
  nlohmann::json j = {{"hit_ratio", ratio},
                      {"bytes_stored", ts.blocks_written * bb},
                      {"bytes_loaded", ts.promotions * bb},
                      {"failed_promotions", ts.failed_promotions},
                      {"promotions_overdue", ts.promotions_overdue},
                      {"promotions_without_room", ts.promotions_without_room},
                      {"writes_queue_full", ts.writes_queue_full},
                      {"writes_skipped", ts.writes_skipped},
                      {"writes_without_room", ts.writes_without_room},
                      {"failed_writes", ts.failed_writes}};
  if (engine.tier_names()[t] == "disk") {
    j["capacity_tokens"] = ts.blocks_total * bt;
  } else {
    const SharedTierStats ss = engine.worker().shared_tier(t).shared_stats();
    j["presence_checks"] = ts.presence_checks;
    j["presence_hits"] = ts.presence_hits;
    j["presence_errors"] = ts.presence_errors;
    j["read_misses"] = ss.read_misses;
    j["bad_values"] = ss.bad_values;
    j["read_errors"] = ss.read_errors;
    j["write_errors"] = ss.write_errors;
    j["timeouts"] = ss.timeouts;
  }
  return j;
}

}  // namespace

nlohmann::json run_trace(const Options& opt, const TraceOptions& o) {
  check_options(o);
  const std::vector<TraceRequest> trace = read_trace(o);
  std::size_t max_blocks = 0;
  for (const TraceRequest& r : trace) max_blocks = std::max(max_blocks, r.hash_ids.size());
  // The "GPU" cache: one request's blocks of block_bytes each, in this process's memory.
  if (static_cast<double>(max_blocks + 2) * static_cast<double>(o.block_bytes) > 4.0 * (1 << 30)) {
    throw invalid_argument("trace: a request of " + std::to_string(max_blocks) +
                           " blocks needs more than 4 GiB of GPU cache at --block-bytes " +
                           std::to_string(o.block_bytes));
  }
  const std::int64_t origin = o.origin_ms >= 0 ? o.origin_ms : trace[0].timestamp_ms;
  if (o.origin_ms < -1 || (o.pace > 0 && trace[0].timestamp_ms < origin)) {
    throw invalid_argument("trace: --origin-ms " + std::to_string(o.origin_ms) +
                           " must be -1 (the first request's) or a time at or before the first "
                           "request's timestamp " +
                           std::to_string(trace[0].timestamp_ms));
  }
  if (o.pace > 0 && static_cast<double>(trace[0].timestamp_ms - origin) / o.pace >
                        static_cast<double>(kMaxStartWaitMs)) {
    throw invalid_argument(
        "trace: the first request is more than 10 minutes after --origin-ms "
        "at this --pace");
  }

  const std::vector<std::int8_t> hints =
      continue_hints(trace, o.block_tokens, o.hint_accuracy, o.hint_seed);
  TraceEngine engine(o, max_blocks);
  const std::vector<std::string>& names = engine.tier_names();
  Tally tally;
  tally.tier.assign(names.size(), 0);
  // The clock: a fleet's engines all start it at --start-at, so an engine that gets there
  // late counts the delay as lag on every request (late_requests), not as a shifted slice.
  auto start = std::chrono::steady_clock::now();
  if (o.start_at_ms > 0) {
    const std::chrono::system_clock::time_point at{std::chrono::milliseconds(o.start_at_ms)};
    std::this_thread::sleep_until(at);
    const auto late = std::chrono::system_clock::now() - at;
    start = std::chrono::steady_clock::now() -
            std::chrono::duration_cast<std::chrono::steady_clock::duration>(late);
  }
  Progress progress("trace", trace.size());
  for (std::size_t k = 0; k < trace.size(); ++k) {
    const TraceRequest& r = trace[k];
    if (o.pace > 0) {
      const auto due =
          start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(static_cast<double>(r.timestamp_ms - origin) /
                                                    1000.0 / o.pace));
      std::this_thread::sleep_until(due);
      const double lag =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - due).count();
      tally.max_lag = std::max(tally.max_lag, lag);
      if (lag > kLateSeconds) ++tally.late;
    }
    // Built by appending: GCC 12's -O3 -Wrestrict misfires on "literal" + std::string here.
    std::string id = "r";
    id += std::to_string(k);
    // Policy reuse ages requests by the trace's clock, not by how fast the replay runs.
    engine.scheduler().set_time(
        static_cast<double>(std::max<std::int64_t>(0, r.timestamp_ms - trace[0].timestamp_ms)) /
        1000.0);
    tally.add(r, engine.replay(id, r, hints[k]), o.block_tokens);
    if (k % 100 == 99 || k + 1 == trace.size()) progress.step();
  }
  progress.done();
  const double seconds = seconds_since(start);
  const double bound = infinite_hit_ratio(trace, o.block_tokens);
  const auto ratio = [&](std::int64_t t) {
    return tally.total > 0 ? static_cast<double>(t) / static_cast<double>(tally.total) : 0.0;
  };
  std::int64_t hit_tokens = tally.host + tally.unattributed;
  for (const std::int64_t t : tally.tier) hit_tokens += t;
  const double hit_ratio = ratio(hit_tokens);
  // From the clock's origin: with --origin-ms the replay's seconds include the wait for the
  // slice's first request.
  const double trace_seconds =
      static_cast<double>(trace.back().timestamp_ms -
                          (o.pace > 0 ? origin : trace.front().timestamp_ms)) /
      1000.0;
  const CacheStats cs = engine.scheduler().cache_stats();
  // The offline optimum of the same host cache (its capacity as the real one counts it).
  const double optimum = optimum_hit_ratio(trace, o.block_tokens, cs.blocks_total);
  const auto bb = static_cast<std::uint64_t>(o.block_bytes);
  nlohmann::json tiers = {{"host",
                           {{"hit_ratio", ratio(tally.host)},
                            {"capacity_tokens", cs.blocks_total * o.block_tokens},
                            {"bytes_stored", cs.blocks_stored * bb},
                            {"bytes_loaded", cs.blocks_loaded * bb},
                            // Stores that found no room (a request's blocks beyond what
                            // the cache can free): those blocks are not stored.
                            {"stores_without_room", cs.stores_without_room},
                            {"stores_skipped", cs.stores_skipped}}}};
  std::string per_tier;
  for (std::size_t t = 0; t < names.size(); ++t) {
    tiers[names[t]] =
        tier_json(engine, engine.scheduler(), t, ratio(tally.tier[t]), o.block_tokens, bb);
    per_tier += ", ";
    per_tier += names[t];
    per_tier += ' ';
    per_tier += std::to_string(ratio(tally.tier[t]));
  }
  nlohmann::json latency = nlohmann::json::object();
  for (auto& [source, v] : tally.seconds) {
    latency[source] = {
        {"requests", v.size()}, {"p50_s", quantile(v, 0.5)}, {"p99_s", quantile(v, 0.99)}};
    if (o.latency_samples) latency[source]["samples_s"] = v;
  }
  const auto full_bytes = [&](double tokens_) {
    return tokens_ * static_cast<double>(o.model_bytes_per_token);
  };
  nlohmann::json out = {{"format", "mooncake"},
                        {"requests", trace.size()},
                        {"prompt_tokens", tally.total},
                        {"block_tokens", o.block_tokens},
                        {"block_bytes", o.block_bytes},
                        {"policy", o.policy},
                        {"store_threshold", o.store_threshold},
                        {"hint_accuracy", o.hint_accuracy},
                        {"hit_ratio", hit_ratio},
                        {"hit_tokens", hit_tokens},
                        {"unattributed_hit_tokens", tally.unattributed},
                        {"infinite_hit_ratio", bound},
                        {"fraction_of_bound", bound > 0 ? hit_ratio / bound : 0.0},
                        {"optimum_hit_ratio", optimum},
                        {"optimum_fraction_of_bound", bound > 0 ? optimum / bound : 0.0},
                        {"tiers", tiers},
                        {"seconds_to_loaded", latency},
                        {"scheduler_seconds_per_request",
                         engine.scheduler_seconds() / static_cast<double>(trace.size())},
                        {"requests_per_second", static_cast<double>(trace.size()) / seconds},
                        {"trace_seconds", trace_seconds},
                        {"speedup_over_arrival", seconds > 0 ? trace_seconds / seconds : 0.0},
                        {"pace", o.pace},
                        {"origin_ms", origin},
                        {"late_requests", tally.late},
                        {"max_lag_seconds", tally.max_lag},
                        {"peak_rss_mib", peak_rss_mib()},
                        {"full_size",
                         {{"bytes_per_token", o.model_bytes_per_token},
                          {"host_bytes", full_bytes(o.host_tokens)},
                          {"disk_bytes", full_bytes(o.disk_tokens)}}}};
  std::cerr << "trace: " << trace.size() << " requests, " << tally.total
            << " prompt tokens: hit ratio " << hit_ratio << " (host " << ratio(tally.host)
            << per_tier << "), bound " << bound << " (" << (bound > 0 ? hit_ratio / bound : 0.0)
            << " of it), the offline optimum " << optimum << "; "
            << static_cast<double>(trace.size()) / seconds << " requests/s"
            << (o.pace > 0 ? std::string(", ") + std::to_string(tally.late) + " started late"
                           : std::string())
            << "; at " << o.model_bytes_per_token << " bytes per token the host cache would need "
            << full_bytes(o.host_tokens) / (1 << 30) << " GiB\n";
  (void)opt;
  return out;
}

}  // namespace kvbench
