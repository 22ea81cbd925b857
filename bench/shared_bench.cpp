// kvoffload-bench shared: the shared tier's put and get throughput of host blocks over block
// sizes and blocks in flight, side by side with valkey-benchmark (or redis-benchmark) moving
// values of the same size on the same cluster in the same run (a ratio); and the time from
// lookup to a loaded block for a shared-tier hit against a host hit.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "kvoffload/byte_size.hpp"
#include "kvoffload/error.hpp"
#include "kvoffload/scheduler.hpp"
#include "kvoffload/tiers/cluster_client.hpp"
#include "kvoffload/tiers/shared_presence.hpp"
#include "kvoffload/tiers/shared_tier.hpp"
#include "kvoffload/worker.hpp"
#include "scenarios.hpp"
#include "tier_bench_common.hpp"

namespace kvbench {
namespace {

using namespace kvoffload;

/// The benchmark tool the cluster came with.
std::string benchmark_tool() {
  if (capture("command -v valkey-benchmark >/dev/null && echo y")) return "valkey-benchmark";
  if (capture("command -v redis-benchmark >/dev/null && echo y")) return "redis-benchmark";
  return {};
}

/// The tool's SET and GET rates (requests per second, from its CSV) for n requests of `bs`
/// bytes over one connection with `pipeline` in flight, on `node`, all on one key
/// ("key:000000000000", -r 1: SET rewrites it, GET reads what SET wrote). Not in cluster mode:
/// there the tool ends its runs on 250 ms ticks, too coarse here, and spreads its keys over
/// slots that fill a node. nullopt if it failed.
std::optional<std::pair<double, double>> tool_rates(const std::string& tool,
                                                    const ClusterAddress& node, std::uint64_t bs,
                                                    unsigned pipeline, std::int64_t n,
                                                    const SharedAccess& access) {
  // Over TLS and with AUTH when the tier is. The tool takes the password only as -a: read
  // from its file by the shell, it is in the tool's arguments for the run (loopback tests).
  std::string secure;
  if (!access.tls_ca_file.empty()) secure += " --tls --cacert '" + access.tls_ca_file + "'";
  if (!access.password_file.empty()) {
    secure += " -a \"$(cat '" + access.password_file + "')\"";
    if (!access.user.empty()) secure += " --user '" + access.user + "'";
  }
  const std::string cmd = tool + secure + " -h " + node.host + " -p " + std::to_string(node.port) +
                          " -t set,get -r 1 -d " + std::to_string(bs) + " -c 1 -P " +
                          std::to_string(pipeline) + " -n " + std::to_string(n) +
                          " --csv 2>/dev/null";
  const auto out = capture(cmd);
  if (!out) return std::nullopt;
  // "test","rps",...  then  "SET","<rps>",...  and  "GET","<rps>",...
  double set = 0, get = 0;
  std::size_t at = 0;
  while (at < out->size()) {
    const std::size_t end = out->find('\n', at);
    const std::string line = out->substr(at, end == std::string::npos ? end : end - at);
    at = end == std::string::npos ? out->size() : end + 1;
    const std::size_t comma = line.find("\",\"");
    if (comma == std::string::npos) continue;
    double rps = 0;
    try {
      rps = std::stod(line.substr(comma + 3));
    } catch (const std::exception&) {
      continue;
    }
    if (line.rfind("\"SET\"", 0) == 0) set = rps;
    if (line.rfind("\"GET\"", 0) == 0) get = rps;
  }
  if (set <= 0 || get <= 0) return std::nullopt;
  return std::pair{set, get};
}

/// n blocks moved by tier jobs (time_tier_jobs): distinct keys from distinct host blocks (the
/// tier's pattern), or with one_key, one key n times (the baseline's pattern: one value
/// rewritten or reread, hot in the server's cache), written from one host block.
double time_job(SharedTier& tier, JobId id, JobKind kind, std::int64_t n, std::int64_t pool_blocks,
                std::uint64_t salt, bool one_key) {
  try {
    return time_tier_jobs(
        tier, id, kind, n, pool_blocks,
        [&](std::int64_t i) { return bench_key(one_key ? 0 : i, salt); },
        [](std::int64_t) { return std::int64_t{-1}; },
        [&](std::int64_t i) { return static_cast<HostBlockId>(one_key ? 0 : i % pool_blocks); });
  } catch (const error& e) {
    const SharedTierStats st = tier.shared_stats();
    throw error(std::string(e.what()) + " of " + std::to_string(n) + " (read misses " +
                std::to_string(st.read_misses) + ", bad values " + std::to_string(st.bad_values) +
                ", read errors " + std::to_string(st.read_errors) + ", write errors " +
                std::to_string(st.write_errors) + "); is the cluster up and big enough?");
  }
}

/// The bench's own client settings (the cleaner's, the owner lookup's): TLS and AUTH as given.
ClusterClientConfig client_config(const std::string& nodes, const SharedAccess& access) {
  ClusterClientConfig cc;
  cc.seeds = parse_cluster_nodes(nodes, "--nodes");
  cc.reply_timeout_ms = 10000;
  cc.tls.enabled = !access.tls_ca_file.empty();
  cc.tls.ca_file = access.tls_ca_file;
  cc.username = access.user;
  if (!access.password_file.empty()) {
    const auto password = capture("cat '" + access.password_file + "'");
    if (!password) throw error("shared bench: cannot read " + access.password_file);
    cc.password = *password;
    while (!cc.password.empty() && cc.password.back() == '\n') cc.password.pop_back();
  }
  return cc;
}

/// The node owning the slot of `key` (the baseline's one connection goes there).
ClusterAddress owner(const std::string& nodes, const std::string& key, const SharedAccess& access) {
  ClusterClient client(client_config(nodes, access));
  if (!client.refresh()) throw error("shared bench: no node of " + nodes + " answered");
  const std::string o = client.owner_of(cluster_key_slot(key));
  return parse_cluster_nodes(o, "owner")[0];
}

/// The fleet secret the bench's tiers use: a random one in an environment variable of its
/// own, set before any tier starts a thread (the values are deleted after each cell anyway).
SharedTierConfig bench_config(const std::string& nodes, const std::string& name,
                              const SharedAccess& access) {
  static const bool set = [] {
    std::random_device rd;
    char secret[40];
    std::snprintf(secret, sizeof(secret), "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
    return ::setenv("KVOFFLOAD_BENCH_SECRET", secret, 1) == 0;
  }();
  if (!set) throw error("shared bench: setenv(KVOFFLOAD_BENCH_SECRET) failed");
  SharedTierConfig c;
  c.nodes = nodes;
  c.name = name;
  c.secret_env = "KVOFFLOAD_BENCH_SECRET";
  c.tls = !access.tls_ca_file.empty();
  c.tls_ca_file = access.tls_ca_file;
  c.username = access.user;
  c.password_file = access.password_file;
  return c;
}

/// The MAC's cost: the value MAC (what every value written or read is signed or checked with:
/// HMAC-SHA-256 of name and header for a one-time key, GMAC of the payload) over 4 MiB buffers,
/// side by side with memcpy of the same bytes, in seconds per GiB.
nlohmann::json mac_cost(const Options& opt, const std::string& nodes) {
  const SharedKeys keys(bench_config(nodes, "kvoffload-bench-mac", SharedAccess{}), 1);
  const std::size_t bytes = 4 << 20;
  const int rounds = opt.quick ? 16 : 128;  // 64 MiB or 512 MiB per run
  std::vector<std::byte> src(bytes, std::byte{0x5a}), dst(bytes);
  std::vector<double> mac, copy;
  const std::size_t runs = opt.runs > 0 ? opt.runs : 5;
  const double gib = static_cast<double>(bytes) * rounds / static_cast<double>(1ULL << 30);
  std::uint8_t sink = 0;
  for (std::size_t r = 0; r < runs; ++r) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) sink ^= static_cast<std::uint8_t>(keys.mac_of(src)[0]);
    mac.push_back(seconds_since(start) / gib);
    start = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) {
      std::memcpy(dst.data(), src.data(), bytes);
      sink ^= static_cast<std::uint8_t>(dst[static_cast<std::size_t>(i) % bytes]);
    }
    copy.push_back(seconds_since(start) / gib);
  }
  const Summary m = summarize(mac), c = summarize(copy);
  return {{"value_mac_seconds_per_gib", to_json(m, "s")},
          {"memcpy_seconds_per_gib", to_json(c, "s")},
          {"ratio_mac_to_memcpy", m.median / c.median},
          {"sink", sink},
          {"note",
           "one thread; each value written is signed once and each value read is checked "
           "once, so a block costs this over its bytes on top of the copy"}};
}

nlohmann::json throughput(const Options& opt, const std::string& nodes, std::uint64_t total,
                          const SharedAccess& access) {
  const std::vector<std::uint64_t> sizes =
      opt.quick ? std::vector<std::uint64_t>{256 << 10, 4 << 20}
                : std::vector<std::uint64_t>{256 << 10, 1 << 20, 4 << 20, 8 << 20};
  const std::vector<unsigned> depths =
      opt.quick ? std::vector<unsigned>{1, 16} : std::vector<unsigned>{1, 4, 16};
  const std::size_t runs = opt.runs > 0 ? opt.runs : (opt.quick ? 1 : 3);
  const std::string tool = benchmark_tool();
  // The baseline runs on the master owning the tool's key.
  const std::string tool_key = "key:000000000000";
  const ClusterAddress base_node = owner(nodes, tool_key, access);
  ClusterClient cleaner(client_config(nodes, access));
  nlohmann::json rows = nlohmann::json::array();
  Progress progress("shared throughput", sizes.size() * depths.size() * runs);
  std::uint64_t salt = std::random_device{}();
  for (const std::uint64_t bs : sizes) {
    for (const unsigned inflight : depths) {
      const auto n = static_cast<std::int64_t>(std::max<std::uint64_t>(total / bs, 16));
      // Two jobs of half the pool each in flight (time_tier_jobs): at least in_flight each.
      const std::int64_t pool_blocks = std::max<std::int64_t>(
          std::min<std::int64_t>(n, 32), 2 * static_cast<std::int64_t>(inflight));
      HostPool pool(pool_blocks, bs);
      std::vector<double> kw, kr, hw, hr, bw, br;
      ++salt;  // the cell's keys: each run rewrites them; deleted after the cell
      for (std::size_t r = 0; r < runs; ++r) {
        SharedTierConfig c = bench_config(nodes, "kvoffload-bench", access);
        c.in_flight = static_cast<int>(inflight);
        c.reply_timeout_ms = 10000;
        {
          SharedTier tier(c, 1, "bench", bs, [&](HostBlockId id) { return pool.block(id); });
          const double bytes = static_cast<double>(n) * static_cast<double>(bs);
          kw.push_back(bytes / time_job(tier, 1, JobKind::write, n, pool_blocks, salt, false));
          kr.push_back(bytes / time_job(tier, 2, JobKind::promote, n, pool_blocks, salt, false));
          hw.push_back(bytes / time_job(tier, 3, JobKind::write, n, pool_blocks, salt, true));
          hr.push_back(bytes / time_job(tier, 4, JobKind::promote, n, pool_blocks, salt, true));
        }
        if (!tool.empty()) {
          if (const auto rates = tool_rates(tool, base_node, bs, inflight, n, access)) {
            bw.push_back(rates->first * static_cast<double>(bs));
            br.push_back(rates->second * static_cast<double>(bs));
          }
        }
        progress.step(format_bytes(bs) + " x" + std::to_string(inflight));
      }
      // Leave the cluster as it was (untimed): the cell's values, then the baseline's.
      const SharedKeys keys(bench_config(nodes, "kvoffload-bench", access), 1);
      std::vector<std::string> names;
      for (std::int64_t i = 0; i < n; ++i) names.push_back(keys.name(bench_key(i, salt), 0, 0));
      names.push_back(tool_key);
      std::vector<ClusterCommand> unlink;
      for (const std::string& k : names) unlink.push_back({.key = k, .args = {"UNLINK", k}});
      cleaner.run(unlink, [](std::size_t, const ClusterReply&) {});
      nlohmann::json row;
      row["block_bytes"] = bs;
      row["in_flight"] = inflight;
      row["blocks"] = n;
      const Summary sw = summarize(kw), sr = summarize(kr), shw = summarize(hw),
                    shr = summarize(hr);
      row["kvoffload_put"] = to_json(sw, "B/s");
      row["kvoffload_get"] = to_json(sr, "B/s");
      row["kvoffload_put_one_key"] = to_json(shw, "B/s");
      row["kvoffload_get_one_key"] = to_json(shr, "B/s");
      if (!bw.empty() && !br.empty()) {
        const Summary s_bw = summarize(bw), s_br = summarize(br);
        row["baseline_set"] = to_json(s_bw, "B/s");
        row["baseline_get"] = to_json(s_br, "B/s");
        // Like for like (one value, as the tool moves), and the tier's own pattern.
        row["put_ratio"] = shw.median / s_bw.median;
        row["get_ratio"] = shr.median / s_br.median;
        row["put_ratio_distinct"] = sw.median / s_bw.median;
        row["get_ratio_distinct"] = sr.median / s_br.median;
      }
      rows.push_back(row);
    }
  }
  progress.done();
  return {
      {"baseline", tool.empty() ? "none found" : tool},
      {"baseline_node", base_node.host + ":" + std::to_string(base_node.port)},
      {"note",
       "payload bytes per second; kvoffload also moves a 112-byte header per value and "
       "signs or checks its MAC (HMAC-keyed GMAC), one thread, one connection per node, in_flight "
       "commands per pipelined batch. "
       "The baseline moves same-size values over one connection to one master with the "
       "same pipeline depth (-t set,get -d <block> -r 1: SET rewrites one key, GET reads "
       "it), not in cluster mode. put/get_ratio compare kvoffload moving one key from one "
       "host block the same way (like for like); *_distinct: distinct keys from distinct "
       "host blocks, spread over every master (the tier's own pattern: cold caches)"},
      {"results", rows}};
}

nlohmann::json latency(const Options& opt, const std::string& nodes, const SharedAccess& access) {
  const std::uint64_t page = 1 << 20;
  const std::string name = "kvoffload-bench-latency-" + std::to_string(std::random_device{}());
  std::vector<BlockHash> prefix;
  for (std::int64_t i = 0; i < TierRig::kBlocks; ++i)
    prefix.push_back(bench_key(i + 1000, 99).hash);
  const auto make = [&] {  // each another engine: empty host cache, the same namespace
    SharedTierConfig shared = bench_config(nodes, name, access);
    shared.in_flight = 16;
    TierConfig tc;
    tc.medium = Medium::shared;
    tc.blocks = 1024;
    tc.store = shared;
    return std::make_unique<TierRig>(page, tc, prefix);
  };
  return hit_latency(opt, "shared", page, make);
}

}  // namespace

nlohmann::json run_shared(const Options& opt, const std::string& nodes, const std::string& size,
                          const SharedAccess& access) {
  const std::uint64_t total = parse_bytes(size, "--size");
  nlohmann::json out;
  out["nodes"] = nodes;
  out["tls"] = !access.tls_ca_file.empty();
  out["auth"] = !access.user.empty() || !access.password_file.empty();
  out["bytes_per_measurement"] = total;
  out["mac_cost"] = mac_cost(opt, nodes);
  out["throughput"] = throughput(opt, nodes, total, access);
  out["lookup_to_loaded"] = latency(opt, nodes, access);
  return out;
}

}  // namespace kvbench
