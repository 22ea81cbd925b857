#include "tier_bench_common.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <span>

#include "kvoffload/error.hpp"
#include "kvoffload/tiers/shared_presence.hpp"

namespace kvbench {

using namespace kvoffload;

std::optional<std::string> capture(const std::string& command) {
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return std::nullopt;
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  return ::pclose(p) == 0 ? std::optional(out) : std::nullopt;
}

HostPool::HostPool(std::int64_t blocks, std::uint64_t bytes_per_block)
    : block_bytes(bytes_per_block), bytes(static_cast<std::size_t>(blocks) * bytes_per_block) {
  std::mt19937_64 rng(7);
  for (std::byte& b : bytes) b = static_cast<std::byte>(rng());
}

std::span<std::byte> HostPool::block(HostBlockId id) {
  return {bytes.data() + static_cast<std::size_t>(id) * block_bytes, block_bytes};
}

Key bench_key(std::int64_t i, std::uint64_t salt) {
  std::uint8_t b[16] = {};
  std::memcpy(b, &i, sizeof i);
  std::memcpy(b + 8, &salt, sizeof salt);
  return Key{BlockHash::from_bytes(b), 0};
}

double time_tier_jobs(Tier& tier, JobId id, JobKind kind, std::int64_t n, std::int64_t pool_blocks,
                      const std::function<Key(std::int64_t)>& key_of,
                      const std::function<std::int64_t(std::int64_t)>& slot_of,
                      const std::function<HostBlockId(std::int64_t)>& write_block_of) {
  const bool promote = kind == JobKind::promote;
  if (promote && pool_blocks < 2) {
    throw invalid_argument("tier bench: promotions alternate two halves of a pool of 2 or more");
  }
  const std::int64_t lap = promote ? std::max<std::int64_t>(pool_blocks / 2, 1) : pool_blocks;
  std::vector<TierJob> jobs;
  for (std::int64_t i = 0; i < n; ++i) {
    if (i % lap == 0) {
      TierJob& job = jobs.emplace_back();
      job.id = (id << 20) + static_cast<JobId>(jobs.size());
      job.kind = kind;
    }
    TierJob& job = jobs.back();
    job.keys.push_back(key_of(i));
    // Promotions: job k fills half k % 2 of the pool.
    const std::int64_t half = static_cast<std::int64_t>((jobs.size() - 1) % 2) * lap;
    job.host_block_ids.push_back(promote ? static_cast<HostBlockId>(half + i % lap)
                                         : write_block_of(i));
    job.slots.push_back(slot_of(i));
  }
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t k = 0; k < jobs.size(); ++k) {
    if (promote && k >= 2) tier.wait(std::span(&jobs[k - 2].id, 1));
    tier.submit(jobs[k]);
  }
  std::vector<JobId> ids;
  for (const TierJob& job : jobs) ids.push_back(job.id);
  tier.wait(ids);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const FinishedTierJob& f : tier.get_finished()) {
    if (!f.ok) {
      throw error("tier bench: tier job " + std::to_string(f.job) + " (" +
                  std::string(to_string(kind)) + ") failed: " + std::to_string(f.failed_blocks) +
                  " block(s)");
    }
  }
  return seconds;
}

TierRig::TierRig(std::uint64_t page_bytes, TierConfig tier, std::vector<BlockHash> prefix)
    : gpu(static_cast<std::size_t>(64 * page_bytes)), hashes(std::move(prefix)) {
  if (static_cast<std::int64_t>(hashes.size()) != kBlocks) {
    throw invalid_argument("tier rig: the prefix needs " + std::to_string(kBlocks) + " hashes");
  }
  SchedulerConfig sc;
  sc.groups = {GroupConfig{GroupKind::full_attention, 16, 0}};
  sc.manager.host_blocks = 2 * kBlocks;
  sc.manager.enable_events = false;
  if (tier.medium == Medium::disk) tier.blocks = 1;  // the worker's slots, once it is open
  sc.tiers.push_back(std::move(tier));
  WorkerConfig wc;
  wc.tensors.push_back({reinterpret_cast<std::uintptr_t>(gpu.data()), 64,
                        static_cast<std::int64_t>(page_bytes),
                        static_cast<std::int64_t>(page_bytes)});
  wc.groups = {{{0, static_cast<std::int64_t>(page_bytes)}}};
  wc.threads = 2;
  worker = std::make_unique<Worker>(derive_worker_config(sc, std::move(wc)));
  if (sc.tiers[0].medium == Medium::disk) sc.tiers[0].blocks = worker->tier(0).num_slots();
  scheduler = std::make_unique<Scheduler>(sc, make_scheduler_services(sc));
  if (sc.tiers[0].medium == Medium::disk) {
    (void)scheduler->restore_tier(0, worker->tier(0).scanned());
  }
}

std::size_t TierRig::run(const StepResult& out) {
  std::vector<JobId> ids;
  for (const TransferJob& j : out.load_jobs) {
    worker->submit(j);
    ids.push_back(j.id);
  }
  for (const TransferJob& j : out.store_jobs) {
    worker->submit(j);
    ids.push_back(j.id);
  }
  for (const TierJob& j : out.tier_jobs) {
    worker->submit_tier(j);
    ids.push_back(j.id);
  }
  worker->start_step();
  worker->wait(ids);
  std::vector<JobReport> reports;
  for (const FinishedTransfer& f : worker->get_finished()) reports.push_back({f.job, 1, f.ok});
  (void)scheduler->on_completed(reports);
  return ids.size();
}

std::vector<AllocatedGroup> TierRig::alloc(GpuBlockId first) const {
  std::vector<GpuBlockId> ids;
  for (std::int64_t i = 0; i <= kBlocks; ++i) ids.push_back(first + static_cast<GpuBlockId>(i));
  return {AllocatedGroup{ids, 0}};
}

std::optional<std::int64_t> TierRig::lookup(const std::string& request, int tries) {
  scheduler->update_request(request, kBlocks * 16 + 1, hashes);
  std::optional<std::int64_t> hit;
  for (int i = 0; i < tries && !(hit = scheduler->lookup(request, 0)); ++i) {
    (void)run(scheduler->build_step({}));  // a shared tier's check; a promotion
  }
  return hit;
}

void TierRig::fill() {
  if (lookup("fill", 100000) != 0) {
    throw error("tier bench: the tier did not answer, or already held the prefix");
  }
  scheduler->on_allocated("fill", alloc(1), 0);
  const ScheduledRequest e{"fill", 0, kBlocks * 16 + 1, {alloc(1)[0].block_ids}, false};
  (void)run(scheduler->build_step(std::span(&e, 1)));
  for (int i = 0; i < 10 && scheduler->num_jobs_in_flight() > 0; ++i) {
    (void)run(scheduler->build_step({}));
  }
  if (scheduler->tier_stats(0).blocks_written != static_cast<std::uint64_t>(kBlocks)) {
    throw error("tier bench: the prefix was not written to the tier");
  }
}

std::int64_t TierRig::load(const std::string& request) {
  const std::optional<std::int64_t> hit = lookup(request, 100000);
  if (!hit || *hit == 0) throw error("tier bench: the prefix was not found");
  scheduler->on_allocated(request, alloc(20), *hit);
  (void)run(scheduler->build_step({}));
  return *hit;
}

nlohmann::json hit_latency(const Options& opt, const std::string& what, std::uint64_t page_bytes,
                           const std::function<std::unique_ptr<TierRig>()>& make) {
  const std::size_t runs = opt.runs > 0 ? opt.runs : (opt.quick ? 2 : 9);
  make()->fill();
  std::vector<double> tier, host;
  Progress progress(what + " vs host hit", runs);
  for (std::size_t r = 0; r < runs; ++r) {
    const std::unique_ptr<TierRig> rig = make();  // empty host cache, the tier filled
    auto start = std::chrono::steady_clock::now();
    (void)rig->load(what + "-hit");
    tier.push_back(seconds_since(start));
    start = std::chrono::steady_clock::now();
    (void)rig->load("host-hit");  // now in host memory
    host.push_back(seconds_since(start));
    progress.step();
  }
  progress.done();
  const Summary t = summarize(tier), h = summarize(host);
  return {{"blocks", TierRig::kBlocks},
          {"block_bytes", page_bytes},
          {what + "_hit", to_json(t, "s")},
          {"host_hit", to_json(h, "s")},
          {what + "_over_host", t.median / h.median}};
}

}  // namespace kvbench
