// kvoffload-bench loads: how long a load waits when a flood of stores saturates the backend
// (issue 30: a load gates a request's first token, a store only keeps a copy). The latency of
// a load (submit to reported done) on an idle worker against the same load submitted right
// after a flood of stores, alternating in one run, on the host backend, on the CUDA backend
// over the simulated device (its timing model: one copy engine serving the highest stream
// priority first) and, for the disk tier, a promotion behind a flood of writes. The host
// backend and the simulated device are measured with priorities off too: what it was before.

#include <chrono>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.hpp"
#include "kvoffload/error.hpp"
#include "kvoffload/host_backend.hpp"
#include "kvoffload/testing/sim_device.hpp"
#include "kvoffload/tiers/disk_tier.hpp"
#include "kvoffload/worker.hpp"
#include "scenarios.hpp"
#include "tier_bench_common.hpp"

namespace kvbench {
namespace {

namespace fs = std::filesystem;
using namespace kvoffload;
using Clock = std::chrono::steady_clock;

struct Shape {
  std::int64_t page;         // bytes per block
  std::int64_t load_blocks;  // the measured load
  std::int64_t flood_jobs;   // stores submitted before it
  std::int64_t flood_blocks;
  int copy_threads = 0;  // the host backend's (0: all cores)
  [[nodiscard]] std::int64_t blocks() const { return load_blocks + flood_jobs * flood_blocks; }
};

TransferJob job_of(JobId id, JobKind kind, std::int64_t first, std::int64_t n) {
  TransferJob j;
  j.id = id;
  j.kind = kind;
  j.gpu.group_sizes = {n};
  j.gpu.block_indices = {0};
  for (std::int64_t i = 0; i < n; ++i) {
    j.gpu.block_ids.push_back(static_cast<GpuBlockId>(first + i + 1));  // 0 is the null block
    j.keys.push_back(bench_key(first + i, 0x10ad));
    j.host_block_ids.push_back(static_cast<HostBlockId>(first + i));
  }
  return j;
}

struct Latency {
  double reported;  // submit to get_finished reporting it (what the engine sees)
  double backend;   // submit to done inside the backend (FinishedTransfer::seconds)
};

/// A load's latencies; the other finished jobs go to `others` (they must all be ok). The
/// engine thread blocks in wait() as an engine waiting for a load does (spinning on
/// get_finished would take a core from the copy threads on a small machine).
Latency time_load(Worker& w, const TransferJob& load, std::size_t& others) {
  const auto start = Clock::now();
  w.submit(load);
  const std::vector<JobId> ids{load.id};
  w.wait(ids);
  for (Latency done{-1, -1};;) {
    for (const FinishedTransfer& f : w.get_finished()) {
      if (!f.ok) throw error("loads bench: job " + std::to_string(f.job) + " failed: " + f.error);
      if (f.job == load.id) {
        done = {seconds_since(start), f.seconds};
      } else {
        ++others;
      }
    }
    if (done.reported >= 0) return done;
    std::this_thread::yield();
  }
}

/// Idle and flooded load latencies, alternating, `runs` each.
nlohmann::json measure(Worker& w, const Shape& s, std::size_t runs, const std::string& what) {
  std::vector<double> idle, flooded, idle_backend, flooded_backend;
  JobId next = 1;
  Progress progress(what, runs);
  const auto submit_flood = [&] {
    std::vector<JobId> flood;
    for (std::int64_t k = 0; k < s.flood_jobs; ++k) {
      w.submit(job_of(next, JobKind::store, s.load_blocks + k * s.flood_blocks, s.flood_blocks));
      flood.push_back(next++);
    }
    return flood;
  };
  const auto drain = [&](const std::vector<JobId>& flood, std::size_t seen) {
    w.wait(flood);
    for (const FinishedTransfer& f : w.get_finished()) {
      if (!f.ok) throw error("loads bench: a store failed: " + f.error);
      ++seen;
    }
    if (seen != flood.size()) throw error("loads bench: stores went missing");
  };
  for (std::size_t r = 0; r < runs; ++r) {
    // The idle load comes right after a flood has finished, so both loads find the caches as
    // a flood leaves them (an idle load of bytes still cached would flatter the baseline).
    drain(submit_flood(), 0);
    std::size_t others = 0;
    const Latency a = time_load(w, job_of(next++, JobKind::load, 0, s.load_blocks), others);
    const std::vector<JobId> flood = submit_flood();
    const Latency b = time_load(w, job_of(next++, JobKind::load, 0, s.load_blocks), others);
    idle.push_back(a.reported);
    flooded.push_back(b.reported);
    idle_backend.push_back(a.backend);
    flooded_backend.push_back(b.backend);
    drain(flood, others);
    progress.step();
  }
  progress.done();
  const Summary i = summarize(idle), f = summarize(flooded);
  const Summary ib = summarize(idle_backend), fb = summarize(flooded_backend);
  return {{"idle_load", to_json(i, "s")},
          {"flooded_load", to_json(f, "s")},
          {"ratio_median", f.median / i.median},
          {"in_backend",
           {{"idle_load", to_json(ib, "s")},
            {"flooded_load", to_json(fb, "s")},
            {"ratio_median", fb.median / ib.median}}}};
}

/// A worker over one tensor of `s.blocks()` pages: ordinary memory for the host backend, the
/// simulated device's for the CUDA backend on it.
struct Rig {
  Rig(const Shape& s, std::shared_ptr<SimDevice> sim, bool loads_first) : sim_(std::move(sim)) {
    const std::int64_t gpu_blocks = s.blocks() + 1;  // block 0, the null block, unused
    const auto bytes = static_cast<std::size_t>(gpu_blocks * s.page);
    void* base = nullptr;
    if (sim_) {
      if (sim_->malloc_device(&base, bytes) != dev::ok) throw error("loads bench: sim malloc");
      sim_base_ = base;
    } else {
      memory_.assign(bytes, std::byte{1});
      base = memory_.data();
    }
    WorkerConfig c;
    c.tensors.push_back({reinterpret_cast<std::uintptr_t>(base), gpu_blocks, s.page, s.page});
    c.groups = {{{0, s.page}}};
    c.host_blocks = s.blocks();
    if (sim_) {
      c.backend = BackendKind::cuda;
      c.runtime = sim_;
      worker = std::make_unique<Worker>(c);
    } else {
      HostBackendConfig hc;
      hc.loads_first = loads_first;
      hc.threads = s.copy_threads;
      worker = std::make_unique<Worker>(c, std::make_unique<HostBackend>(hc));
    }
  }
  ~Rig() {
    worker.reset();
    if (sim_base_ != nullptr) (void)sim_->free_device(sim_base_);
  }
  Rig(const Rig&) = delete;
  Rig& operator=(const Rig&) = delete;
  std::unique_ptr<Worker> worker;

 private:
  std::shared_ptr<SimDevice> sim_;
  void* sim_base_ = nullptr;
  std::vector<std::byte> memory_;
};

nlohmann::json host_backend(const Options& opt) {
  const std::size_t runs = opt.runs > 0 ? opt.runs : (opt.quick ? 3 : 15);
  // A prefix load of 64 blocks behind 128 stores of 4 blocks (a step's store for one request),
  // 8 times the load's bytes.
  const Shape s = opt.quick ? Shape{64 << 10, 64, 128, 4} : Shape{256 << 10, 64, 128, 4};
  nlohmann::json out = {{"page_bytes", s.page},
                        {"load_bytes", s.page * s.load_blocks},
                        {"flood_bytes", s.page * s.flood_blocks * s.flood_jobs}};
  Rig first(s, nullptr, true);
  out["loads_first"] = measure(*first.worker, s, runs, "loads host");
  // With every core copying stores, the engine thread waits for a core when its load is done
  // (the OS's wake-up, not the queue: see in_backend); with one core left to it, it does not.
  Shape spare = s;
  spare.copy_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1);
  out["spare_core_copy_threads"] = spare.copy_threads;
  Rig first_spare(spare, nullptr, true);
  out["loads_first_spare_core"] =
      measure(*first_spare.worker, spare, runs, "loads host, a core spare");
  Rig fifo(s, nullptr, false);
  out["submission_order"] = measure(*fifo.worker, s, runs, "loads host, one queue");
  return out;
}

nlohmann::json sim_device(const Options& opt) {
  const std::size_t runs = opt.runs > 0 ? opt.runs : (opt.quick ? 3 : 15);
  const Shape s = opt.quick ? Shape{16 << 10, 32, 64, 4} : Shape{64 << 10, 32, 64, 4};
  nlohmann::json out = {{"page_bytes", s.page},
                        {"load_bytes", s.page * s.load_blocks},
                        {"flood_bytes", s.page * s.flood_blocks * s.flood_jobs},
                        {"timing_model",
                         "one copy engine of 4 GB/s, serving the highest stream priority first; "
                         "no random delay"}};
  for (const bool priority : {true, false}) {
    SimConfig sc;
    sc.max_delay_us = 0;
    sc.copy_gbps = 4;
    sc.honor_priority = priority;
    Rig rig(s, std::make_shared<SimDevice>(sc), true);
    nlohmann::json m =
        measure(*rig.worker, s, runs, priority ? "loads sim" : "loads sim, no priorities");
    if (const auto cs = rig.worker->cuda_stats()) {  // the copy modes the backend chose
      m["jobs_by_mode"] = {{"batch", cs->jobs_batch},
                           {"memcpy", cs->jobs_memcpy},
                           {"kernel", cs->jobs_kernel},
                           {"staged", cs->jobs_staged},
                           {"device_table", cs->jobs_device_table}};
    }
    out[priority ? "priorities" : "no_priorities"] = m;
  }
  return out;
}

/// A promotion of `n` blocks on the disk tier, idle and behind a write flood.
nlohmann::json disk_tier(const Options& opt, const std::string& directory) {
  const std::size_t runs = opt.runs > 0 ? opt.runs : (opt.quick ? 3 : 15);
  const std::uint64_t bs = opt.quick ? (64 << 10) : (256 << 10);
  const std::int64_t n = 16, flood = opt.quick ? 64 : 256;
  const fs::path dir = fs::path(directory) / "kvoffload-loads-bench";
  fs::remove_all(dir);
  HostPool pool(n + flood, bs);
  DiskTierConfig c;
  c.path = dir.string();
  c.capacity_bytes = static_cast<std::uint64_t>(n + flood) * (bs + 4096);
  c.model = "bench";
  std::vector<double> idle, flooded;
  {
    DiskTier tier(c, "bench", bs, [&](HostBlockId id) { return pool.block(id); });
    JobId next = 1;
    const auto job = [&](JobKind kind, std::int64_t first, std::int64_t count) {
      TierJob j;
      j.id = next++;
      j.kind = kind;
      for (std::int64_t i = first; i < first + count; ++i) {
        j.keys.push_back(bench_key(i, 0xd15c));
        j.host_block_ids.push_back(static_cast<HostBlockId>(i));
        j.slots.push_back(i);
      }
      return j;
    };
    const auto run_until = [&](const TierJob& j) {
      const auto start = Clock::now();
      tier.submit(j);
      const std::vector<JobId> ids{j.id};
      tier.wait(ids);
      return seconds_since(start);
    };
    (void)run_until(job(JobKind::write, 0, n));  // what the promotions read
    Progress progress("loads disk", runs);
    for (std::size_t r = 0; r < runs; ++r) {
      idle.push_back(run_until(job(JobKind::promote, 0, n)));
      const TierJob writes = job(JobKind::write, n, flood);
      tier.submit(writes);
      flooded.push_back(run_until(job(JobKind::promote, 0, n)));
      const std::vector<JobId> ids{writes.id};
      tier.wait(ids);
      for (const FinishedTierJob& f : tier.get_finished()) {
        if (!f.ok) throw error("loads bench: a disk tier job failed (see the log)");
      }
      progress.step();
    }
    progress.done();
  }
  fs::remove_all(dir);
  const Summary i = summarize(idle), f = summarize(flooded);
  return {{"block_bytes", bs},
          {"promote_blocks", n},
          {"flood_write_blocks", flood},
          {"idle_promotion", to_json(i, "s")},
          {"flooded_promotion", to_json(f, "s")},
          {"ratio_median", f.median / i.median}};
}

}  // namespace

nlohmann::json run_loads(const Options& opt, const std::string& disk_dir) {
  return {{"what",
           "load latency, submit to reported done, behind a flood of stores against "
           "idle (ratio: flooded / idle, target <= 1.25)"},
          {"host", host_backend(opt)},
          {"sim", sim_device(opt)},
          {"disk", disk_tier(opt, disk_dir)}};
}

}  // namespace kvbench
