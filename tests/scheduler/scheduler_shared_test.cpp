// docs/semantics.md "Tiers", the shared tier, on the scheduler's side: existence checks asked
// without waiting (retry later meanwhile), promotion of the keys found, write-through, and
// failures that end as misses. The cluster is replaced by a PresenceCheck the test answers.

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "kvoffload/error.hpp"
#include "kvoffload/tiers/shared_presence.hpp"
#include "support/scheduler_fixture.hpp"

using namespace kvtest;

namespace {

/// Records the checks; the test decides when and what they answer.
class FakePresence final : public PresenceCheck {
 public:
  void submit(std::uint64_t ticket, std::uint64_t epoch, std::vector<Key> keys) override {
    if (throw_on_submit) throw std::runtime_error("cluster unreachable");
    asked.emplace_back(ticket, std::move(keys));
    epochs.push_back(epoch);
  }
  std::vector<PresenceAnswer> poll() override {
    std::vector<PresenceAnswer> out;
    out.swap(ready);
    return out;
  }
  /// Answers check `i`: the keys in `present` are there.
  void answer(std::size_t i, const std::vector<Key>& present) {
    PresenceAnswer a{asked.at(i).first, {}};
    for (const Key& k : asked[i].second) {
      a.present.push_back(std::find(present.begin(), present.end(), k) != present.end());
    }
    ready.push_back(std::move(a));
  }
  std::vector<std::pair<std::uint64_t, std::vector<Key>>> asked;
  std::vector<std::uint64_t> epochs;  // of each check asked
  std::vector<PresenceAnswer> ready;
  bool throw_on_submit = false;
};

std::vector<Key> keys_of(const std::vector<BlockHash>& hashes, std::uint32_t g = 0) {
  std::vector<Key> out;
  for (const BlockHash& h : hashes) out.push_back(Key{h, g});
  return out;
}

struct Shared {
  explicit Shared(std::int64_t host_blocks = 8) : presence(std::make_shared<FakePresence>()) {
    SchedulerConfig c = make_config({full()}, 1, host_blocks);
    TierConfig t;
    t.medium = Medium::shared;
    t.blocks = 64;
    c.tiers.push_back(t);
    h = std::make_unique<Harness>(c, SchedulerServices{{presence}});
  }
  std::vector<TierJob> tier_jobs() { return h->s.build_step({}).tier_jobs; }
  void complete(const TierJob& job, bool ok = true) {
    (void)h->s.on_completed(std::vector<JobReport>{{job.id, 1, ok}});
  }
  std::shared_ptr<FakePresence> presence;
  std::unique_ptr<Harness> h;
};

/// Tier 0 a disk of 8 slots, tier 1 the shared tier; 8 host blocks.
SchedulerConfig disk_and_shared() {
  SchedulerConfig c = make_config({full()}, 1, 8);
  TierConfig disk;
  disk.blocks = 8;
  TierConfig shared;
  shared.medium = Medium::shared;
  shared.blocks = 64;
  c.tiers = {disk, shared};
  return c;
}

/// Tier 1's presence check is `presence`.
SchedulerServices shared_second(std::shared_ptr<FakePresence> presence) {
  return SchedulerServices{{nullptr, std::move(presence)}};
}

}  // namespace

TEST_CASE("Disk tiers come before shared ones", "[scheduler][shared]") {
  SchedulerConfig c = disk_and_shared();
  CHECK_NOTHROW(Scheduler(c, shared_second(std::make_shared<FakePresence>())));
  std::swap(c.tiers[0], c.tiers[1]);
  CHECK_THROWS_WITH(
      Scheduler(c, SchedulerServices{{std::make_shared<FakePresence>()}}),
      Catch::Matchers::ContainsSubstring("tiers[1].medium: disk after a shared tier"));
}

TEST_CASE("A shared tier needs a presence check, and only a shared tier has one",
          "[scheduler][shared]") {
  SchedulerConfig c = make_config({full()}, 1, 8);
  TierConfig t;
  t.medium = Medium::shared;
  t.blocks = 8;
  c.tiers.push_back(t);
  CHECK_THROWS_WITH(Scheduler(c), Catch::Matchers::ContainsSubstring(
                                      "services.presence[0]: tier 0 is a shared tier"));
  CHECK_NOTHROW(Scheduler(c, SchedulerServices{{std::make_shared<FakePresence>()}}));
  c.tiers[0].medium = Medium::disk;
  CHECK_THROWS_WITH(Scheduler(c, SchedulerServices{{std::make_shared<FakePresence>()}}),
                    Catch::Matchers::ContainsSubstring(
                        "services.presence[0]: tier 0 is a disk tier; only a shared tier"));
  CHECK_THROWS_WITH(
      Scheduler(c, SchedulerServices{{nullptr, std::make_shared<FakePresence>()}}),
      Catch::Matchers::ContainsSubstring("services.presence: 2 entries for 1 tier(s)"));
}

TEST_CASE("A tier's store must be of its medium, and services start only from a whole config",
          "[scheduler][shared]") {
  SchedulerConfig c = disk_and_shared();
  c.tiers[1].store = DiskTierConfig{};
  CHECK_THROWS_WITH(c.validate(), Catch::Matchers::ContainsSubstring(
                                      "tiers[1].store: a disk tier's store, but the tier's "
                                      "medium is shared"));
  c.tiers[1].store.reset();
  CHECK_THROWS_WITH(make_scheduler_services(c),
                    Catch::Matchers::ContainsSubstring("tiers[1].store: a shared tier's presence "
                                                       "checks need its cluster"));
  // A disk tier needs no service: the services of a config without shared tiers are empty.
  c.tiers.pop_back();
  const SchedulerServices none = make_scheduler_services(c);
  REQUIRE(none.presence.size() == 1);
  CHECK(none.presence[0] == nullptr);
}

TEST_CASE("Keys missed in host memory are checked once, without waiting, then promoted",
          "[scheduler][shared]") {
  Shared t;
  const auto a = chain_hashes("a", 4);
  // Unknown keys: the check starts and the lookup says retry later; it stays so (no second
  // check) while the answer is out, and steps run meanwhile.
  CHECK_FALSE(t.h->lookup("r", a, 65, 0).has_value());
  REQUIRE(t.presence->asked.size() == 1);
  CHECK(t.presence->asked[0].second == keys_of(a));
  for (int i = 0; i < 3; ++i) {
    CHECK_FALSE(t.h->s.lookup("r", 0).has_value());
    CHECK(t.tier_jobs().empty());
  }
  CHECK(t.presence->asked.size() == 1);
  // Three of the four are in the cluster: the prefix of three is promoted.
  t.presence->answer(0, keys_of({a[0], a[1], a[2]}));
  CHECK_FALSE(t.h->s.lookup("r", 0).has_value());
  const auto jobs = t.tier_jobs();
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].kind == JobKind::promote);
  CHECK(jobs[0].tier == 0);  // the only tier, the shared one
  CHECK(jobs[0].request_id == "r");
  CHECK(jobs[0].keys == keys_of({a[0], a[1], a[2]}));
  t.complete(jobs[0]);
  CHECK(t.h->s.lookup("r", 0) == 48);
  const TierStats s = t.h->s.tier_stats(0);
  CHECK(s.presence_checks == 1);
  CHECK(s.presence_hits == 3);
  CHECK(s.presence_misses == 1);
  CHECK(s.promotions == 3);
  CHECK(t.presence->asked.size() == 1);
}

TEST_CASE("Keys the cluster lacks are misses for the request, asked no more",
          "[scheduler][shared]") {
  Shared t;
  const auto a = chain_hashes("a", 2);
  CHECK_FALSE(t.h->lookup("r", a, 33, 0).has_value());
  t.presence->answer(0, {});
  CHECK(t.h->s.lookup("r", 0) == 0);
  CHECK(t.h->s.lookup("r", 0) == 0);
  CHECK(t.presence->asked.size() == 1);
  // Another request asks for itself.
  CHECK_FALSE(t.h->lookup("q", a, 33, 0).has_value());
  CHECK(t.presence->asked.size() == 2);
}

TEST_CASE("A check that cannot start is a miss and a counter, never a stuck request",
          "[scheduler][shared]") {
  Shared t;
  t.presence->throw_on_submit = true;
  CHECK(t.h->lookup("r", chain_hashes("a", 2), 33, 0) == 0);
  CHECK(t.h->s.tier_stats(0).presence_failures == 1);
}

TEST_CASE("Stores are written through to the shared tier and then need no check",
          "[scheduler][shared]") {
  Shared t(4);
  const auto a = chain_hashes("a", 4);
  // The first request: its check finds nothing; it computes and stores its blocks.
  CHECK_FALSE(t.h->lookup("r", a, 65, 0).has_value());
  t.presence->answer(0, {});
  REQUIRE(t.h->s.lookup("r", 0) == 0);
  t.h->alloc_none("r");
  StepResult st = t.h->step("r", 0, 65, {ids(1, 5)});
  REQUIRE(st.store_jobs.size() == 1);
  t.h->complete(st.store_jobs[0].id);
  auto jobs = t.tier_jobs();
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].kind == JobKind::write);
  CHECK(jobs[0].tier == 0);  // the only tier, the shared one
  CHECK(jobs[0].keys == keys_of(a));
  CHECK(jobs[0].host_block_ids == st.store_jobs[0].host_block_ids);
  t.complete(jobs[0]);
  t.h->s.on_finished("r");
  // Host memory loses a (b fills it); a new request for a is promoted with no check asked.
  const auto b = chain_hashes("b", 4);
  CHECK_FALSE(t.h->lookup("b", b, 65, 0).has_value());
  t.presence->answer(1, {});
  REQUIRE(t.h->s.lookup("b", 0) == 0);
  t.h->alloc_none("b");
  st = t.h->step("b", 0, 65, {ids(10, 5)});
  REQUIRE(st.store_jobs.size() == 1);
  t.h->complete(st.store_jobs[0].id);
  t.complete(t.tier_jobs().at(0));
  REQUIRE(t.h->s.manager().peek(Key{a[0], 0}) == LookupResult::miss);
  CHECK_FALSE(t.h->lookup("c", a, 65, 0).has_value());
  CHECK(t.presence->asked.size() == 2);
  jobs = t.tier_jobs();
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].kind == JobKind::promote);
  CHECK(jobs[0].keys == keys_of(a));
}

TEST_CASE("A promotion that fails (the key evicted since the check) ends in a miss",
          "[scheduler][shared]") {
  Shared t;
  const auto a = chain_hashes("a", 2);
  CHECK_FALSE(t.h->lookup("r", a, 33, 0).has_value());
  t.presence->answer(0, keys_of(a));
  CHECK_FALSE(t.h->s.lookup("r", 0).has_value());
  const auto jobs = t.tier_jobs();
  REQUIRE(jobs.size() == 1);
  t.complete(jobs[0], false);
  CHECK(t.h->s.lookup("r", 0) == 0);
  CHECK(t.h->s.tier_stats(0).failed_promotions == 2);
  CHECK(t.h->s.tier_index(0).peek(Key{a[0], 0}) == LookupResult::miss);
}

TEST_CASE("reset_cache drops the answers in flight; requests ask again", "[scheduler][shared]") {
  Shared t;
  const auto a = chain_hashes("a", 2);
  CHECK_FALSE(t.h->lookup("r", a, 33, 0).has_value());
  t.h->s.reset_cache("new weights");
  t.presence->answer(0, keys_of(a));  // about the old cache: ignored
  CHECK_FALSE(t.h->s.lookup("r", 0).has_value());
  REQUIRE(t.presence->asked.size() == 2);
  CHECK(t.h->s.tier_index(0).peek(Key{a[0], 0}) == LookupResult::miss);
  t.presence->answer(1, {});
  CHECK(t.h->s.lookup("r", 0) == 0);
}

TEST_CASE("Tiers are asked in order: host, disk, then the shared tier", "[scheduler][shared]") {
  auto presence = std::make_shared<FakePresence>();
  Harness h(disk_and_shared(), shared_second(presence));
  const auto a = chain_hashes("a", 4);
  // On disk: a[1] and a[2]; in host memory: a[0]; the shared tier has all four.
  std::vector<std::optional<Key>> slots = {Key{a[1], 0}, Key{a[2], 0}};
  REQUIRE(h.s.restore_tier(0, slots) == 2);
  h.place(a, 0, 0);
  CHECK_FALSE(h.lookup("r", a, 65, 0).has_value());
  // Only the key neither host memory nor the disk has is asked for.
  REQUIRE(presence->asked.size() == 1);
  CHECK(presence->asked[0].second == keys_of({a[3]}));
  presence->answer(0, keys_of(a));
  CHECK_FALSE(h.s.lookup("r", 0).has_value());
  std::vector<TierJob> jobs;
  for (TierJob& j : h.s.build_step({}).tier_jobs) {
    // a[0]'s write-through to both tiers goes out too; then the promotions.
    if (j.kind == JobKind::promote) jobs.push_back(std::move(j));
  }
  REQUIRE(jobs.size() == 2);
  CHECK(jobs[0].tier == 0);  // the disk
  CHECK(jobs[0].keys == keys_of({a[1], a[2]}));
  CHECK(jobs[1].tier == 1);  // the shared tier
  CHECK(jobs[1].keys == keys_of({a[3]}));
  for (const TierJob& j : jobs) (void)h.s.on_completed(std::vector<JobReport>{{j.id, 1, true}});
  CHECK(h.s.lookup("r", 0) == 64);
}

TEST_CASE("A block promoted from the shared tier is written to the disk, not back to the cluster",
          "[scheduler][shared]") {
  auto presence = std::make_shared<FakePresence>();
  Harness h(disk_and_shared(), shared_second(presence));
  const auto a = chain_hashes("a", 3);
  // a[0] on disk; the cluster has all three.
  std::vector<std::optional<Key>> slots = {Key{a[0], 0}};
  REQUIRE(h.s.restore_tier(0, slots) == 1);
  CHECK_FALSE(h.lookup("r", a, 49, 0).has_value());
  presence->answer(0, keys_of(a));
  CHECK_FALSE(h.s.lookup("r", 0).has_value());
  std::vector<TierJob> promotions = h.s.build_step({}).tier_jobs;
  REQUIRE(promotions.size() == 2);
  REQUIRE(promotions[1].tier == 1);  // the shared tier
  REQUIRE(promotions[1].keys == keys_of({a[1], a[2]}));

  SECTION("both succeed: the shared tier's blocks go to the disk, nothing to the cluster") {
    for (const TierJob& j : promotions) {
      (void)h.s.on_completed(std::vector<JobReport>{{j.id, 1, true}});
    }
    const std::vector<TierJob> writes = h.s.build_step({}).tier_jobs;
    REQUIRE(writes.size() == 1);
    CHECK(writes[0].kind == JobKind::write);
    CHECK(writes[0].tier == 0);
    CHECK(writes[0].keys == keys_of({a[1], a[2]}));
    CHECK(writes[0].host_block_ids == promotions[1].host_block_ids);
    (void)h.s.on_completed(std::vector<JobReport>{{writes[0].id, 1, true}});
    CHECK(h.s.tier_index(0).peek(Key{a[2], 0}) == LookupResult::hit);
    CHECK(h.s.tier_stats(0).blocks_written == 2);
    CHECK(h.s.tier_stats(1).write_jobs == 0);
    CHECK(h.s.lookup("r", 0) == 48);
  }
  SECTION("the shared promotion fails: nothing is written anywhere") {
    (void)h.s.on_completed(std::vector<JobReport>{{promotions[0].id, 1, true}});
    (void)h.s.on_completed(std::vector<JobReport>{{promotions[1].id, 1, false}});
    CHECK(h.s.build_step({}).tier_jobs.empty());
    CHECK(h.s.tier_stats(0).write_jobs == 0);
    CHECK(h.s.tier_stats(1).write_jobs == 0);
    CHECK(h.s.lookup("r", 0) == 16);
  }
}

TEST_CASE("Checks and tier jobs carry the weights' epoch; reset_cache moves every tier to new ones",
          "[scheduler][shared]") {
  auto presence = std::make_shared<FakePresence>();
  SchedulerConfig c = disk_and_shared();
  c.weights = "checkpoint 1";
  Harness h(c, shared_second(presence));
  const std::uint64_t w1 = weights_epoch("checkpoint 1"), w2 = weights_epoch("checkpoint 2");
  CHECK(w1 != w2);
  CHECK(weights_epoch("") == 0);
  CHECK(h.s.epoch() == w1);
  const auto a = chain_hashes("a", 2);
  // a[0] on disk (restored), a[1] asked of the shared tier: under w1.
  std::vector<std::optional<Key>> slots = {Key{a[0], 0}};
  REQUIRE(h.s.restore_tier(0, slots) == 1);
  CHECK_FALSE(h.lookup("r", a, 33, 0).has_value());
  REQUIRE(presence->asked.size() == 1);
  CHECK(presence->epochs[0] == w1);
  presence->answer(0, keys_of({a[1]}));
  CHECK_FALSE(h.s.lookup("r", 0).has_value());
  const std::vector<TierJob> jobs = h.s.build_step({}).tier_jobs;
  REQUIRE(jobs.size() == 2);  // the disk's and the shared tier's promotions
  for (const TierJob& j : jobs) CHECK(j.epoch == w1);

  // New weights: nothing of the old ones is found in any tier, in this very call; the
  // shared tier is asked again under the new epoch, and what the tiers get is tagged with it.
  h.s.reset_cache("checkpoint 2");
  CHECK(h.s.epoch() == w2);
  CHECK(h.s.tier_index(0).peek(Key{a[0], 0}) == LookupResult::miss);
  CHECK_FALSE(h.lookup("q", a, 33, 0).has_value());
  REQUIRE(presence->asked.size() == 2);
  CHECK(presence->epochs[1] == w2);
  CHECK(presence->asked[1].second == keys_of(a));  // a[0] too: the disk no longer has it
  presence->answer(1, {});
  CHECK(h.s.lookup("q", 0) == 0);

  // Without an identity, or with the empty one (the config's default, epoch 0: what every
  // identity-less engine shares), a reset would leave old blocks reachable: refused.
  CHECK_THROWS_WITH(h.s.reset_cache(), Catch::Matchers::ContainsSubstring("reset_cache(weights)"));
  CHECK_THROWS_WITH(h.s.reset_cache(""), Catch::Matchers::ContainsSubstring("weights is empty"));
  CHECK(h.s.epoch() == w2);
}

TEST_CASE("Tier admission counts a request once, however often it is asked again",
          "[scheduler][shared]") {
  // With a shared tier a new request's lookup answers "retry later" while its check runs: a
  // single-use request asked five times must not reach the disk's threshold of 2.
  auto presence = std::make_shared<FakePresence>();
  SchedulerConfig c = disk_and_shared();
  c.tiers[0].store_threshold = 2;
  Harness h(c, shared_second(presence));
  const auto a = chain_hashes("a", 2);
  CHECK_FALSE(h.lookup("r", a, 33, 0).has_value());
  for (int i = 0; i < 4; ++i) CHECK_FALSE(h.s.lookup("r", 0).has_value());
  presence->answer(0, {});
  REQUIRE(h.s.lookup("r", 0) == 0);
  h.alloc_none("r");
  const StepResult st = h.step("r", 0, 33, {ids(10, 3)});
  REQUIRE(st.store_jobs.size() == 1);
  h.complete(st.store_jobs[0].id);
  std::vector<std::uint32_t> written_to;
  for (const TierJob& j : h.s.build_step({}).tier_jobs) {
    if (j.kind == JobKind::write) written_to.push_back(j.tier);
  }
  CHECK(written_to == std::vector<std::uint32_t>{1});  // the shared tier (no threshold) only
  CHECK(h.s.tier_stats(0).writes_skipped == 2);
  // A second request with the same prefix is the second lookup: the disk admits a[0] now.
  REQUIRE(h.lookup("q", a, 33, 0) == 32);
  written_to.clear();
  for (const TierJob& j : h.s.build_step({}).tier_jobs) {
    if (j.kind == JobKind::write) written_to.push_back(j.tier);
  }
  CHECK(written_to == std::vector<std::uint32_t>{0});
}

TEST_CASE("Keys a check could not answer are misses counted as an outage", "[scheduler][shared]") {
  Shared t;
  const auto a = chain_hashes("a", 3);
  CHECK_FALSE(t.h->lookup("r", a, 49, 0).has_value());
  REQUIRE(t.presence->asked.size() == 1);
  PresenceAnswer down{t.presence->asked[0].first, {false, false, false}, 3};
  t.presence->ready.push_back(down);
  CHECK(t.h->s.lookup("r", 0) == 0);
  const TierStats s = t.h->s.tier_stats(0);
  CHECK(s.presence_misses == 3);
  CHECK(s.presence_errors == 3);
  CHECK(s.presence_hits == 0);
}
