// One conformance suite for every tier kind (issue 27, join 2): what the worker relies on from
// a Tier, checked the same way on the disk tier (both I/O engines) and on the shared tier
// against a real Valkey cluster ([cluster]). A new tier kind adds one TEST_CASE here.

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvoffload/error.hpp"
#include "kvoffload/tiers/disk_tier.hpp"
#include "kvoffload/tiers/shared_tier.hpp"
#include "kvoffload/tiers/tier.hpp"
#include "support/cluster.hpp"
#include "support/shared_secret.hpp"
#include "support/temp_dir.hpp"

using namespace kvoffload;
using Catch::Matchers::ContainsSubstring;

namespace {

constexpr std::uint64_t kBlockBytes = 8192;
constexpr int kBlocks = 24;  // per job; the pool holds two sets (written, promoted into)

struct Pool {
  Pool() : bytes(2 * kBlocks * kBlockBytes) {}
  std::span<std::byte> block(HostBlockId id) {
    if (id < 0 || id >= 2 * kBlocks) {
      throw invalid_argument("test pool: host block " + std::to_string(id) + " is out of range");
    }
    return {bytes.data() + static_cast<std::size_t>(id) * kBlockBytes, kBlockBytes};
  }
  std::vector<std::byte> bytes;
};

/// Makes a tier of one kind over `pool`; every call with the same suite sees the same
/// storage (a disk directory, a cluster namespace), as a restarted worker would.
using MakeTier = std::function<std::unique_ptr<Tier>(Pool& pool)>;

Key key_of(std::uint64_t run, int i) {
  std::uint8_t b[16];
  std::memcpy(b, &run, sizeof(run));
  for (int k = 8; k < 16; ++k) b[k] = static_cast<std::uint8_t>(i * 31 + k);
  return Key{BlockHash::from_bytes(b), static_cast<std::uint32_t>(i % 3)};
}

TierJob job_of(JobId id, JobKind kind, std::uint64_t run, int first, int n, HostBlockId host0) {
  TierJob j;
  j.id = id;
  j.kind = kind;
  for (int i = 0; i < n; ++i) {
    j.keys.push_back(key_of(run, first + i));
    j.host_block_ids.push_back(host0 + i);
    j.slots.push_back(first + i);
  }
  return j;
}

FinishedTierJob finish(Tier& tier, JobId id) {
  const JobId ids[] = {id};
  tier.wait(ids);
  CHECK_FALSE(tier.owns(id));
  const std::vector<FinishedTierJob> done = tier.get_finished();
  REQUIRE(done.size() == 1);
  CHECK(done[0].job == id);
  CHECK(tier.get_finished().empty());  // each job once
  return done[0];
}

void conformance(const MakeTier& make, Medium medium, std::uint64_t seed) {
  std::printf("tier conformance: %s, seed %llu\n", std::string(to_string(medium)).c_str(),
              static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const std::uint64_t run = rng();
  Pool pool;
  for (std::byte& b : pool.bytes) b = static_cast<std::byte>(rng());
  const std::vector<std::byte> written(pool.bytes.begin(),
                                       pool.bytes.begin() + kBlocks * kBlockBytes);
  auto tier = make(pool);
  REQUIRE(tier->medium() == medium);
  CHECK(tier->scanned().size() == static_cast<std::size_t>(tier->num_slots()));

  SECTION("written blocks promote back byte for byte, and are counted") {
    const TierIoStats before = tier->stats();
    tier->submit(job_of(1, JobKind::write, run, 0, kBlocks, 0));
    const FinishedTierJob w = finish(*tier, 1);
    CHECK(w.ok);
    CHECK(w.kind == JobKind::write);
    CHECK(w.failed_blocks == 0);
    std::memset(pool.bytes.data() + kBlocks * kBlockBytes, 0, kBlocks * kBlockBytes);
    tier->submit(job_of(2, JobKind::promote, run, 0, kBlocks, kBlocks));
    const FinishedTierJob p = finish(*tier, 2);
    CHECK(p.ok);
    CHECK(p.kind == JobKind::promote);
    CHECK(std::memcmp(pool.bytes.data() + kBlocks * kBlockBytes, written.data(), written.size()) ==
          0);
    const TierIoStats after = tier->stats();
    CHECK(after.writes - before.writes == kBlocks);
    CHECK(after.reads - before.reads == kBlocks);
    CHECK(after.write_failures == before.write_failures);
    CHECK(after.read_failures == before.read_failures);
  }

  SECTION("a promotion of a key the tier does not hold fails, counted, with no bytes claimed") {
    tier->submit(job_of(1, JobKind::write, run, 0, 4, 0));
    CHECK(finish(*tier, 1).ok);
    // The same slots (and host blocks), other keys: never another key's bytes.
    TierJob other = job_of(2, JobKind::promote, run + 1, 0, 4, kBlocks);
    other.slots = {0, 1, 2, 3};
    const TierIoStats before = tier->stats();
    tier->submit(other);
    const FinishedTierJob p = finish(*tier, 2);
    CHECK_FALSE(p.ok);
    CHECK(p.failed_blocks == 4);
    CHECK(tier->stats().read_failures - before.read_failures == 4);
    CHECK(tier->stats().reads == before.reads);
  }

  SECTION("a job without blocks finishes at once; unknown ids are not waited for") {
    TierJob empty;
    empty.id = 7;
    empty.kind = JobKind::promote;
    tier->submit(empty);
    CHECK(finish(*tier, 7).ok);
    const JobId unknown[] = {12345};
    tier->wait(unknown);
    CHECK_FALSE(tier->owns(12345));
  }

  SECTION("a job that does not fit is refused, naming it, and nothing runs") {
    TierJob bad = job_of(9, JobKind::write, run, 0, 3, 0);
    bad.host_block_ids.pop_back();
    CHECK_THROWS_WITH(tier->submit(bad), ContainsSubstring("tier job 9"));
    TierJob outside = job_of(10, JobKind::write, run, 0, 3, 0);
    outside.host_block_ids[1] = 2 * kBlocks;  // past the pool
    CHECK_THROWS_WITH(tier->submit(outside), ContainsSubstring("tier job 10"));
    TierJob transfer = job_of(11, JobKind::store, run, 0, 3, 0);  // a transfer's kind
    CHECK_THROWS_WITH(tier->submit(transfer),
                      ContainsSubstring("tier job 11") && ContainsSubstring("not a tier job"));
    const JobId ids[] = {9, 10, 11};
    tier->wait(ids);
    CHECK(tier->get_finished().empty());
    CHECK_FALSE(tier->owns(9));
  }

  SECTION("destruction finishes the jobs submitted; a new instance finds their blocks") {
    tier->submit(job_of(1, JobKind::write, run, 0, kBlocks, 0));
    tier.reset();  // at once: the write must still complete
    tier = make(pool);
    std::memset(pool.bytes.data() + kBlocks * kBlockBytes, 0, kBlocks * kBlockBytes);
    tier->submit(job_of(2, JobKind::promote, run, 0, kBlocks, kBlocks));
    CHECK(finish(*tier, 2).ok);
    CHECK(std::memcmp(pool.bytes.data() + kBlocks * kBlockBytes, written.data(), written.size()) ==
          0);
  }

  SECTION("many jobs in flight at once each finish once, with their own result") {
    // Six writes of 4 blocks, submitted back to back (a tier may batch across them); then,
    // once they are done (the scheduler never reads a slot being written), six promotions,
    // every other one of keys nobody wrote.
    std::map<JobId, FinishedTierJob> seen;
    const auto collect = [&](const std::vector<JobId>& ids) {
      tier->wait(ids);
      for (const FinishedTierJob& f : tier->get_finished()) {
        CHECK(seen.emplace(f.job, f).second);  // once
      }
    };
    for (JobId id = 0; id < 6; ++id) {
      tier->submit(job_of(id, JobKind::write, run, static_cast<int>(id) * 4, 4,
                          static_cast<HostBlockId>(id) * 4));
    }
    collect({0, 1, 2, 3, 4, 5});
    std::memset(pool.bytes.data() + kBlocks * kBlockBytes, 0, kBlocks * kBlockBytes);
    for (JobId id = 6; id < 12; ++id) {
      const int first = static_cast<int>(id - 6) * 4;
      tier->submit(
          job_of(id, JobKind::promote, id % 2 == 0 ? run : run + 7, first, 4, kBlocks + first));
    }
    collect({6, 7, 8, 9, 10, 11});
    REQUIRE(seen.size() == 12);
    for (JobId id = 0; id < 6; ++id) CHECK(seen[id].ok);
    for (JobId id = 6; id < 12; ++id) {
      const bool was_written = id % 2 == 0;
      CHECK(seen[id].ok == was_written);
      CHECK(seen[id].failed_blocks == (was_written ? 0 : 4));
      if (was_written) {
        const std::size_t at = static_cast<std::size_t>(id - 6) * 4 * kBlockBytes;
        CHECK(std::memcmp(pool.bytes.data() + kBlocks * kBlockBytes + at, written.data() + at,
                          4 * kBlockBytes) == 0);
      }
    }
  }

  SECTION("clear() with no job running succeeds; a job id can run again once finished") {
    tier->submit(job_of(1, JobKind::write, run, 0, 2, 0));
    CHECK(finish(*tier, 1).ok);
    CHECK_NOTHROW(tier->clear());
    tier->submit(job_of(1, JobKind::write, run, 0, 2, 0));
    CHECK(finish(*tier, 1).ok);
  }
}

}  // namespace

TEST_CASE("Tier conformance: the disk tier, both I/O engines", "[tier][disk]") {
  const DiskIo io = GENERATE(DiskIo::automatic, DiskIo::threads);
  kvtest::TempDir dir;
  const MakeTier make = [&](Pool& pool) -> std::unique_ptr<Tier> {
    DiskTierConfig c;
    c.io = io;
    c.path = dir.path.string();
    c.capacity_bytes = 64 * (4096 + kBlockBytes);
    c.model = "conformance";
    return std::make_unique<DiskTier>(c, "layout", kBlockBytes,
                                      [&pool](HostBlockId id) { return pool.block(id); });
  };
  conformance(make, Medium::disk, std::random_device{}());
}

TEST_CASE("Tier conformance: the shared tier on a Valkey cluster", "[cluster][tier]") {
  const std::string name = "conformance-" + std::to_string(std::random_device{}());
  const MakeTier make = [&](Pool& pool) -> std::unique_ptr<Tier> {
    const SharedTierConfig c = kvoffload::test::shared_store(kvoffload::test::cluster_seed(), name);
    return std::make_unique<SharedTier>(c, 1, "layout", kBlockBytes,
                                        [&pool](HostBlockId id) { return pool.block(id); });
  };
  conformance(make, Medium::shared, std::random_device{}());
}
