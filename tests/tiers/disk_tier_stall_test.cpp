// Issue 48, item 5: a stalled disk (DiskTier::stall_io_for_test: the I/O threads take blocks
// and start no I/O) never stalls a step. A scheduler and a real disk tier on files: a promotion
// stuck on the disk makes lookups wait only until promote_timeout_ms; a reset_cache meanwhile
// flushes nothing of it and clear() does not wait; the late read, once the disk wakes, lands in
// the host blocks the scheduler held for it, never in a block it handed out again.

#include <algorithm>
#include <chrono>
#include <thread>
#include <unordered_map>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include "kvoffload/tiers/disk_tier.hpp"
#include "support/temp_dir.hpp"
#include "support/tier_pool.hpp"
#include "support/tiered_fixture.hpp"

using namespace kvoffload;
using kvtest::TempDir;

namespace {

constexpr std::uint64_t kBlockBytes = 8192;

/// The scheduler of Tiered, a disk tier on its host pool, and the bytes each key should have.
struct Rig {
  explicit Rig(DiskIo io)
      : t([] {
          SchedulerConfig c = kvtest::tiered({kvtest::full()}, 4, 16);
          c.tiers[0].promote_timeout_ms = 100;
          return c;
        }()),
        pool(4, kBlockBytes),
        disk(config(dir, io), "stall", kBlockBytes,
             [this](HostBlockId id) { return pool.block(id); }) {}

  static DiskTierConfig config(const TempDir& dir, DiskIo io) {
    DiskTierConfig c;
    c.io = io;
    c.path = dir.path.string();
    c.capacity_bytes = 16 * (4096 + kBlockBytes);
    c.model = "stall-model";
    c.dtype = "bfloat16";
    return c;
  }
  std::uint64_t seed(const Key& k) { return seeds.emplace(k, 1000 + seeds.size()).first->second; }
  /// Stores request `req` (its blocks' bytes written as the GPU copy would) and returns the
  /// step's store job, completed.
  TransferJob store(const std::string& req, const std::vector<BlockHash>& hashes) {
    const TransferJob job = t.store(req, hashes);
    for (std::size_t i = 0; i < job.keys.size(); ++i) {
      pool.fill(job.host_block_ids[i], seed(job.keys[i]));
    }
    return job;
  }
  /// Submits the step's tier jobs to the disk.
  std::vector<TierJob> submit(const StepResult& st) {
    for (const TierJob& j : st.tier_jobs) disk.submit(j);
    return st.tier_jobs;
  }
  /// Waits for `jobs` on the disk and reports them to the scheduler.
  void finish(const std::vector<TierJob>& jobs) {
    std::vector<JobId> ids;
    for (const TierJob& j : jobs) ids.push_back(j.id);
    disk.wait(ids);
    std::vector<JobReport> reports;
    for (const FinishedTierJob& f : disk.get_finished()) reports.push_back({f.job, 1, f.ok});
    REQUIRE(reports.size() == jobs.size());
    (void)t.h.s.on_completed(reports);
  }
  bool holds(HostBlockId id, const Key& k) { return pool.holds(id, seed(k)); }

  TempDir dir;
  kvtest::Tiered t;
  kvtest::TierPool pool;
  DiskTier disk;
  std::unordered_map<Key, std::uint64_t, KeyHash> seeds;
};

}  // namespace

TEST_CASE("A stalled disk holds no step, and its late read lands only in held blocks",
          "[disk][tier]") {
  const DiskIo io = GENERATE(DiskIo::threads, DiskIo::automatic);
  Rig r(io);
  const auto a = kvtest::chain_hashes("a", 2);
  const auto b = kvtest::chain_hashes("b", 4);
  r.store("a", a);
  r.finish(r.submit(r.t.h.s.build_step({})));  // a written to the disk
  r.store("b", b);                             // evicts a from the host cache
  r.finish(r.submit(r.t.h.s.build_step({})));

  r.disk.stall_io_for_test(true);
  const auto start = std::chrono::steady_clock::now();
  REQUIRE_FALSE(r.t.h.lookup("c", a, 33, 0).has_value());
  const std::vector<TierJob> promotion = r.submit(r.t.h.s.build_step({}));
  REQUIRE(promotion.size() == 1);
  const TierJob& p = promotion[0];
  REQUIRE(p.kind == JobKind::promote);
  // The request waits a bounded time (steps go on meanwhile), then computes a's tokens.
  std::optional<std::int64_t> answer;
  for (int i = 0; i < 200 && !answer; ++i) {
    CHECK(r.t.h.s.build_step({}).flush.empty());
    answer = r.t.h.s.lookup("c", 0);
    if (!answer) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  REQUIRE(answer == 0);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  CHECK(r.t.h.s.tier_stats(0).promotions_overdue == 2);

  // New weights while the read is stuck: nothing flushed, the promotion's host blocks held.
  r.t.h.s.reset_cache("w2");
  CHECK(r.t.h.s.build_step({}).flush.empty());
  CHECK(r.t.h.s.manager().num_held() == 2);
  const auto d = kvtest::chain_hashes("d", 2);
  const TransferJob sd = r.store("d", d);
  for (const HostBlockId id : sd.host_block_ids) {
    CHECK(std::find(p.host_block_ids.begin(), p.host_block_ids.end(), id) ==
          p.host_block_ids.end());
  }
  const std::vector<TierJob> d_write = r.submit(r.t.h.s.build_step({}));
  REQUIRE(d_write.size() == 1);

  // The disk wakes. The late read did land (the control: a's bytes in the held blocks), and
  // d's blocks still hold d's bytes.
  r.disk.stall_io_for_test(false);
  r.finish({p, d_write[0]});
  for (std::size_t i = 0; i < p.keys.size(); ++i) CHECK(r.holds(p.host_block_ids[i], p.keys[i]));
  for (std::size_t i = 0; i < sd.keys.size(); ++i) CHECK(r.holds(sd.host_block_ids[i], sd.keys[i]));
  CHECK(r.t.h.s.manager().num_held() == 0);
  CHECK(r.t.h.s.tier_index(0).num_held() == 0);
  // a is under the old weights: a miss now, never the late read's bytes.
  CHECK(r.t.h.lookup("e", a, 33, 0) == 0);
}

TEST_CASE("clear() does not wait for a stalled write, and the write never outlives it",
          "[disk][tier]") {
  const DiskIo io = GENERATE(DiskIo::threads, DiskIo::automatic);
  TempDir dir;
  kvtest::TierPool pool(2, kBlockBytes);
  pool.fill(0, 7);
  pool.fill(1, 8);
  {
    DiskTier disk(Rig::config(dir, io), "stall", kBlockBytes,
                  [&](HostBlockId id) { return pool.block(id); });
    disk.stall_io_for_test(true);
    disk.submit(kvtest::job_of(1, JobKind::write, 0, 2, 0, 0));
    // Let the I/O threads take the blocks and pass their check against a clear, so the write
    // lands after the clear below (if they have not, it is skipped: it must not survive
    // either way).
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    disk.clear();  // returns at once, the write stalled
    disk.wait_cleared();
    disk.stall_io_for_test(false);
    const std::vector<JobId> ids{1};
    disk.wait(ids);
    const auto finished = disk.get_finished();
    REQUIRE(finished.size() == 1);
    CHECK_FALSE(finished[0].ok);
  }
  // A restart finds nothing: the write that landed after the clear was erased.
  DiskTier again(Rig::config(dir, io), "stall", kBlockBytes,
                 [&](HostBlockId id) { return pool.block(id); });
  for (const auto& k : again.scanned()) CHECK_FALSE(k.has_value());
}
