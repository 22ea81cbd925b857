// kvoffload-bench disk: the disk tier's write and read throughput over block sizes and queue
// depths, side by side with fio doing sequential O_DIRECT I/O of the same block size on the
// same file system in the same run (a ratio); and the time from lookup to a loaded block for a
// disk hit against a host hit.

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "kvoffload/byte_size.hpp"
#include "kvoffload/error.hpp"
#include "kvoffload/scheduler.hpp"
#include "kvoffload/tiers/disk_tier.hpp"
#include "kvoffload/worker.hpp"
#include "scenarios.hpp"
#include "tier_bench_common.hpp"

namespace kvbench {
namespace {

namespace fs = std::filesystem;
using namespace kvoffload;

/// fio's sequential throughput in bytes per second (nullopt: fio missing or failed).
std::optional<double> fio_bandwidth(const fs::path& file, bool write, std::uint64_t bs,
                                    unsigned depth, std::uint64_t total, bool direct) {
  const std::string cmd = "fio --name=kvoffload --filename=" + file.string() +
                          " --rw=" + (write ? "write" : "read") + " --bs=" + std::to_string(bs) +
                          " --size=" + std::to_string(total) + " --direct=" + (direct ? "1" : "0") +
                          " --ioengine=io_uring --iodepth=" + std::to_string(depth) +
                          " --output-format=json 2>/dev/null";
  const auto out = capture(cmd);
  if (!out) return std::nullopt;
  const auto doc = nlohmann::json::parse(*out, nullptr, false);
  if (doc.is_discarded() || !doc.contains("jobs") || doc["jobs"].empty()) return std::nullopt;
  const auto& side = doc["jobs"][0][write ? "write" : "read"];
  if (!side.contains("bw_bytes")) return std::nullopt;
  return side["bw_bytes"].get<double>();
}

/// `n` blocks moved by tier jobs (time_tier_jobs: host blocks cycled over the pool).
double time_job(DiskTier& tier, JobId id, JobKind kind, std::int64_t n, std::int64_t pool_blocks) {
  return time_tier_jobs(
      tier, id, kind, n, pool_blocks, [](std::int64_t i) { return bench_key(i, 0x5a); },
      [](std::int64_t i) { return i; },
      [&](std::int64_t i) { return static_cast<HostBlockId>(i % pool_blocks); });
}

nlohmann::json throughput(const Options& opt, const fs::path& dir, std::uint64_t total) {
  const std::vector<std::uint64_t> sizes =
      opt.quick ? std::vector<std::uint64_t>{64 << 10, 1 << 20}
                : std::vector<std::uint64_t>{64 << 10, 256 << 10, 1 << 20, 4 << 20};
  const std::vector<unsigned> depths =
      opt.quick ? std::vector<unsigned>{1, 16} : std::vector<unsigned>{1, 4, 16, 64};
  const std::size_t runs = opt.runs > 0 ? opt.runs : (opt.quick ? 1 : 3);
  const bool have_fio = capture("command -v fio >/dev/null && echo yes").has_value();
  nlohmann::json rows = nlohmann::json::array();
  Progress progress("disk throughput", sizes.size() * depths.size() * runs);
  std::string engine;
  bool direct = true;
  for (const std::uint64_t bs : sizes) {
    for (const unsigned qd : depths) {
      const auto n = static_cast<std::int64_t>(std::max<std::uint64_t>(total / bs, 4));
      // Two jobs of half the pool each in flight (time_tier_jobs): at least io_depth each.
      const std::int64_t pool_blocks =
          std::max<std::int64_t>(std::min<std::int64_t>(n, 64), 2 * static_cast<std::int64_t>(qd));
      HostPool pool(pool_blocks, bs);
      std::vector<double> kw, kr, fw, fr;
      for (std::size_t r = 0; r < runs; ++r) {
        const fs::path tier_dir = dir / "tier";
        fs::remove_all(tier_dir);
        DiskTierConfig c;
        c.path = tier_dir.string();
        c.capacity_bytes = static_cast<std::uint64_t>(n) * (bs + 4096);
        c.io = parse_disk_io(opt.disk_io, "--io");
        c.io_depth = static_cast<int>(qd);
        c.io_threads = static_cast<int>(qd);
        c.model = "bench";
        {
          DiskTier tier(c, "bench", bs, [&](HostBlockId id) { return pool.block(id); });
          engine = std::string(to_string(tier.io()));
          direct = tier.slots().direct();
          kw.push_back(static_cast<double>(n) * static_cast<double>(bs) /
                       time_job(tier, 1, JobKind::write, n, pool_blocks));
          kr.push_back(static_cast<double>(n) * static_cast<double>(bs) /
                       time_job(tier, 2, JobKind::promote, n, pool_blocks));
        }
        fs::remove_all(tier_dir);
        if (have_fio) {
          const fs::path file = dir / "fio.dat";
          const std::uint64_t bytes = static_cast<std::uint64_t>(n) * bs;
          if (auto w = fio_bandwidth(file, true, bs, qd, bytes, direct)) fw.push_back(*w);
          if (auto rd = fio_bandwidth(file, false, bs, qd, bytes, direct)) fr.push_back(*rd);
          fs::remove(file);
        }
        progress.step(format_bytes(bs) + " qd" + std::to_string(qd));
      }
      nlohmann::json row;
      row["block_bytes"] = bs;
      row["queue_depth"] = qd;
      row["blocks"] = n;
      const Summary sw = summarize(kw), sr = summarize(kr);
      row["kvoffload_write"] = to_json(sw, "B/s");
      row["kvoffload_read"] = to_json(sr, "B/s");
      if (!fw.empty() && !fr.empty()) {
        const Summary s_fw = summarize(fw), s_fr = summarize(fr);
        row["fio_write"] = to_json(s_fw, "B/s");
        row["fio_read"] = to_json(s_fr, "B/s");
        row["write_ratio"] = sw.median / s_fw.median;
        row["read_ratio"] = sr.median / s_fr.median;
      }
      rows.push_back(row);
    }
  }
  progress.done();
  return {{"engine", engine},
          {"direct_io", direct},
          {"fio", have_fio},
          {"note",
           "payload bytes per second; the tier also writes a 4 KiB header per slot. fio: "
           "sequential, same block size, queue depth, O_DIRECT setting and file system"},
          {"results", rows}};
}

nlohmann::json latency(const Options& opt, const fs::path& dir) {
  const std::uint64_t page = 256 << 10;
  const fs::path tier_dir = dir / "latency";
  fs::remove_all(tier_dir);
  std::vector<BlockHash> prefix;
  for (std::int64_t i = 0; i < TierRig::kBlocks; ++i)
    prefix.push_back(bench_key(i + 1000, 0x5a).hash);
  const auto make = [&] {  // each a restart: the host cache empty, the tier as it was
    DiskTierConfig dc;
    dc.path = tier_dir.string();
    dc.capacity_bytes = 4 * TierRig::kBlocks * (page + 8192);
    dc.model = "bench-latency";
    TierConfig tc;
    tc.store = dc;
    return std::make_unique<TierRig>(page, tc, prefix);
  };
  nlohmann::json out = hit_latency(opt, "disk", page, make);
  fs::remove_all(tier_dir);
  return out;
}

}  // namespace

nlohmann::json run_disk(const Options& opt, const std::string& directory, const std::string& size) {
  const std::uint64_t total = parse_bytes(size, "--size");
  const fs::path dir =
      fs::absolute(directory) / ("kvoffload-bench-disk-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  nlohmann::json out;
  try {
    out["directory"] = dir.parent_path().string();
    out["bytes_per_measurement"] = total;
    out["throughput"] = throughput(opt, dir, total);
    out["lookup_to_loaded"] = latency(opt, dir);
  } catch (...) {
    fs::remove_all(dir);
    throw;
  }
  fs::remove_all(dir);
  return out;
}

}  // namespace kvbench
