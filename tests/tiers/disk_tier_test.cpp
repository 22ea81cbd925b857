// The disk tier's worker side: tier jobs run on I/O threads and move exact bytes between host
// blocks and slots; a corrupt slot fails its promotion and is emptied; a restart finds what
// was written; ranks are merged; a full disk fails writes without failing the process; and
// the synthetic engine with a disk tier verifies every loaded byte, also after a restart.

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>

#include "kvoffload/error.hpp"
#include "kvoffload/tiers/disk_tier.hpp"
#include "kvoffload/worker.hpp"
#include "sim/synthetic_engine.hpp"
#include "support/shared_secret.hpp"
#include "support/temp_dir.hpp"
#include "support/tier_pool.hpp"

using namespace kvoffload;
using kvtest::TempDir;

namespace {

constexpr std::uint64_t kBlockBytes = 12288;

/// The tests' host pool: blocks of kBlockBytes.
struct Pool : kvtest::TierPool {
  explicit Pool(std::int64_t blocks) : TierPool(blocks, kBlockBytes) {}
};

Key key_of(int i) {
  return kvtest::tier_key(i);
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

using kvtest::job_of;

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
  const TierJob w1 = job_of(1, JobKind::write, 0, 25, 0, 10);
  const TierJob w2 = job_of(2, JobKind::write, 25, 15, 25, 40);
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
  p.kind = JobKind::promote;
  for (int i = 0; i < 40; ++i) {
    p.keys.push_back(key_of(i));
    p.host_block_ids.push_back(79 - i);
    p.slots.push_back(i < 25 ? 10 + i : 40 + (i - 25));
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
    tier.submit(job_of(1, JobKind::write, 0, 4, 0, 0));
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
  {
    DiskTier tier(config_in(dir, 8, 2, io), "layout-a", kBlockBytes,
                  [&](HostBlockId id) { return pool.block(id); });
    const auto& scanned = tier.scanned();
    for (int i = 0; i < 4; ++i) {
      REQUIRE(scanned[static_cast<std::size_t>(i)].has_value());  // headers are fine
      CHECK(*scanned[static_cast<std::size_t>(i)] == key_of(i));
    }
    // Restored from (here: read): its memory goes back, and the reads below need none of it.
    tier.release_scan();
    CHECK(tier.scanned().empty());
    CHECK(tier.scanned().capacity() == 0);
    TierJob p = job_of(2, JobKind::promote, 0, 4, 4, 0);
    tier.submit(p);
    const std::vector<JobId> ids{2};
    const auto done = finish(tier, ids);
    REQUIRE(done.size() == 1);
    CHECK_FALSE(done[0].ok);
    CHECK(done[0].failed_blocks == 1);
    CHECK(tier.slots().stats().read_misses == 1);
    CHECK(tier.slots().stats().read_corrupt == 1);  // erased: the restart below misses it
    CHECK(pool.holds(4, 7));                        // the good slots still arrived
    CHECK(pool.holds(7, 10));
  }
  DiskTier again(config_in(dir, 8, 2, io), "layout-a", kBlockBytes,
                 [&](HostBlockId id) { return pool.block(id); });
  CHECK_FALSE(again.scanned()[2].has_value());
  CHECK(again.scanned()[3].has_value());
}

TEST_CASE("clear() empties the tier, also for the next start", "[disk][tier]") {
  TempDir dir;
  Pool pool(4);
  for (int i = 0; i < 4; ++i) pool.fill(i, 90 + static_cast<std::uint64_t>(i));
  {
    DiskTier tier(config_in(dir, 8), "l", kBlockBytes,
                  [&](HostBlockId id) { return pool.block(id); });
    tier.submit(job_of(1, JobKind::write, 0, 4, 0, 0));
    const std::vector<JobId> ids{1};
    REQUIRE(finish(tier, ids).at(0).ok);
    tier.clear();  // returns at once: the tier's own thread empties it
    tier.wait_cleared();
    for (const auto& k : tier.scanned()) CHECK_FALSE(k.has_value());
    // A promotion of a cleared slot is a miss.
    tier.submit(job_of(2, JobKind::promote, 0, 1, 3, 0));
    const std::vector<JobId> p{2};
    CHECK_FALSE(finish(tier, p).at(0).ok);
  }
  DiskTier again(config_in(dir, 8), "l", kBlockBytes,
                 [&](HostBlockId id) { return pool.block(id); });
  for (const auto& k : again.scanned()) CHECK_FALSE(k.has_value());
  CHECK(again.num_slots() == 8);
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
  TierJob j = job_of(1, JobKind::write, 0, 2, 0, 3);  // slot 4 is out of range
  CHECK_THROWS_AS(tier.submit(j), invalid_argument);
  j = job_of(1, JobKind::write, 0, 2, 0, 0);
  j.slots.pop_back();
  CHECK_THROWS_AS(tier.submit(j), invalid_argument);
  // Hand-made jobs the scheduler never builds: one slot written twice, one host block
  // promoted into twice. (Reading one host block into two slots, or one slot into two host
  // blocks, is fine.)
  j = job_of(1, JobKind::write, 0, 2, 0, 0);
  j.slots[1] = 0;
  CHECK_THROWS_WITH(tier.submit(j), Catch::Matchers::ContainsSubstring("both written to slot 0"));
  j = job_of(1, JobKind::promote, 0, 3, 0, 0);
  j.host_block_ids[2] = 0;
  CHECK_THROWS_WITH(tier.submit(j), Catch::Matchers::ContainsSubstring(
                                        "0 and 2 are both promoted into host block 0"));
  j = job_of(1, JobKind::write, 0, 2, 0, 0);
  j.host_block_ids[1] = 0;
  CHECK_NOTHROW(tier.submit(j));
  j = job_of(2, JobKind::promote, 0, 2, 2, 0);
  j.slots[1] = 0;
  CHECK_NOTHROW(tier.submit(j));
  const std::vector<JobId> ids{1, 2};
  tier.wait(ids);
  CHECK(tier.slots().stats().writes == 2);
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
      tier.submit(job_of(1, JobKind::write, 0, 4, 0, 0));
      tier.submit(job_of(2, JobKind::write, 4, 4, 4, 8));
      const std::vector<JobId> ids{1, 2};
      tier.wait(ids);
      auto done = tier.get_finished();
      std::sort(done.begin(), done.end(), [](auto& a, auto& b) { return a.job < b.job; });
      if (done.size() != 2 || !done[0].ok || done[1].ok || done[1].failed_blocks != 4) status |= 1;
      if (tier.slots().stats().write_errors != 4) status |= 2;
      // The process goes on: a promotion of the good slots still works.
      tier.submit(job_of(3, JobKind::promote, 0, 4, 8, 0));
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

namespace {

/// Flips one payload byte in `fraction` of the slots of every slab file under `dir`, and cuts
/// the last slab file (if there are several) in half: damage a restart must survive.
std::int64_t damage(const std::filesystem::path& dir, double fraction, std::mt19937_64& rng) {
  std::int64_t flipped = 0;
  std::vector<std::filesystem::path> slabs;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.path().extension() == ".kvo") slabs.push_back(e.path());
  }
  std::sort(slabs.begin(), slabs.end());
  for (const auto& path : slabs) {
    const auto size = static_cast<std::int64_t>(std::filesystem::file_size(path));
    if (size == 0) continue;
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    const auto flips = static_cast<std::int64_t>(fraction * static_cast<double>(size / 4096));
    for (std::int64_t k = 0; k < flips; ++k) {
      const std::int64_t at = std::uniform_int_distribution<std::int64_t>(0, size - 1)(rng);
      f.seekg(at);
      char c = 0;
      f.read(&c, 1);
      c = static_cast<char>(c ^ 0x77);
      f.seekp(at);
      f.write(&c, 1);
      ++flipped;
    }
  }
  if (slabs.size() > 1) {
    std::filesystem::resize_file(slabs.back(), std::filesystem::file_size(slabs.back()) / 2);
  }
  return flipped;
}

}  // namespace

TEST_CASE(
    "Property: the synthetic engine with a disk tier, random configurations, restarts "
    "and damaged files: every loaded byte exact, the tier index the written keys",
    "[disk][tier][sim-engine][property]") {
  // The seed is printed; KVOFFLOAD_TEST_SEED=N replays one.
  const char* env = std::getenv("KVOFFLOAD_TEST_SEED");
  const auto seed = env != nullptr ? std::strtoull(env, nullptr, 10)
                                   : static_cast<std::uint64_t>(std::random_device{}());
  std::printf("disk tier property test: seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const auto pick = [&](auto... options) {
    const std::int64_t values[] = {static_cast<std::int64_t>(options)...};
    return values[std::uniform_int_distribution<std::size_t>(0, sizeof...(options) - 1)(rng)];
  };
  for (int config = 0; config < 3; ++config) {
    TempDir dir;
    kvsim::SimConfig c;
    c.seed = rng();
    c.steps = 500;
    c.host_blocks = pick(48, 96, 160);  // small: hits come from the disk
    c.block_size_factor = pick(1, 2, 4);
    c.disk_dir = dir.path.string();
    c.disk_capacity = static_cast<std::uint64_t>(pick(256 << 10, 2 << 20, 8 << 20));
    c.disk_store_threshold = pick(0, 2);
    c.disk_write_back = pick(0, 1) == 1;
    c.check_invariants = true;
    const std::string what = "seed " + std::to_string(seed) + ", config " + std::to_string(config) +
                             ": host_blocks " + std::to_string(c.host_blocks) + ", factor " +
                             std::to_string(c.block_size_factor) + ", disk " +
                             std::to_string(c.disk_capacity) + " B, threshold " +
                             std::to_string(c.disk_store_threshold) +
                             (c.disk_write_back ? ", write-back" : ", write-through");
    INFO(what);
    std::uint64_t written = 0, promoted = 0, failed = 0;
    for (int run = 0; run < 3; ++run) {
      INFO("run " << run);
      kvsim::SyntheticEngine engine(c);
      const kvsim::SimReport r = engine.run();
      CHECK(r.mismatches == 0);
      CHECK(r.first_mismatch.empty());
      CHECK(r.invariant_violations == 0);
      CHECK(r.first_violation.empty());
      CHECK(r.drained);
      CHECK(r.disk_restored <= r.disk_slots);
      if (run > 0) CHECK(r.disk_restored > 0);  // the earlier runs' blocks survived
      written += r.disk_blocks_written;
      promoted += r.disk_promotions;
      failed += r.disk_failed_promotions;
      // The next run starts from damaged files: those blocks must be misses, never data.
      (void)damage(dir.path, 0.05, rng);
    }
    CHECK(written > 0);
    std::printf("  %s: %llu written, %llu promoted, %llu promotions failed (damaged slots)\n",
                what.c_str(), static_cast<unsigned long long>(written),
                static_cast<unsigned long long>(promoted), static_cast<unsigned long long>(failed));
  }
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
  Pool pool(8 + 200);
  for (int i = 0; i < 8; ++i) pool.fill(i, 300 + static_cast<std::uint64_t>(i));
  DiskTierConfig c = config_in(dir, 200, 1);
  c.io_depth = depth;
  DiskTier tier(c, "l", kBlockBytes, [&](HostBlockId id) { return pool.block(id); });
  TierJob w = job_of(1, JobKind::write, 0, 0, 0, 0);
  for (int i = 0; i < 200; ++i) {
    w.keys.push_back(key_of(i));
    w.host_block_ids.push_back(i % 8);
    w.slots.push_back(i);
  }
  tier.submit(w);
  const std::vector<JobId> ids{1};
  const auto done = finish(tier, ids);
  REQUIRE(done.size() == 1);
  CHECK(done[0].ok);
  TierJob p = w;
  p.id = 2;
  p.kind = JobKind::promote;
  // Each slot into a host block of its own (a promotion fills a host block once).
  for (int i = 0; i < 200; ++i) p.host_block_ids[static_cast<std::size_t>(i)] = 8 + i;
  tier.submit(p);
  const std::vector<JobId> pid{2};
  const auto got = finish(tier, pid);
  REQUIRE(got.size() == 1);
  CHECK(got[0].ok);
  for (int i = 0; i < 200; ++i) CHECK(pool.holds(8 + i, 300 + static_cast<std::uint64_t>(i % 8)));
}

TEST_CASE("A worker derived from the scheduler's config has its tiers, factor and pool",
          "[disk][tier]") {
  TempDir dir;
  std::vector<std::byte> gpu(4 * 4096);
  WorkerConfig wc;
  wc.tensors.push_back({reinterpret_cast<std::uintptr_t>(gpu.data()), 4, 4096, 4096});
  wc.groups = {{{0, 4096}}};
  wc.threads = 1;
  SchedulerConfig sc;
  sc.groups = {GroupConfig{GroupKind::full_attention, 16, 0}};
  sc.block_size_factor = 2;
  sc.manager.host_blocks = 4;
  TierConfig disk;
  disk.blocks = 8;
  sc.tiers = {disk};
  CHECK_THROWS_WITH(derive_worker_config(sc, wc),
                    Catch::Matchers::ContainsSubstring("tiers[0].store: a worker needs"));
  sc.tiers[0].store = config_in(dir);
  WorkerConfig rank1 = wc;
  rank1.tp_rank = 1;  // each rank's worker from the one description: its stores run as rank 1
  CHECK(std::get<DiskTierConfig>(derive_worker_config(sc, rank1).tiers[0]).tp_rank == 1);
  // A store's own rank must agree: two ranks on one slot file would read each other's rows.
  std::get<DiskTierConfig>(*sc.tiers[0].store).tp_rank = 2;
  CHECK_THROWS_WITH(
      derive_worker_config(sc, rank1),
      Catch::Matchers::ContainsSubstring("tiers[0].tp_rank is 2, but the worker's tp_rank is 1"));
  std::get<DiskTierConfig>(*sc.tiers[0].store).tp_rank = 0;
  const WorkerConfig derived = derive_worker_config(sc, wc);
  CHECK(derived.block_size_factor == 2);
  CHECK(derived.host_blocks == 4);
  REQUIRE(derived.tiers.size() == 1);
  CHECK(medium_of(derived.tiers[0]) == Medium::disk);
  CHECK(std::get<DiskTierConfig>(derived.tiers[0]).path == dir.path.string());
  CHECK(std::get<DiskTierConfig>(derived.tiers[0]).tp_rank == 0);
  WorkerConfig two_groups = wc;
  two_groups.groups.push_back({{0, 4096}});
  CHECK_THROWS_WITH(derive_worker_config(sc, two_groups),
                    Catch::Matchers::ContainsSubstring("tensors for 2 group(s), but the "
                                                       "scheduler has 1"));

  const Worker w(derived);
  CHECK(w.num_host_blocks() == 4);
  CHECK(w.tier_medium(0) == Medium::disk);
  CHECK_NOTHROW(w.check_matches(sc));
  // A scheduler configured apart from this worker is caught at the first difference.
  SchedulerConfig other = sc;
  other.block_size_factor = 1;
  CHECK_THROWS_WITH(w.check_matches(other),
                    Catch::Matchers::ContainsSubstring("block_size_factor is 2, but the "
                                                       "scheduler's is 1"));
  other = sc;
  other.manager.host_blocks = 8;
  CHECK_THROWS_WITH(w.check_matches(other), Catch::Matchers::ContainsSubstring(
                                                "host_blocks is 4, but the scheduler's is 8"));
  other = sc;
  other.groups.push_back(sc.groups[0]);
  CHECK_THROWS_WITH(w.check_matches(other),
                    Catch::Matchers::ContainsSubstring("1 group(s), but the scheduler has 2"));
  // More blocks than the worker has slots: the scheduler would hand out slots it lacks.
  other = sc;
  other.tiers[0].blocks = w.tier(0).num_slots() + 1;
  CHECK_THROWS_WITH(w.check_matches(other),
                    Catch::Matchers::ContainsSubstring("slot(s), but the scheduler's tier 0 has"));
  TierConfig shared;
  shared.medium = Medium::shared;
  shared.blocks = 8;
  other = sc;
  other.tiers = {shared};
  CHECK_THROWS_WITH(w.check_matches(other),
                    Catch::Matchers::ContainsSubstring("tier 0 is a disk tier") &&
                        Catch::Matchers::ContainsSubstring("is shared"));
  other.tiers = {sc.tiers[0], shared};
  CHECK_THROWS_WITH(w.check_matches(other),
                    Catch::Matchers::ContainsSubstring("1 tier(s), but the scheduler has 2"));

  // A shared tier (it connects on first use: none here) writes the namespace of its store;
  // a scheduler whose store names another would check keys nobody writes.
  SchedulerConfig with_shared = sc;
  const TempDir dir2;  // a disk of its own: `w` holds (locks) the first while it lives
  std::get<DiskTierConfig>(*with_shared.tiers[0].store).path = dir2.path.string();
  shared.store = kvoffload::test::shared_store("127.0.0.1:1", "model-a");
  with_shared.tiers.push_back(shared);
  const Worker ws(derive_worker_config(with_shared, wc));
  CHECK_NOTHROW(ws.check_matches(with_shared));
  std::get<SharedTierConfig>(*with_shared.tiers[1].store).name = "model-b";
  CHECK_THROWS_WITH(ws.check_matches(with_shared),
                    Catch::Matchers::ContainsSubstring("tier 1 writes namespace") &&
                        Catch::Matchers::ContainsSubstring("\"model-b\""));
}
