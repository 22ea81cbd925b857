// The worker side of the shared tier against the real cluster ctest starts ([cluster]): values
// round-trip byte for byte; a value another client damaged, deleted or wrote for another
// layout is a counted miss and its block is reported failed.

#include <sys/stat.h>
#include <unistd.h>
#include <catch2/catch_test_macros.hpp>

#include <catch2/matchers/catch_matchers_string.hpp>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kvoffload/error.hpp"
#include "kvoffload/tiers/cluster_client.hpp"
#include "kvoffload/tiers/shared_keys.hpp"
#include "kvoffload/tiers/shared_presence.hpp"
#include "kvoffload/tiers/shared_tier.hpp"
#include "support/cluster.hpp"
#include "support/shared_jobs.hpp"
#include "support/shared_secret.hpp"

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
  SharedTierConfig c = kvoffload::test::shared_store(kvoffload::test::cluster_seed(), name);
  c.reply_timeout_ms = 500;
  return c;
}

/// A secret file of its own, for a second fleet.
struct OtherSecret {
  std::string path = "/tmp/kvoffload-test-other-secret-" + std::to_string(::getpid());
  explicit OtherSecret(const std::string& secret) {
    std::ofstream(path) << secret;
    ::chmod(path.c_str(), 0600);
  }
  ~OtherSecret() { ::unlink(path.c_str()); }
  OtherSecret(const OtherSecret&) = delete;
  OtherSecret& operator=(const OtherSecret&) = delete;
};

Key key(std::uint64_t seed, std::uint32_t group = 0) {
  std::uint8_t b[16];
  for (int i = 0; i < 16; ++i) b[i] = static_cast<std::uint8_t>((seed * 131 + i * 7 + 1) & 0xff);
  std::memcpy(b, &seed, sizeof(seed));
  return Key{BlockHash::from_bytes(b), group};
}

using kvoffload::test::job;
using kvoffload::test::run;

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
  SharedTierConfig c = config("m");
  c.tp_size = 2;
  const SharedKeys keys(c, 4);
  CHECK(keys.secure());
  CHECK(keys.key_namespace() == ns);
  const Key k = key(5, 3);
  const std::string r0 = keys.name(k, 0, 0), r1 = keys.name(k, 1, 0);
  // "kvo:{" 32 hex digits "}:" rank: nothing of the hash or the namespace shows.
  CHECK(r0.size() == 5 + 32 + 3);
  CHECK(r0.starts_with("kvo:{"));
  CHECK(r0.ends_with("}:0"));
  CHECK(r1.ends_with("}:1"));
  CHECK(r0.find(k.hash.to_hex().substr(0, 8)) == std::string::npos);
  CHECK(r0.find(ns) == std::string::npos);
  CHECK(r0.substr(0, 37) == r1.substr(0, 37));
  CHECK(cluster_key_slot(r0) == cluster_key_slot(r1));
  CHECK(keys.name(key(5, 2), 0, 0) != r0);
  CHECK(keys.name(key(6, 3), 0, 0) != r0);
  CHECK(keys.name(k, 0, weights_epoch("new weights")) != r0);  // another epoch, another name
  CHECK(SharedKeys(c, 4).name(k, 0, 0) == r0);  // the same secret and config: the same names
  CHECK(SharedKeys(c, 2).name(k, 0, 0) != r0);
  // Another secret: other names for the same key.
  const OtherSecret other("another fleet's secret, 32 bytes");
  c.secret_file = other.path;
  CHECK(SharedKeys(c, 4).name(k, 0, 0) != r0);
}

TEST_CASE("Shared keys: the secret comes from a file or the environment, or insecure is said",
          "[shared_tier]") {
  SharedTierConfig c;
  c.nodes = "127.0.0.1:1";
  c.name = "m";
  c.secret_env = "KVOFFLOAD_TEST_SECRET_NOBODY_SETS";
  CHECK_THROWS_WITH(SharedKeys(c, 1), Catch::Matchers::ContainsSubstring("no fleet secret") &&
                                          Catch::Matchers::ContainsSubstring("insecure"));
  c.insecure = true;
  const SharedKeys insecure(c, 1);
  CHECK_FALSE(insecure.secure());
  const OtherSecret short_secret("fifteen bytes!!");
  c.secret_file = short_secret.path;
  CHECK_THROWS_WITH(SharedKeys(c, 1), Catch::Matchers::ContainsSubstring("15 bytes; at least 16"));
  c.secret_file = "/nonexistent/secret";
  CHECK_THROWS_WITH(SharedKeys(c, 1), Catch::Matchers::ContainsSubstring("/nonexistent/secret"));
  // One trailing newline is not part of the secret: echo's file and printf's give one key.
  const OtherSecret with_newline("sixteen bytes ok\n");
  c.secret_file = with_newline.path;
  const std::string a = SharedKeys(c, 1).name(key(1), 0, 0);
  {
    const OtherSecret without("sixteen bytes ok");
    c.secret_file = without.path;
    CHECK(SharedKeys(c, 1).name(key(1), 0, 0) == a);
  }
  // The environment: the variable secret_env names (insecure is not needed then).
  c.secret_file.clear();
  c.insecure = false;
  c.secret_env = "PATH";  // set in every test environment, and long enough
  REQUIRE(std::getenv("PATH") != nullptr);
  REQUIRE(std::string(std::getenv("PATH")).size() >= 16);
  CHECK(SharedKeys(c, 1).secure());
  CHECK(SharedKeys(c, 1).name(key(1), 0, 0) != insecure.name(key(1), 0, 0));
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
  const SharedKeys names(config(name), 2);
  const auto name_of = [&](std::size_t i) { return names.name(keys[i], 0, 0); };
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
  // The same key under other weights (another epoch): another name, a miss without reading.
  TierJob new_weights = job(9, JobKind::promote, {keys[0]}, {14});
  new_weights.epoch = weights_epoch("other weights");
  CHECK_FALSE(run(tier, new_weights).ok);
  CHECK(tier.shared_stats().read_misses == 2);
  CHECK(tier.shared_stats().bad_values == 2);
  // A value marked partly written (valid_from at header offset 64 not 0): refused, the tier
  // holds whole blocks only (SEMANTICS 6.8), and the MAC covers the header.
  REQUIRE(cli("-c SETRANGE '" + name_of(0) + "' 64 1") != "");
  CHECK_FALSE(run(tier, job(7, JobKind::promote, {keys[0]}, {15})).ok);
  CHECK(tier.shared_stats().bad_values == 3);
  // Jobs with lists that do not match are refused before anything runs.
  CHECK_THROWS_AS(tier.submit(job(4, JobKind::promote, keys, {1})), invalid_argument);
  CHECK_THROWS_AS(tier.submit(job(5, JobKind::promote, {keys[0]}, {99})), invalid_argument);
  // A hash shorter than 16 bytes is refused, naming the job and the block.
  const std::uint8_t short_hash[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  CHECK_THROWS_WITH(tier.submit(job(8, JobKind::write,
                                    {keys[0], Key{BlockHash::from_bytes(short_hash), 0}}, {0, 1})),
                    Catch::Matchers::ContainsSubstring("tier job 8: block 1's hash is 8 bytes"));
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

TEST_CASE("Shared tier: values forged or moved by a writer without the fleet secret are misses",
          "[cluster]") {
  const std::string name = "poison-" + std::to_string(std::random_device{}());
  Pool pool(16);
  std::mt19937_64 rng(7);
  for (auto& b : pool.bytes) b = static_cast<std::byte>(rng());
  const auto host = [&](HostBlockId id) { return pool.block(id); };
  SharedTier tier(config(name), 1, "layout", kBlockBytes, host);
  const std::vector<Key> keys = {key(11), key(12), key(13), key(14), key(15)};
  REQUIRE(run(tier, job(1, JobKind::write, keys, {0, 1, 2, 3, 4})).ok);
  const SharedKeys names(config(name), 1);

  // A writer of another fleet (its own secret, the same name and layout) writes block 5's
  // bytes for key 2: a well-formed value, its MAC under the wrong key. Same for the public
  // insecure secret (block 6 for key 3).
  const OtherSecret other("the secret of somebody else's fleet");
  SharedTierConfig foreign = config(name);
  foreign.secret_file = other.path;
  SharedTier forger(foreign, 1, "layout", kBlockBytes, host);
  REQUIRE(run(forger, job(2, JobKind::write, {keys[2]}, {5})).ok);
  SharedTierConfig public_secret = config(name);
  public_secret.secret_file.clear();
  public_secret.secret_env.clear();
  public_secret.insecure = true;
  SharedTier insecure(public_secret, 1, "layout", kBlockBytes, host);
  REQUIRE(run(insecure, job(3, JobKind::write, {keys[3]}, {6})).ok);

  // What a plain client (GET and SET, no secret) does with them.
  ClusterClient client(kvoffload::test::cluster_config());
  const auto get = [&](const std::string& k) {
    std::string value;
    const ClusterCommand c{.key = k, .args = {"GET", k}, .max_reply_bytes = 1 << 20};
    client.run(std::span(&c, 1), [&](std::size_t, const ClusterReply& r) {
      REQUIRE(r.kind == ClusterReplyKind::string);
      value = r.text;
    });
    REQUIRE(value.size() == shared_value_header_bytes + kBlockBytes);
    return value;
  };
  const auto set = [&](const std::string& k, const std::string& v) {
    const ClusterCommand c{.key = k, .args = {"SET", k, v}};
    client.run(std::span(&c, 1), [&](std::size_t, const ClusterReply& r) {
      REQUIRE(r.kind == ClusterReplyKind::status);
    });
  };
  // Key 0's valid value moved to key 1 (a replay of another prompt's KV).
  set(names.name(keys[1], 0, 0), get(names.name(keys[0], 0, 0)));
  // The forged values copied over the fleet's keys 2 and 3.
  set(names.name(keys[2], 0, 0), get(SharedKeys(foreign, 1).name(keys[2], 0, 0)));
  set(names.name(keys[3], 0, 0), get(SharedKeys(public_secret, 1).name(keys[3], 0, 0)));
  // Key 4's payload changed, nothing recomputed (nothing can be without the secret).
  std::string v4 = get(names.name(keys[4], 0, 0));
  v4[shared_value_header_bytes + 100] = static_cast<char>(v4[shared_value_header_bytes + 100] ^ 1);
  set(names.name(keys[4], 0, 0), v4);

  const FinishedTierJob f = run(tier, job(4, JobKind::promote, keys, {8, 9, 10, 11, 12}));
  CHECK_FALSE(f.ok);
  CHECK(f.failed_blocks == 4);  // key 0 is still its own, and only it is a hit
  CHECK(std::memcmp(pool.block(8).data(), pool.block(0).data(), kBlockBytes) == 0);
  const SharedTierStats s = tier.shared_stats();
  CHECK(s.reads == 1);
  CHECK(s.bad_values == 4);
  CHECK(s.read_misses == 0);
  // The forgers' own tiers refuse the fleet's values too: no secret, no reads.
  CHECK_FALSE(run(forger, job(5, JobKind::promote, {keys[0]}, {13})).ok);
  CHECK(forger.shared_stats().reads == 0);

  // Key 0's valid value (old weights) copied under key 0's name for new weights: only the
  // MAC over the name can tell, and it does.
  const std::uint64_t new_weights = weights_epoch("new weights");
  set(names.name(keys[0], 0, new_weights), get(names.name(keys[0], 0, 0)));
  TierJob promote = job(6, JobKind::promote, {keys[0]}, {14});
  promote.epoch = new_weights;
  CHECK_FALSE(run(tier, promote).ok);
  CHECK(tier.shared_stats().bad_values == 5);
  // The header's per-write nonce (it picks the payload's one-time MAC key), the tag's first or
  // last byte, or a byte of the zeros after the tag changed: each refused.
  const Key k5 = key(16);
  REQUIRE(run(tier, job(7, JobKind::write, {k5}, {1})).ok);
  const std::string good = get(names.name(k5, 0, 0));
  for (const std::size_t at : {std::size_t{16}, std::size_t{31}, std::size_t{80}, std::size_t{95},
                               shared_value_header_bytes - 1}) {
    std::string changed = good;
    changed[at] = static_cast<char>(changed[at] ^ 1);
    set(names.name(k5, 0, 0), changed);
    CHECK_FALSE(run(tier, job(8 + at, JobKind::promote, {k5}, {15})).ok);
  }
  CHECK(tier.shared_stats().bad_values == 10);
  set(names.name(k5, 0, 0), good);  // and put back, a hit again
  REQUIRE(run(tier, job(300, JobKind::promote, {k5}, {15})).ok);
  CHECK(std::memcmp(pool.block(15).data(), pool.block(1).data(), kBlockBytes) == 0);
  // Two writes of one block differ in nonce and tag: no two share a one-time key.
  REQUIRE(run(tier, job(301, JobKind::write, {k5}, {1})).ok);
  const std::string again = get(names.name(k5, 0, 0));
  CHECK(again.compare(16, 16, good, 16, 16) != 0);
  CHECK(again.compare(80, 16, good, 80, 16) != 0);
  CHECK(again.compare(shared_value_header_bytes, std::string::npos, good,
                      shared_value_header_bytes) == 0);
  // A value carries no block hash: whoever can read values learns no prompt hash either.
  const std::string value = get(names.name(keys[0], 0, 0));
  const std::string hash(reinterpret_cast<const char*>(keys[0].hash.data()), keys[0].hash.size());
  CHECK(value.find(hash) == std::string::npos);
}

TEST_CASE("Shared tier: only_seeds keeps every connection on the listed nodes", "[cluster]") {
  // Only the cluster's first master is listed: blocks whose slots the others own fail (the
  // map names them, but they are not to be reached), the first master's are written. The keys
  // are picked, by a client that sees the whole map, six on the seed and six elsewhere: the
  // namespace is random, and twelve keys left to chance all missed the seed once in CI.
  Pool pool(16);
  SharedTierConfig c = config("only-seeds-" + std::to_string(std::random_device{}()));
  c.only_seeds = true;
  const SharedKeys names(c, 1);
  ClusterClient probe(kvoffload::test::cluster_config());
  REQUIRE(probe.refresh());
  std::vector<Key> on_seed, elsewhere;
  for (int i = 0; i < 400 && (on_seed.size() < 6 || elsewhere.size() < 6); ++i) {
    const Key k = key(500 + i);
    const bool seed =
        probe.owner_of(cluster_key_slot(names.name(k, 0, 0))) == kvoffload::test::cluster_seed();
    std::vector<Key>& side = seed ? on_seed : elsewhere;
    if (side.size() < 6) side.push_back(k);
  }
  REQUIRE(on_seed.size() == 6);
  REQUIRE(elsewhere.size() == 6);
  SharedTier tier(c, 1, "layout", kBlockBytes, [&](HostBlockId id) { return pool.block(id); });
  std::vector<Key> keys = on_seed;
  keys.insert(keys.end(), elsewhere.begin(), elsewhere.end());
  std::vector<HostBlockId> hosts;
  for (int i = 0; i < 12; ++i) hosts.push_back(i);
  CHECK_FALSE(run(tier, job(1, JobKind::write, keys, hosts)).ok);
  const SharedTierStats s = tier.shared_stats();
  CHECK(s.writes == 6);
  CHECK(s.connect_errors >= 1);
}
