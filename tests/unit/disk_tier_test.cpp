// The disk tier's worker side: tier jobs run on I/O threads and move exact bytes between host
// blocks and slots; a corrupt slot fails its promotion and is emptied; a restart finds what
// was written; ranks are merged; a full disk fails writes without failing the process; and
// the synthetic engine with a disk tier verifies every loaded byte, also after a restart.

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>

#include "kvoffload/disk_tier.hpp"
#include "kvoffload/error.hpp"
#include "sim/synthetic_engine.hpp"
#include "support/temp_dir.hpp"

using namespace kvoffload;
using kvtest::TempDir;

namespace {

constexpr std::uint64_t kBlockBytes = 12288;

/// A host pool in ordinary memory, `blocks` blocks of kBlockBytes.
struct Pool {
  explicit Pool(std::int64_t blocks) : bytes(static_cast<std::size_t>(blocks) * kBlockBytes) {}
  std::span<std::byte> block(HostBlockId id) {
    if (id < 0 || static_cast<std::size_t>(id + 1) * kBlockBytes > bytes.size()) {
      throw invalid_argument("test pool: host block " + std::to_string(id) + " is out of range");
    }
    return {bytes.data() + static_cast<std::size_t>(id) * kBlockBytes, kBlockBytes};
  }
  void fill(HostBlockId id, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (std::byte& b : block(id)) b = static_cast<std::byte>(rng());
  }
  bool holds(HostBlockId id, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (const std::byte b : block(id)) {
      if (b != static_cast<std::byte>(rng())) return false;
    }
    return true;
  }
  std::vector<std::byte> bytes;
};

Key key_of(int i) {
  std::uint8_t b[16] = {};
  for (int k = 0; k < 16; ++k) b[k] = static_cast<std::uint8_t>(i * 37 + k * 11 + 3);
  return Key{BlockHash::from_bytes(b), static_cast<std::uint32_t>(i % 2)};
}

DiskTierConfig config_in(const TempDir& dir, std::uint64_t slots = 64, int threads = 4,
                         DiskIo io = DiskIo::automatic) {
  DiskTierConfig c;
  c.io = io;
  c.path = dir.path.string();
  c.capacity_bytes = slots * (4096 + kBlockBytes);
  c.model = "test-model";
  c.dtype = "bfloat16";
  c.io_threads = threads;
  return c;
}

TierJob job_of(JobId id, TierJobKind kind, int first, int n, HostBlockId host0,
               std::int64_t slot0) {
  TierJob j;
  j.id = id;
  j.kind = kind;
  for (int i = 0; i < n; ++i) {
    j.keys.push_back(key_of(first + i));
    j.host_block_ids.push_back(host0 + i);
    j.tier_block_ids.push_back(slot0 + i);
  }
  return j;
}

std::vector<FinishedTierJob> finish(DiskTier& tier, std::span<const JobId> ids) {
  tier.wait(ids);
  return tier.get_finished();
}

}  // namespace

TEST_CASE("Tier jobs write host blocks to slots and promote them back byte for byte",
          "[disk][tier]") {
  // Both engines: io_uring where this kernel allows it (auto), and the thread pool.
  const DiskIo io = GENERATE(DiskIo::automatic, DiskIo::threads);
  TempDir dir;
  Pool pool(80);
  for (int i = 0; i < 40; ++i) pool.fill(i, 1000 + static_cast<std::uint64_t>(i));
  DiskTier tier(config_in(dir, 64, 4, io), "layout-a", kBlockBytes,
                [&](HostBlockId id) { return pool.block(id); });
  REQUIRE(tier.num_slots() == 64);
  std::printf("disk tier round trip: %s engine, %s I/O\n",
              std::string(to_string(tier.io())).c_str(),
              tier.slots().direct() ? "O_DIRECT" : "buffered");
  if (io == DiskIo::threads) CHECK(tier.io() == DiskIo::threads);
  const TierJob w1 = job_of(1, TierJobKind::write, 0, 25, 0, 10);
  const TierJob w2 = job_of(2, TierJobKind::write, 25, 15, 25, 40);
  tier.submit(w1);
  tier.submit(w2);
  const std::vector<JobId> writes{1, 2};
  auto done = finish(tier, writes);
  REQUIRE(done.size() == 2);
  for (const FinishedTierJob& f : done) CHECK(f.ok);
  CHECK(tier.slots().stats().writes == 40);

  // Promote them into other host blocks (40..79), reversed, and compare.
  TierJob p;
  p.id = 3;
  p.kind = TierJobKind::promote;
  for (int i = 0; i < 40; ++i) {
    p.keys.push_back(key_of(i));
    p.host_block_ids.push_back(79 - i);
    p.tier_block_ids.push_back(i < 25 ? 10 + i : 40 + (i - 25));
  }
  tier.submit(p);
  const std::vector<JobId> promote{3};
  done = finish(tier, promote);
  REQUIRE(done.size() == 1);
  CHECK(done[0].ok);
  for (int i = 0; i < 40; ++i) {
    INFO("block " << i);
    CHECK(pool.holds(79 - i, 1000 + static_cast<std::uint64_t>(i)));
  }
}

TEST_CASE("A corrupt slot fails its promotion, is emptied, and a restart does not find it",
          "[disk][tier]") {
  const DiskIo io = GENERATE(DiskIo::automatic, DiskIo::threads);
  TempDir dir;
  Pool pool(8);
  for (int i = 0; i < 4; ++i) pool.fill(i, 7 + static_cast<std::uint64_t>(i));
  std::string layout_dir;
  {
    DiskTier tier(config_in(dir, 8, 2, io), "layout-a", kBlockBytes,
                  [&](HostBlockId id) { return pool.block(id); });
    tier.submit(job_of(1, TierJobKind::write, 0, 4, 0, 0));
    const std::vector<JobId> ids{1};
    REQUIRE(finish(tier, ids).at(0).ok);
    layout_dir = tier.slots().layout_directory();
  }
  {
    // Flip a payload byte of slot 2 (header 4 KiB, then the payload).
    std::fstream f(layout_dir + "/slab-0.kvo", std::ios::in | std::ios::out | std::ios::binary);
    const std::streamoff at = 2 * static_cast<std::streamoff>(4096 + kBlockBytes) + 4096 + 100;
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(at);
    f.write(&c, 1);
  }
  DiskTier tier(config_in(dir, 8, 2, io), "layout-a", kBlockBytes,
                [&](HostBlockId id) { return pool.block(id); });
  const auto& scanned = tier.scanned();
  for (int i = 0; i < 4; ++i) {
    REQUIRE(scanned[static_cast<std::size_t>(i)].has_value());  // headers are fine
    CHECK(*scanned[static_cast<std::size_t>(i)] == key_of(i));
  }
  TierJob p = job_of(2, TierJobKind::promote, 0, 4, 4, 0);
  tier.submit(p);
  const std::vector<JobId> ids{2};
  const auto done = finish(tier, ids);
  REQUIRE(done.size() == 1);
  CHECK_FALSE(done[0].ok);
  CHECK(done[0].failed_blocks == 1);
  CHECK(tier.slots().stats().read_misses == 1);
  CHECK(pool.holds(4, 7));  // the good slots still arrived
  CHECK(pool.holds(7, 10));

  DiskTier again(config_in(dir, 8, 2, io), "layout-a", kBlockBytes,
                 [&](HostBlockId id) { return pool.block(id); });
  CHECK_FALSE(again.scanned()[2].has_value());
  CHECK(again.scanned()[3].has_value());
}

TEST_CASE("Another model, dtype or rank is another directory", "[disk][tier]") {
  DiskTierConfig a;
  a.model = "m";
  a.dtype = "bfloat16";
  DiskTierConfig b = a;
  CHECK(disk_layout_digest(a, "x") == disk_layout_digest(b, "x"));
  CHECK(disk_layout_digest(a, "x") != disk_layout_digest(a, "y"));
  b.model = "m2";
  CHECK(disk_layout_digest(a, "x") != disk_layout_digest(b, "x"));
  b = a;
  b.dtype = "float16";
  CHECK(disk_layout_digest(a, "x") != disk_layout_digest(b, "x"));
  b = a;
  b.tp_rank = 1;
  b.tp_size = 2;
  CHECK(disk_layout_digest(a, "x") != disk_layout_digest(b, "x"));
}

TEST_CASE("A key counts as present only where every rank holds it", "[disk][tier]") {
  const Key k0 = key_of(0), k1 = key_of(1), k2 = key_of(2);
  const std::vector<std::vector<std::optional<Key>>> ranks{
      {k0, k1, k2, std::nullopt, k0}, {k0, std::nullopt, k2, k1, k1}, {k0, k1, k2, k1}};
  const auto merged = merge_rank_scans(ranks);
  REQUIRE(merged.size() == 4);  // the shortest scan bounds the slots
  CHECK(merged[0] == k0);
  CHECK_FALSE(merged[1].has_value());  // rank 1 lacks it
  CHECK(merged[2] == k2);
  CHECK_FALSE(merged[3].has_value());
  CHECK(merge_rank_scans({}).empty());
}

TEST_CASE("Bad tier jobs are refused before any I/O", "[disk][tier]") {
  TempDir dir;
  Pool pool(4);
  DiskTier tier(config_in(dir, 4), "l", kBlockBytes,
                [&](HostBlockId id) { return pool.block(id); });
  TierJob j = job_of(1, TierJobKind::write, 0, 2, 0, 3);  // slot 4 is out of range
  CHECK_THROWS_AS(tier.submit(j), invalid_argument);
  j = job_of(1, TierJobKind::write, 0, 2, 0, 0);
  j.tier_block_ids.pop_back();
  CHECK_THROWS_AS(tier.submit(j), invalid_argument);
  CHECK(tier.slots().stats().writes == 0);
  DiskTierConfig bad = config_in(dir, 4);
  bad.io_threads = 0;
  CHECK_THROWS_AS(DiskTier(bad, "l", kBlockBytes, [&](HostBlockId id) { return pool.block(id); }),
                  invalid_argument);
}

TEST_CASE("A full disk fails the writes that do not fit and nothing else", "[disk][tier]") {
  // The child limits its file size (RLIMIT_FSIZE: writes past it fail with EFBIG, as ENOSPC
  // would) and reports through its exit status.
  const DiskIo io = GENERATE(DiskIo::automatic, DiskIo::threads);
  TempDir dir;
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{6 * (4096 + kBlockBytes), 6 * (4096 + kBlockBytes)};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    int status = 0;
    try {
      Pool pool(16);
      for (int i = 0; i < 16; ++i) pool.fill(i, 50 + static_cast<std::uint64_t>(i));
      DiskTierConfig c = config_in(dir, 16, 2, io);
      DiskTier tier(c, "l", kBlockBytes, [&](HostBlockId id) { return pool.block(id); });
      // The slab file is sparse and 16 slots long: slots 0..5 fit under the limit.
      tier.submit(job_of(1, TierJobKind::write, 0, 4, 0, 0));
      tier.submit(job_of(2, TierJobKind::write, 4, 4, 4, 8));
      const std::vector<JobId> ids{1, 2};
      tier.wait(ids);
      auto done = tier.get_finished();
      std::sort(done.begin(), done.end(), [](auto& a, auto& b) { return a.job < b.job; });
      if (done.size() != 2 || !done[0].ok || done[1].ok || done[1].failed_blocks != 4) status |= 1;
      if (tier.slots().stats().write_errors != 4) status |= 2;
      // The process goes on: a promotion of the good slots still works.
      tier.submit(job_of(3, TierJobKind::promote, 0, 4, 8, 0));
      const std::vector<JobId> p{3};
      tier.wait(p);
      const auto got = tier.get_finished();
      if (got.size() != 1 || !got[0].ok || !pool.holds(8, 50) || !pool.holds(11, 53)) status |= 4;
    } catch (...) {
      status |= 8;
    }
    ::_exit(status);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("The synthetic engine with a disk tier verifies every byte, also after a restart",
          "[disk][tier][sim-engine]") {
  TempDir dir;
  const auto seed = static_cast<std::uint64_t>(std::random_device{}());
  INFO("seed " << seed);
  std::printf("disk tier engine test: seed %llu\n", static_cast<unsigned long long>(seed));
  kvsim::SimConfig c;
  c.seed = seed;
  c.steps = 1200;
  c.host_blocks = 96;  // small: hits come from the disk
  c.disk_dir = dir.path.string();
  c.disk_capacity = 8ull << 20;
  c.check_invariants = true;
  kvsim::SimReport first;
  {
    kvsim::SyntheticEngine engine(c);
    first = engine.run();
  }
  CHECK(first.mismatches == 0);
  CHECK(first.invariant_violations == 0);
  CHECK(first.drained);
  CHECK(first.disk_blocks_written > 0);
  CHECK(first.disk_promotions > 0);
  CHECK(first.disk_restored == 0);

  // Restart on the same directory: what was written is found, and loads of it verify.
  kvsim::SyntheticEngine again(c);
  const kvsim::SimReport second = again.run();
  CHECK(second.disk_restored > 0);
  CHECK(second.disk_restored <= second.disk_slots);
  CHECK(second.mismatches == 0);
  CHECK(second.invariant_violations == 0);
  CHECK(second.disk_promotions > 0);
}

TEST_CASE("Asking for io_uring gets it or a clear error, never another engine", "[disk][tier]") {
  TempDir dir;
  Pool pool(4);
  try {
    DiskTier tier(config_in(dir, 4, 1, DiskIo::io_uring), "l", kBlockBytes,
                  [&](HostBlockId id) { return pool.block(id); });
    CHECK(tier.io() == DiskIo::io_uring);
  } catch (const unsupported& e) {
    CHECK(std::string(e.what()).find("io_uring is not available") != std::string::npos);
  }
}

TEST_CASE("Any queue depth moves every block of a large job", "[disk][tier]") {
  const int depth = GENERATE(1, 2, 3, 8);
  INFO("io_depth " << depth);
  TempDir dir;
  Pool pool(16);
  for (int i = 0; i < 8; ++i) pool.fill(i, 300 + static_cast<std::uint64_t>(i));
  DiskTierConfig c = config_in(dir, 200, 1);
  c.io_depth = depth;
  DiskTier tier(c, "l", kBlockBytes, [&](HostBlockId id) { return pool.block(id); });
  TierJob w = job_of(1, TierJobKind::write, 0, 0, 0, 0);
  for (int i = 0; i < 200; ++i) {
    w.keys.push_back(key_of(i));
    w.host_block_ids.push_back(i % 8);
    w.tier_block_ids.push_back(i);
  }
  tier.submit(w);
  const std::vector<JobId> ids{1};
  const auto done = finish(tier, ids);
  REQUIRE(done.size() == 1);
  CHECK(done[0].ok);
  TierJob p = w;
  p.id = 2;
  p.kind = TierJobKind::promote;
  for (auto& h : p.host_block_ids) h = 8 + h;
  tier.submit(p);
  const std::vector<JobId> pid{2};
  const auto got = finish(tier, pid);
  REQUIRE(got.size() == 1);
  CHECK(got[0].ok);
  for (int i = 0; i < 8; ++i) CHECK(pool.holds(8 + i, 300 + static_cast<std::uint64_t>(i)));
}
