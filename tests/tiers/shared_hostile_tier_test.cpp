// The shared tier and the synthetic engine against a hostile node of our own
// (tests/support/hostile_server.hpp): a node that drip-feeds every reply must cost the engine
// misses, never its progress; a promotion waited on ends within the deadline; the tier's
// shutdown is bounded whatever the node does. No real cluster: label unit.

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kvoffload/tiers/shared_keys.hpp"
#include "kvoffload/tiers/shared_presence.hpp"
#include "kvoffload/tiers/shared_tier.hpp"
#include "sim/synthetic_engine.hpp"
#include "support/hostile_server.hpp"
#include "support/shared_jobs.hpp"
#include "support/shared_secret.hpp"
#include "support/tier_pool.hpp"

using namespace kvoffload;
using kvoffload::test::HostileBehavior;
using kvoffload::test::HostileServer;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::uint64_t kBlockBytes = 4096;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// Every reply a byte each 250 ms, as the node: ":1\r\n" takes a second.
HostileBehavior dripping() {
  HostileBehavior b;
  b.reply.head = ":1\r\n";
  b.drip_ms = 250;
  return b;
}

kvsim::SimConfig engine_on(const std::string& nodes, unsigned seed) {
  kvsim::SimConfig c;
  c.seed = seed;
  c.shared_nodes = nodes;
  c.shared_name = std::string("hostile-") + std::to_string(seed);
  c.shared_insecure = true;
  c.shared_reply_timeout_ms = 300;
  c.check_invariants = true;
  return c;
}

SharedTierConfig store_on(const HostileServer& s, int reply_timeout_ms) {
  SharedTierConfig c;
  c.nodes = std::string("127.0.0.1:") + std::to_string(s.port());
  c.name = "hostile";
  c.insecure = true;
  c.only_seeds = true;
  c.reply_timeout_ms = reply_timeout_ms;
  return c;
}

}  // namespace

TEST_CASE("Hostile node: a drip-feeding node costs the engine misses, not progress",
          "[shared_tier]") {
  const unsigned seed = 1234;
  INFO("seed " << seed);
  constexpr int kSteps = 1500;
  // The control: the same engine against a port nobody listens on.
  std::int64_t finished_dead = 0;
  {
    kvsim::SyntheticEngine e(engine_on("127.0.0.1:1", seed));
    kvsim::SimReport r;
    for (int i = 0; i < kSteps; ++i) r = e.step();
    finished_dead = r.requests_finished;
  }
  REQUIRE(finished_dead > 0);
  HostileServer server(dripping());
  const auto start = Clock::now();
  std::optional<kvsim::SyntheticEngine> e;
  e.emplace(engine_on(std::string("127.0.0.1:") + std::to_string(server.port()), seed));
  kvsim::SimReport r;
  for (int i = 0; i < kSteps; ++i) r = e->step();
  CHECK(r.mismatches == 0);
  CHECK(r.invariant_violations == 0);
  CHECK(server.commands() > 0);  // the node was asked, and dripped
  // Deadlines, then the node skipped: about as much finished as with a dead port, give or
  // take the requests a check held back for a deadline (per-read timeouts finished none).
  CHECK(r.requests_finished >= finished_dead / 2);
  CHECK(r.shared_promotions == 0);
  const auto stop = Clock::now();
  e.reset();  // the tier and the presence thread stop within their bounds
  CHECK(seconds_since(stop) < 7.0);
  CHECK(seconds_since(start) < 60.0);
}

TEST_CASE("Hostile node: a promotion waited on ends at its deadline, and shutdown is bounded",
          "[shared_tier]") {
  kvtest::TierPool pool(64, kBlockBytes);
  {
    HostileBehavior b;
    b.reply.head =
        std::string("$") + std::to_string(shared_value_header_bytes + kBlockBytes) + "\r\n";
    b.reply.body = "v";
    b.reply.repeat = shared_value_header_bytes + kBlockBytes;
    b.reply.tail = "\r\n";
    b.drip_ms = 5;  // 4 KiB at 200 bytes/s: 20 s, each byte well inside any per-read timeout
    HostileServer server(b);
    SharedTier tier(store_on(server, 300), 1, "layout", kBlockBytes,
                    [&](HostBlockId id) { return pool.block(id); });
    const auto start = Clock::now();
    const FinishedTierJob p = kvoffload::test::run(
        tier, kvoffload::test::job(1, JobKind::promote, {kvtest::tier_key(1)}, {0}));
    CHECK_FALSE(p.ok);
    CHECK(seconds_since(start) < 1.5);
    CHECK(tier.shared_stats().timeouts == 1);
    CHECK(tier.shared_stats().read_errors == 1);
  }
  {
    // A node that drip-feeds and a long reply timeout: the destructor waits its grace for the
    // queued jobs (each batch one deadline, or none while the node is skipped), then cancels
    // what is left. Per-read timeouts never ended this.
    HostileBehavior b;
    b.reply.head = ":1\r\n";
    b.drip_ms = 1000;
    HostileServer server(b);
    std::optional<SharedTier> tier;
    tier.emplace(store_on(server, 3000), 1, "layout", kBlockBytes,
                 [&](HostBlockId id) { return pool.block(id); });
    for (int j = 0; j < 32; ++j) {
      tier->submit(kvoffload::test::job(j + 1, JobKind::promote, {kvtest::tier_key(j)},
                                        {static_cast<HostBlockId>(j)}));
    }
    const double grace = std::chrono::duration<double>(tier->shutdown_grace()).count();
    CHECK(grace < 10.0);
    const auto start = Clock::now();
    tier.reset();
    CHECK(seconds_since(start) < grace + 1.0);
  }
}

TEST_CASE("Hostile node: an ACL user without write access counts auth errors and says so",
          "[shared_tier]") {
  kvtest::TierPool pool(4, kBlockBytes);
  HostileBehavior b;
  b.reply.head = "-NOPERM User ro has no permissions to run the 'set' command\r\n";
  HostileServer server(b);
  SharedTier tier(store_on(server, 1000), 1, "layout", kBlockBytes,
                  [&](HostBlockId id) { return pool.block(id); });
  const FinishedTierJob w = kvoffload::test::run(
      tier,
      kvoffload::test::job(1, JobKind::write, {kvtest::tier_key(1), kvtest::tier_key(2)}, {0, 1}));
  CHECK_FALSE(w.ok);
  const SharedTierStats s = tier.shared_stats();
  CHECK(s.write_errors == 2);
  CHECK(s.auth_errors == 2);
  CHECK(s.io_errors == 0);  // the connection is fine: the user is not
}

TEST_CASE("Hostile node: an existence check on a silent node does not hold back the others",
          "[shared_tier]") {
  // Slots 0-8191 on a node that never answers, the rest on one that answers "present". Check
  // 1 asks only keys of the silent node; check 2, submitted while check 1 waits, only keys of
  // the other: check 2 is answered at once, check 1 at its deadline, as absent with errors.
  HostileBehavior quiet;
  quiet.stall = true;
  HostileServer silent(quiet);
  const auto entry = [](int first, int last, const std::string& port) {
    return std::string("*3\r\n:") + std::to_string(first) + std::string("\r\n:") +
           std::to_string(last) + "\r\n*2\r\n$9\r\n127.0.0.1\r\n:" + port + "\r\n";
  };
  HostileBehavior fast_b;
  fast_b.reply.head = ":1\r\n";
  fast_b.slots =
      "*2\r\n" + entry(0, 8191, std::to_string(silent.port())) + entry(8192, 16383, "PORT");
  HostileServer fast(fast_b);
  SharedTierConfig c = store_on(fast, 1000);
  c.only_seeds = false;
  const SharedKeys names(c, 1);
  std::vector<Key> on_silent, on_fast;
  for (int i = 0; on_silent.size() < 4 || on_fast.size() < 4; ++i) {
    const Key k = kvtest::tier_key(i);
    (cluster_key_slot(names.name(k, 0, 0)) < 8192 ? on_silent : on_fast).push_back(k);
  }
  on_silent.resize(4);
  on_fast.resize(4);
  const std::shared_ptr<PresenceCheck> presence = make_cluster_presence(c, 1);
  const auto start = Clock::now();
  presence->submit(1, 0, on_silent);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // check 1 is waiting now
  const double second_submitted = seconds_since(start);
  presence->submit(2, 0, on_fast);
  std::optional<PresenceAnswer> first, second;
  std::optional<double> first_at, second_at;
  for (int i = 0; i < 400 && !(first && second); ++i) {  // bounded: 4 s
    for (PresenceAnswer& a : presence->poll()) {
      (a.ticket == 1 ? first_at : second_at) = seconds_since(start);
      (a.ticket == 1 ? first : second) = std::move(a);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(first);
  REQUIRE(second);
  CHECK(*second_at - second_submitted < 0.5);
  CHECK(second->errors == 0);
  CHECK(second->present == std::vector<bool>(4, true));
  CHECK(*first_at >= 0.9);
  CHECK(first->errors == 4);
  CHECK(first->present == std::vector<bool>(4, false));
}

TEST_CASE("Hostile node: a promotion into a host block another is still filling is refused",
          "[shared_tier]") {
  // The first promotion waits on a silent node; a second job into its host block would race
  // it (the block reported filled with the other's bytes): refused until the first is done.
  kvtest::TierPool pool(4, kBlockBytes);
  HostileBehavior b;
  b.stall = true;
  HostileServer server(b);
  SharedTier tier(store_on(server, 1000), 1, "layout", kBlockBytes,
                  [&](HostBlockId id) { return pool.block(id); });
  using kvoffload::test::job;
  tier.submit(job(1, JobKind::promote, {kvtest::tier_key(1)}, {0}));
  CHECK_THROWS_WITH(
      tier.submit(job(2, JobKind::promote, {kvtest::tier_key(2)}, {0})),
      Catch::Matchers::ContainsSubstring("host block 0 is being filled by tier job 1"));
  CHECK_NOTHROW(tier.submit(job(3, JobKind::promote, {kvtest::tier_key(3)}, {1})));
  const std::vector<JobId> first{1, 3};
  tier.wait(first);
  CHECK(tier.get_finished().size() == 2);
  CHECK_NOTHROW(tier.submit(job(4, JobKind::promote, {kvtest::tier_key(2)}, {0})));  // free again
  const std::vector<JobId> last{4};
  tier.wait(last);
}
