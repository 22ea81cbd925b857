// The disk tier when things go wrong (issue 28): a second tier on one directory is refused; a
// promotion whose read fails, or that finds another key, keeps the slot (only a corrupt one is
// erased: disk_tier_test.cpp); io_uring submissions the kernel refuses fail their blocks
// instead of hanging the I/O thread; and promotions are taken before queued writes.

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kvoffload/error.hpp"
#include "kvoffload/tiers/disk_tier.hpp"
#include "support/temp_dir.hpp"
#include "support/tier_pool.hpp"

using namespace kvoffload;
using Catch::Matchers::ContainsSubstring;
using kvtest::TempDir;

namespace {

constexpr std::uint64_t kBlockBytes = 8192;

/// The tests' host pool: blocks of kBlockBytes.
struct Pool : kvtest::TierPool {
  explicit Pool(std::int64_t blocks) : TierPool(blocks, kBlockBytes) {}
};

Key key_of(int i) {
  return kvtest::tier_key(i);
}

DiskTierConfig config_in(const TempDir& dir, std::uint64_t slots, DiskIo io, int threads = 2) {
  DiskTierConfig c;
  c.io = io;
  c.path = dir.path.string();
  c.capacity_bytes = slots * (4096 + kBlockBytes);
  c.model = "fault-model";
  c.dtype = "bfloat16";
  c.io_threads = threads;
  return c;
}

using kvtest::job_of;

FinishedTierJob run(Tier& tier, const TierJob& job) {
  tier.submit(job);
  const JobId ids[] = {job.id};
  tier.wait(ids);
  const std::vector<FinishedTierJob> done = tier.get_finished();
  REQUIRE(done.size() == 1);
  return done[0];
}

}  // namespace

TEST_CASE("A second disk tier on one path and rank is refused; another rank's is kept",
          "[disk][tier]") {
  TempDir dir;
  Pool pool(4);
  const auto block = [&](HostBlockId id) { return pool.block(id); };
  DiskTierConfig rank0 = config_in(dir, 4, DiskIo::threads);
  rank0.tp_size = 2;
  DiskTierConfig rank1 = rank0;
  rank1.tp_rank = 1;
  std::string dir0;
  {
    const DiskTier first(rank0, "l", kBlockBytes, block);
    dir0 = first.slots().layout_directory();
    CHECK_THROWS_AS(DiskTier(rank0, "l", kBlockBytes, block), io_error);
    CHECK_THROWS_WITH(DiskTier(rank0, "l", kBlockBytes, block),
                      ContainsSubstring(dir0) && ContainsSubstring("tp_rank"));
  }
  // Rank 1 of the same engine opens beside it, and rank 0's directory (not in use now) is not
  // stale to it.
  const DiskTier second(rank1, "l", kBlockBytes, block);
  CHECK(second.slots().layout_directory() != dir0);
  CHECK(std::filesystem::exists(dir0));
}

TEST_CASE("A promotion whose read fails, or that finds another key, keeps the slot",
          "[disk][tier]") {
  // Both engines: io_uring where this kernel allows it (auto), and the thread pool.
  const DiskIo io = GENERATE(DiskIo::automatic, DiskIo::threads);
  TempDir dir;
  Pool pool(8);
  for (int i = 0; i < 2; ++i) pool.fill(i, 500 + static_cast<std::uint64_t>(i));
  const auto block = [&](HostBlockId id) { return pool.block(id); };
  {
    DiskTier tier(config_in(dir, 8, io), "l", kBlockBytes, block);
    INFO("engine " << to_string(tier.io()));
    REQUIRE(run(tier, job_of(1, JobKind::write, 0, 2, 0, 0)).ok);
    JobId id = 2;
    for (const int err : {EIO, EAGAIN, EINTR}) {
      CAPTURE(err);
      tier.fail_reads_for_test(1, err);
      const FinishedTierJob failed = run(tier, job_of(id++, JobKind::promote, 0, 1, 4, 0));
      CHECK_FALSE(failed.ok);
      CHECK(failed.failed_blocks == 1);
      // Still there: the next promotion reads it.
      REQUIRE(run(tier, job_of(id++, JobKind::promote, 0, 1, 4, 0)).ok);
      CHECK(pool.holds(4, 500));
    }
    CHECK(tier.slots().stats().read_errors == 3);
    // Slot 1 asked for key 0: a miss, and slot 1 keeps its own block.
    TierJob wrong = job_of(id++, JobKind::promote, 0, 1, 5, 1);
    CHECK_FALSE(run(tier, wrong).ok);
    REQUIRE(run(tier, job_of(id++, JobKind::promote, 1, 1, 5, 1)).ok);
    CHECK(pool.holds(5, 501));
    CHECK(tier.slots().stats().read_corrupt == 0);
  }
  // And a restart finds both.
  const DiskTier again(config_in(dir, 8, io), "l", kBlockBytes, block);
  CHECK(again.scanned()[0] == key_of(0));
  CHECK(again.scanned()[1] == key_of(1));
}

TEST_CASE(
    "io_uring: a submission the kernel refuses fails its blocks instead of hanging; one "
    "short of resources is retried",
    "[disk][tier][fork]") {
  // In a child with an alarm: a hang is a killed child and a failed test, not a stuck run.
  TempDir dir;
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::alarm(60);
    int status = 0;
    try {
      Pool pool(16);
      for (int i = 0; i < 8; ++i) pool.fill(i, 900 + static_cast<std::uint64_t>(i));
      DiskTierConfig c = config_in(dir, 16, DiskIo::io_uring);
      c.io_depth = 4;
      std::unique_ptr<DiskTier> tier;
      try {
        tier = std::make_unique<DiskTier>(c, "l", kBlockBytes,
                                          [&](HostBlockId id) { return pool.block(id); });
      } catch (const unsupported&) {
        ::_exit(77);  // no io_uring here
      }
      // A hard failure: the blocks of that submission fail, the job finishes.
      tier->fail_submits_for_test(1, EIO);
      const FinishedTierJob hard = run(*tier, job_of(1, JobKind::write, 0, 8, 0, 0));
      if (hard.ok || hard.failed_blocks < 1 || hard.failed_blocks > 8) status |= 1;
      // The tier goes on (the given-up operations run as nothing, if ever).
      if (!run(*tier, job_of(2, JobKind::write, 0, 8, 0, 0)).ok) status |= 2;
      if (!run(*tier, job_of(3, JobKind::promote, 0, 8, 8, 0)).ok) status |= 4;
      for (int i = 0; i < 8; ++i) {
        if (!pool.holds(8 + i, 900 + static_cast<std::uint64_t>(i))) status |= 8;
      }
      // Short of resources a few times: retried, nothing fails.
      tier->fail_submits_for_test(3, EAGAIN);
      if (!run(*tier, job_of(4, JobKind::write, 0, 8, 0, 0)).ok) status |= 16;
      tier->fail_submits_for_test(2, EBUSY);
      if (!run(*tier, job_of(5, JobKind::promote, 0, 8, 8, 0)).ok) status |= 32;
      // Short of resources for good: bounded, the blocks fail.
      tier->fail_submits_for_test(1000, EAGAIN);
      if (run(*tier, job_of(6, JobKind::write, 0, 8, 0, 0)).ok) status |= 64;
      tier->fail_submits_for_test(0, 0);
      if (!run(*tier, job_of(7, JobKind::write, 0, 8, 0, 0)).ok) status |= 128;
    } catch (...) {
      status |= 256;
    }
    ::_exit(status > 255 ? 255 : status);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  INFO("the child " << (WIFSIGNALED(status) ? "was killed (a hang?) by signal " : "exited ")
                    << (WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status)));
  REQUIRE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) SKIP("io_uring is not available here");
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("Promotions are taken before queued writes, each kind in order", "[disk][tier]") {
  // One I/O thread, held at its first block of a large write: a promotion submitted then runs
  // as soon as that block is done, before the write's other blocks.
  TempDir dir;
  Pool pool(64);
  std::mutex m;
  std::condition_variable cv;
  bool armed = false, at_gate = false, open = false;
  std::vector<HostBlockId> order;  // host blocks as the I/O thread reaches them
  const std::thread::id test_thread = std::this_thread::get_id();
  const auto block = [&](HostBlockId id) {
    if (std::this_thread::get_id() != test_thread) {  // not submit()'s own checks
      std::unique_lock lock(m);
      order.push_back(id);
      if (armed && !open) {
        at_gate = true;
        cv.notify_all();
        cv.wait_for(lock, std::chrono::seconds(20), [&] { return open; });
      }
    }
    return pool.block(id);
  };
  DiskTier tier(config_in(dir, 64, DiskIo::threads, 1), "l", kBlockBytes, block);
  REQUIRE(tier.io() == DiskIo::threads);
  for (int i = 0; i < 4; ++i) pool.fill(60 + i, 700 + static_cast<std::uint64_t>(i));
  REQUIRE(run(tier, job_of(1, JobKind::write, 100, 4, 60, 60)).ok);  // what the promotion reads
  {
    std::lock_guard lock(m);
    order.clear();
    armed = true;
  }
  tier.submit(job_of(2, JobKind::write, 0, 48, 0, 0));
  {
    std::unique_lock lock(m);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(20), [&] { return at_gate; }));
  }
  tier.submit(job_of(3, JobKind::promote, 100, 4, 48, 60));
  {
    std::lock_guard lock(m);
    open = true;
  }
  cv.notify_all();
  const JobId ids[] = {2, 3};
  tier.wait(ids);
  const std::vector<FinishedTierJob> done = tier.get_finished();
  REQUIRE(done.size() == 2);
  for (const FinishedTierJob& f : done) CHECK(f.ok);
  for (int i = 0; i < 4; ++i) CHECK(pool.holds(48 + i, 700 + static_cast<std::uint64_t>(i)));
  std::vector<HostBlockId> expected{0, 48, 49, 50, 51};  // the held write block, the promotion
  for (HostBlockId h = 1; h < 48; ++h) expected.push_back(h);  // then the write, in order
  std::lock_guard lock(m);
  CHECK(order == expected);
}
