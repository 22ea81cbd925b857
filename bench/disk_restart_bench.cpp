// kvoffload-bench disk-restart: how long the disk tier takes to come back after a restart
// (issue 51 item 3): DiskSlots' scan of every slot header, then the tier index rebuilt from
// what it found (HostBlockManager::restore, what Scheduler::restore_tier runs), at each slot
// count. Every slot holds a valid header; payloads are left as holes (the scan reads headers
// only unless verify_payloads_on_scan), so 10M slots take 40 GiB of disk, not 80. Each count
// is measured warm (headers in the page cache) and cold (the slab files dropped from it with
// posix_fadvise after fsync). The baseline in the same run: the same 4 KiB preads of the same
// headers one at a time, nothing parsed (what the scan did before it read 16 ranges at once).

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "bench_common.hpp"
#include "kvoffload/host_block_manager.hpp"
#include "kvoffload/tiers/disk_slots.hpp"
#include "scenarios.hpp"

namespace kvbench {
namespace {

namespace fs = std::filesystem;
using namespace kvoffload;

constexpr std::uint64_t kPayload = 4096;
constexpr std::uint64_t kHeader = 4096;
constexpr std::uint64_t kSlotsPerFile = 1 << 20;

Key slot_key(std::uint64_t i) {
  std::uint8_t b[32];
  for (int w = 0; w < 4; ++w) {
    std::uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(w);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ULL;
    std::memcpy(b + 8 * w, &x, 8);
  }
  return Key{BlockHash::from_bytes(b), static_cast<std::uint32_t>(i % 3)};
}

DiskSlotsConfig slots_config(const fs::path& dir, std::uint64_t slots) {
  DiskSlotsConfig c;
  c.directory = dir.string();
  c.layout_digest = 0x51;
  c.epoch = 7;
  c.payload_bytes = kPayload;
  c.capacity_bytes = slots * (kHeader + kPayload);
  c.slots_per_file = kSlotsPerFile;
  return c;
}

// The slab files in slot order: slab-0.kvo, slab-1.kvo, ... (by number: "slab-10" sorts
// before "slab-2" as text).
std::vector<fs::path> slab_files(const std::string& layout_dir, std::uint64_t slots) {
  std::vector<fs::path> out;
  for (std::uint64_t f = 0; f * kSlotsPerFile < slots; ++f) {
    out.push_back(fs::path(layout_dir) / ("slab-" + std::to_string(f) + ".kvo"));
  }
  return out;
}

// Flushes the slab files and drops them from the page cache. False if the kernel refused.
bool drop_from_cache(const std::vector<fs::path>& files) {
  bool ok = true;
  for (const fs::path& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ok = ::fsync(fd) == 0 && ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0 && ok;
    ::close(fd);
  }
  return ok;
}

// The baseline: one 4 KiB pread per slot header, one at a time, nothing parsed.
double read_headers(const std::vector<fs::path>& files, std::uint64_t slots) {
  alignas(4096) static std::uint8_t buffer[kHeader];
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t done = 0, sum = 0;
  for (const fs::path& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error("disk-restart bench: cannot open " + f.string());
    for (std::uint64_t s = 0; s < kSlotsPerFile && done < slots; ++s, ++done) {
      const auto at = static_cast<off_t>(s * (kHeader + kPayload));
      if (::pread(fd, buffer, kHeader, at) != static_cast<ssize_t>(kHeader)) {
        ::close(fd);
        throw std::runtime_error("disk-restart bench: short header read in " + f.string());
      }
      sum += buffer[0];
    }
    ::close(fd);
  }
  if (sum == 0) throw std::runtime_error("disk-restart bench: headers read back empty");
  return seconds_since(start);
}

struct Restart {
  double scan_s = 0, restore_s = 0;
  std::int64_t valid = 0, restored = 0;
};

Restart restart(const fs::path& dir, std::uint64_t slots) {
  Restart r;
  DiskSlots reopened(slots_config(dir, slots));
  r.scan_s = reopened.scan_report().seconds;
  r.valid = reopened.scan_report().valid;
  ManagerConfig mc;
  mc.host_blocks = static_cast<std::int64_t>(slots);
  mc.medium = Medium::disk;
  mc.enable_events = false;
  HostBlockManager index(mc);
  const auto start = std::chrono::steady_clock::now();
  r.restored = index.restore(reopened.scanned());
  r.restore_s = seconds_since(start);
  return r;
}

nlohmann::json measure(const Options& opt, const fs::path& dir, std::uint64_t slots,
                       Progress& progress) {
  fs::remove_all(dir);
  std::string layout_dir;
  {  // Fill: a valid header in every slot, payloads left as holes.
    DiskSlots fresh(slots_config(dir, slots));
    layout_dir = fresh.layout_directory();
    alignas(4096) static std::uint8_t buffer[kHeader + kPayload];
    static const std::uint8_t payload[kPayload] = {1};
    for (std::uint64_t s = 0; s < slots; ++s) {
      const SlotIo io =
          fresh.prepare_write(static_cast<std::int64_t>(s), slot_key(s), 7, payload, buffer);
      if (::pwrite(io.fd, buffer, kHeader, static_cast<off_t>(io.offset)) !=
          static_cast<ssize_t>(kHeader)) {
        throw std::runtime_error("disk-restart bench: a header write failed (disk full?)");
      }
    }
  }
  progress.step(std::to_string(slots) + " written");
  const auto files = slab_files(layout_dir, slots);
  const std::size_t runs = opt.runs > 0 ? opt.runs : (opt.quick ? 1 : 3);
  std::vector<double> warm_scan, warm_restore, warm_base, cold_scan, cold_base;
  bool cold_ok = true;
  for (std::size_t r = 0; r < runs; ++r) {
    cold_ok = drop_from_cache(files) && cold_ok;
    Restart c = restart(dir, slots);
    if (c.valid != static_cast<std::int64_t>(slots) || c.restored != c.valid) {
      throw std::runtime_error("disk-restart bench: the scan found " + std::to_string(c.valid) +
                               " of " + std::to_string(slots) + " slots, restored " +
                               std::to_string(c.restored));
    }
    cold_scan.push_back(c.scan_s);
    cold_ok = drop_from_cache(files) && cold_ok;
    cold_base.push_back(read_headers(files, slots));
    const Restart w = restart(dir, slots);
    warm_scan.push_back(w.scan_s);
    warm_restore.push_back(w.restore_s);
    warm_base.push_back(read_headers(files, slots));
    progress.step(std::to_string(slots) + " restarts");
  }
  fs::remove_all(dir);
  const double n = static_cast<double>(slots);
  const Summary ws = summarize(warm_scan), cs = summarize(cold_scan);
  const Summary wb = summarize(warm_base), cb = summarize(cold_base);
  const Summary wr = summarize(warm_restore);
  return {{"slots", slots},
          {"header_bytes_read", slots * kHeader},
          {"cold_dropped_from_page_cache", cold_ok},
          {"cold_scan", to_json(cs, "s")},
          {"cold_serial_reads", to_json(cb, "s")},
          {"cold_scan_us_per_slot", cs.median / n * 1e6},
          {"cold_scan_vs_serial_reads", cs.median / cb.median},
          {"warm_scan", to_json(ws, "s")},
          {"warm_serial_reads", to_json(wb, "s")},
          {"warm_scan_us_per_slot", ws.median / n * 1e6},
          {"warm_scan_vs_serial_reads", ws.median / wb.median},
          {"index_restore", to_json(wr, "s")},
          {"index_restore_ns_per_slot", wr.median / n * 1e9}};
}

}  // namespace

nlohmann::json run_disk_restart(const Options& opt, const std::string& directory,
                                const std::string& slots_list) {
  const std::vector<std::uint64_t> counts = parse_counts(slots_list, "--slots", 1, 1e9);
  const fs::path dir = fs::absolute(directory).lexically_normal() /
                       ("kvoffload-bench-restart-" + std::to_string(::getpid()));
  const std::size_t runs = opt.runs > 0 ? opt.runs : (opt.quick ? 1 : 3);
  Progress progress("disk-restart", counts.size() * (runs + 1));
  nlohmann::json results = nlohmann::json::array();
  try {
    for (const std::uint64_t n : counts) results.push_back(measure(opt, dir, n, progress));
  } catch (...) {
    fs::remove_all(dir);
    throw;
  }
  progress.done();
  return {{"directory", dir.parent_path().string()},
          {"slot_bytes", kHeader + kPayload},
          {"counts",
           "scan: DiskSlots' open-time scan (one 4 KiB header pread per slot, parsed and checked); "
           "index_restore: HostBlockManager::restore of what it found (the tier index); "
           "serial_reads (the baseline): the same preads one at a time, nothing parsed (the scan "
           "before it read 16 ranges at once); cold: slab files fsynced and dropped from "
           "the page cache (posix_fadvise) before the run"},
          {"results", results}};
}

}  // namespace kvbench
