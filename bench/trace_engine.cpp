// TraceEngine (trace_engine.hpp): the scheduler, worker and tiers `kvoffload-bench trace`
// replays against.

#include "trace_engine.hpp"

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>

#include "kvoffload/error.hpp"
#include "kvoffload/tiers/shared_presence.hpp"

namespace kvbench {

using namespace kvoffload;

namespace {

/// A trace's hash id as a block hash: 16 bytes (a shared tier refuses shorter ones), the id
/// and a fixed tag, so every engine of a fleet names a block alike.
BlockHash hash_of(std::uint64_t id) {
  std::uint8_t bytes[16];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<std::uint8_t>(id >> (8 * i));
  for (int i = 8; i < 16; ++i) bytes[i] = static_cast<std::uint8_t>(0xa5 ^ i);
  return BlockHash::from_bytes(bytes);
}

TierConfig disk_tier(const TraceOptions& o, const SchedulerConfig& sc) {
  if (o.disk_dir.empty()) throw invalid_argument("trace: --disk-tokens needs --disk DIR");
  const auto slots =
      static_cast<std::uint64_t>(o.disk_tokens) / static_cast<std::uint64_t>(o.block_tokens);
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
  return t;
}

TierConfig shared_tier(const TraceOptions& o, const SchedulerConfig& sc) {
  if (o.shared_name.empty()) throw invalid_argument("trace: --shared needs --shared-name");
  SharedTierConfig s;
  s.nodes = o.shared_nodes;
  s.name = o.shared_name;
  s.secret_file = o.shared_secret_file;
  TierConfig t;
  t.medium = Medium::shared;
  // What this engine knows the cluster holds (the cluster's own memory bounds what it holds).
  t.blocks = std::max<std::int64_t>(1, static_cast<std::int64_t>(o.shared_tokens) / o.block_tokens);
  t.policy = sc.manager.policy;
  t.store_threshold = o.store_threshold;
  t.store = s;
  return t;
}

}  // namespace

TraceEngine::TraceEngine(const TraceOptions& o, std::size_t max_blocks)
    : block_tokens_(o.block_tokens),
      gpu_((max_blocks + 2) * static_cast<std::size_t>(o.block_bytes)) {
  const auto bt = o.block_tokens;
  SchedulerConfig sc;
  sc.groups = {GroupConfig{GroupKind::full_attention, bt, 0}};
  sc.hash_block_size = bt;
  sc.manager.host_blocks = std::max<std::int64_t>(1, static_cast<std::int64_t>(o.host_tokens) / bt);
  sc.manager.policy = parse_eviction_policy(o.policy, "--policy");
  sc.manager.store_threshold = o.store_threshold;
  sc.manager.enable_events = false;
  // Every shared run has one weights identity (the shared keys' epoch): fleets are kept apart
  // by their name (the keys' namespace) alone, which bench_trace_shared checks. Without a
  // shared tier, an identity of its own: slots a previous run left in the disk directory are
  // never found. (The bench restores no disk index, so with a shared tier an old directory's
  // slots are overwritten, never read.)
  sc.weights =
      !o.shared_nodes.empty()
          ? std::string("trace-bench-shared")
          : "trace-bench-" +
                std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  if (o.disk_tokens > 0) {
    sc.tiers.push_back(disk_tier(o, sc));
    tier_names_.emplace_back("disk");
  }
  if (!o.shared_nodes.empty()) {
    sc.tiers.push_back(shared_tier(o, sc));
    tier_names_.emplace_back("shared");
  }
  WorkerConfig wc;
  wc.tensors.push_back({reinterpret_cast<std::uintptr_t>(gpu_.data()),
                        static_cast<std::int64_t>(max_blocks + 2), o.block_bytes, o.block_bytes});
  wc.groups = {{{0, o.block_bytes}}};
  wc.threads = 2;
  worker_ = std::make_unique<Worker>(derive_worker_config(sc, std::move(wc)));
  if (o.disk_tokens > 0) sc.tiers[0].blocks = worker_->tier(0).num_slots();
  scheduler_ = std::make_unique<Scheduler>(sc, make_scheduler_services(sc));
  ids_.reserve(max_blocks + 1);
  for (std::size_t i = 0; i <= max_blocks; ++i) ids_.push_back(static_cast<GpuBlockId>(i + 1));
}

TraceEngine::~TraceEngine() = default;

template <class F>
void TraceEngine::timed(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  scheduler_seconds_ += seconds_since(start);
}

std::size_t TraceEngine::step(std::span<const ScheduledRequest> scheduled) {
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
  return ids.size();
}

Replayed TraceEngine::replay(const std::string& id, const TraceRequest& r, std::int8_t continues) {
  const auto start = std::chrono::steady_clock::now();
  // Its full blocks only: an engine hashes no partial block, so it is never stored or hit.
  const std::size_t n = full_blocks(r, block_tokens_);
  Replayed out;
  hashes_.clear();
  for (std::size_t i = 0; i < n; ++i) hashes_.push_back(hash_of(r.hash_ids[i]));
  out.host.assign(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    out.host[i] = scheduler_->manager().peek(Key{hashes_[i], 0}) != LookupResult::miss ? 1 : 0;
  }
  std::vector<std::uint64_t> promoted_before;
  for (std::size_t t = 0; t < tier_names_.size(); ++t) {
    promoted_before.push_back(scheduler_->tier_stats(t).promotions);
  }
  const std::int64_t tokens = static_cast<std::int64_t>(n) * block_tokens_ + 1;  // +1: computed
  std::optional<std::int64_t> hit;
  timed([&] {
    scheduler_->update_request(id, tokens, hashes_);
    if (continues >= 0) scheduler_->hint_continues(id, continues == 1);
  });
  // "Retry later" while a tier answers: a shared tier's existence check runs on a thread of
  // its own, a promotion on the worker. At most kLookupSeconds, checked between steps; a step
  // waits for its jobs as long as the tiers' own deadlines let it (the shared tier's reply
  // deadlines; a disk tier's I/O has none).
  const auto deadline = start + std::chrono::duration<double>(kLookupSeconds);
  int idle = 20;
  while (true) {
    timed([&] { hit = scheduler_->lookup(id, 0); });
    if (hit) break;
    if (std::chrono::steady_clock::now() > deadline) {
      throw error("trace: request " + id + ": no lookup answered in " +
                  std::to_string(kLookupSeconds) + " s");
    }
    if (step({}) == 0) {  // nothing to run yet: back off, 20 us doubling to 200 us
      std::this_thread::sleep_for(std::chrono::microseconds(idle));
      idle = std::min(idle * 2, 200);
    } else {
      idle = 20;
    }
  }
  const std::vector<GpuBlockId> blocks(ids_.begin(), ids_.begin() + static_cast<long>(n + 1));
  timed([&] {
    scheduler_->on_allocated(id, std::vector<AllocatedGroup>{AllocatedGroup{blocks, 0}}, *hit);
  });
  const ScheduledRequest e{id, *hit, tokens - *hit, {blocks}, false};
  (void)step(std::span(&e, 1));  // its load and its store
  out.seconds_to_loaded = seconds_since(start);
  timed([&] { scheduler_->on_finished(id); });
  for (int i = 0; i < 16 && scheduler_->num_jobs_in_flight() > 0; ++i) (void)step({});
  (void)step({});  // the write-through of what it stored
  out.hit_blocks = static_cast<std::size_t>(*hit / block_tokens_);
  for (std::size_t t = 0; t < tier_names_.size(); ++t) {
    out.promoted.push_back(scheduler_->tier_stats(t).promotions - promoted_before[t]);
  }
  return out;
}

}  // namespace kvbench
