// The worker side of the shared tier against the real cluster ctest starts ([cluster]): values
// round-trip byte for byte; a value another client damaged, deleted or wrote for another
// layout is a counted miss and its block is reported failed.

#include <catch2/catch_test_macros.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvoffload/error.hpp"
#include "kvoffload/tiers/shared_presence.hpp"
#include "kvoffload/tiers/shared_tier.hpp"
#include "support/cluster.hpp"

using namespace kvoffload;
using kvoffload::test::cli;

namespace {

constexpr std::size_t kBlockBytes = 64 * 1024;

/// A host pool of `n` blocks in a vector, as the worker's callback sees it.
struct Pool {
  explicit Pool(std::size_t n) : bytes(n * kBlockBytes) {}
  std::span<std::byte> block(HostBlockId id) {
    if (id < 0 || static_cast<std::size_t>(id) * kBlockBytes >= bytes.size()) {
      throw invalid_argument("host block out of range");
    }
    return {bytes.data() + static_cast<std::size_t>(id) * kBlockBytes, kBlockBytes};
  }
  std::vector<std::byte> bytes;
};

SharedTierConfig config(const std::string& name) {
  SharedTierConfig c;
  c.nodes = kvoffload::test::cluster_seed();
  c.name = name;
  c.reply_timeout_ms = 500;
  return c;
}

Key key(std::uint64_t seed, std::uint32_t group = 0) {
  std::uint8_t b[16];
  for (int i = 0; i < 16; ++i) b[i] = static_cast<std::uint8_t>((seed * 131 + i * 7 + 1) & 0xff);
  std::memcpy(b, &seed, sizeof(seed));
  return Key{BlockHash::from_bytes(b), group};
}

TierJob job(JobId id, JobKind kind, const std::vector<Key>& keys,
            const std::vector<HostBlockId>& hosts) {
  TierJob j;
  j.id = id;
  j.kind = kind;
  j.keys = keys;
  j.host_block_ids = hosts;
  j.slots.assign(keys.size(), -1);
  return j;
}

FinishedTierJob run(SharedTier& t, const TierJob& j) {
  t.submit(j);
  const JobId id = j.id;
  t.wait(std::span(&id, 1));
  const auto done = t.get_finished();
  REQUIRE(done.size() == 1);
  REQUIRE(done[0].job == j.id);
  return done[0];
}

}  // namespace

TEST_CASE("Shared keys: a namespace per name, tp size and factor, a key's ranks in one slot",
          "[shared_tier]") {
  const std::string ns = shared_namespace("m", 2, 4);
  CHECK(ns.size() == 16);
  CHECK(ns == shared_namespace("m", 2, 4));
  CHECK(ns != shared_namespace("m", 4, 4));
  CHECK(ns != shared_namespace("n", 2, 4));
  // Key (h, g) with factor 2 (host block 1 of a prompt) and factor 4 (its host block 0) name
  // different tokens under the same hash: the factor must keep them apart.
  CHECK(ns != shared_namespace("m", 2, 2));
  const Key k = key(5, 3);
  const std::string r0 = shared_key(ns, k, 0), r1 = shared_key(ns, k, 1);
  CHECK(r0 == "kvo:{" + ns + ":3:" + k.hash.to_hex() + "}:0");
  CHECK(r0 != r1);
  CHECK(cluster_key_slot(r0) == cluster_key_slot(r1));
  CHECK(shared_key(ns, key(5, 2), 0) != r0);
}

TEST_CASE("Shared tier: bad configs are named", "[shared_tier]") {
  Pool pool(1);
  const auto host = [&](HostBlockId id) { return pool.block(id); };
  SharedTierConfig c = config("");
  CHECK_THROWS_AS(SharedTier(c, 1, "l", kBlockBytes, host), invalid_argument);
  c = config("x");
  c.nodes = "nowhere";
  CHECK_THROWS_AS(SharedTier(c, 1, "l", kBlockBytes, host), invalid_argument);
  c = config("x");
  c.tp_rank = 2;
  c.tp_size = 2;
  CHECK_THROWS_AS(SharedTier(c, 1, "l", kBlockBytes, host), invalid_argument);
  CHECK_THROWS_AS(SharedTier(config("x"), 0, "l", kBlockBytes, host), invalid_argument);
  CHECK_THROWS_AS(make_cluster_presence(config("x"), 0), invalid_argument);
  CHECK_THROWS_AS(make_cluster_presence(config(""), 1), invalid_argument);
}

TEST_CASE("Shared tier: blocks round-trip; damaged, deleted and foreign values are misses",
          "[cluster]") {
  const std::string name = "shared-tier-test-" + std::to_string(std::random_device{}());
  Pool pool(16);
  SharedTier tier(config(name), 2, "layout A", kBlockBytes,
                  [&](HostBlockId id) { return pool.block(id); });
  std::mt19937_64 rng(42);
  for (auto& b : pool.bytes) b = static_cast<std::byte>(rng());
  const std::vector<Key> keys = {key(1), key(2), key(3), key(4), key(5, 1)};
  const std::vector<HostBlockId> sources = {0, 1, 2, 3, 4};
  REQUIRE(run(tier, job(1, JobKind::write, keys, sources)).ok);
  CHECK(tier.shared_stats().writes == 5);

  // Another client damages key 2 (garbage), flips one payload byte of key 3 and deletes key 4.
  const auto name_of = [&](std::size_t i) { return shared_key(tier.key_namespace(), keys[i], 0); };
  REQUIRE(cli("-c SET '" + name_of(1) + "' garbage") == "OK");
  REQUIRE(cli("-c SETRANGE '" + name_of(2) + "' 1000 X") != "");
  REQUIRE(cli("-c DEL '" + name_of(3) + "'") == "1");

  // Promote all five into blocks 8..12, filled with a sentinel first.
  std::memset(pool.block(8).data(), 0xAB, 5 * kBlockBytes);
  const FinishedTierJob f = run(tier, job(2, JobKind::promote, keys, {8, 9, 10, 11, 12}));
  CHECK_FALSE(f.ok);
  CHECK(f.failed_blocks == 3);
  for (const std::size_t i : {std::size_t{0}, std::size_t{4}}) {
    CAPTURE(i);
    CHECK(std::memcmp(pool.block(static_cast<HostBlockId>(8 + i)).data(),
                      pool.block(sources[i]).data(), kBlockBytes) == 0);
  }
  // A value of the wrong length (the garbage) or none at all leaves the block alone; a value of
  // the right length is read in place, so its block (10) holds the damaged bytes, but the job
  // says failed and the scheduler frees that block without it ever being a hit.
  for (const HostBlockId damaged : {9, 11}) {
    CAPTURE(damaged);
    const auto b = pool.block(damaged);
    CHECK(std::all_of(b.begin(), b.end(), [](std::byte x) { return x == std::byte{0xAB}; }));
  }
  const SharedTierStats s = tier.shared_stats();
  CHECK(s.reads == 2);
  CHECK(s.bad_values == 2);
  CHECK(s.read_misses == 1);
  CHECK(s.read_errors == 0);
  CHECK(s.bytes_read == 2 * kBlockBytes);

  // Same name, another layout (a worker whose tensors differ): the header refuses it.
  SharedTier other(config(name), 2, "layout B", kBlockBytes,
                   [&](HostBlockId id) { return pool.block(id); });
  CHECK(other.key_namespace() == tier.key_namespace());
  CHECK_FALSE(run(other, job(3, JobKind::promote, {keys[0]}, {13})).ok);
  CHECK(other.shared_stats().bad_values == 1);
  // Same name, another block size factor: other keys, so a miss without reading anything.
  SharedTier factor4(config(name), 4, "layout A", kBlockBytes,
                     [&](HostBlockId id) { return pool.block(id); });
  CHECK(factor4.key_namespace() != tier.key_namespace());
  CHECK_FALSE(run(factor4, job(6, JobKind::promote, {keys[0]}, {14})).ok);
  CHECK(factor4.shared_stats().read_misses == 1);
  CHECK(factor4.shared_stats().bad_values == 0);
  // A value marked partly written (valid_from at header offset 72 not 0), its payload sum
  // still right: refused, the tier holds whole blocks only (SEMANTICS 6.8).
  REQUIRE(cli("-c SETRANGE '" + name_of(0) + "' 72 1") != "");
  CHECK_FALSE(run(tier, job(7, JobKind::promote, {keys[0]}, {15})).ok);
  CHECK(tier.shared_stats().bad_values == 3);
  // Jobs with lists that do not match are refused before anything runs.
  CHECK_THROWS_AS(tier.submit(job(4, JobKind::promote, keys, {1})), invalid_argument);
  CHECK_THROWS_AS(tier.submit(job(5, JobKind::promote, {keys[0]}, {99})), invalid_argument);
}

TEST_CASE("Shared tier: an unreachable cluster fails blocks within the timeouts", "[cluster]") {
  Pool pool(4);
  SharedTierConfig c = config("unreachable");
  c.nodes = "127.0.0.1:1";
  SharedTier tier(c, 1, "layout", kBlockBytes, [&](HostBlockId id) { return pool.block(id); });
  const auto start = std::chrono::steady_clock::now();
  const FinishedTierJob w = run(tier, job(1, JobKind::write, {key(1), key(2)}, {0, 1}));
  CHECK_FALSE(w.ok);
  CHECK(w.failed_blocks == 2);
  const FinishedTierJob p = run(tier, job(2, JobKind::promote, {key(1)}, {2}));
  CHECK_FALSE(p.ok);
  CHECK(tier.shared_stats().write_errors == 2);
  CHECK(tier.shared_stats().read_errors == 1);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(3));
}
