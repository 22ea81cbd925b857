// docs/semantics.md "Tiers": write-through with admission and a bounded queue, promotion of the
// keys a lookup uses (prefix only, window blocks only), failures, tier eviction, reset and
// restore, on the scheduler's side (the tier's contents are its index).

#include <algorithm>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "kvoffload/error.hpp"
#include "support/tiered_fixture.hpp"

using namespace kvtest;

TEST_CASE("A completed store is written through to the tier, its host blocks pinned meanwhile",
          "[scheduler][tier]") {
  Tiered t(tiered({full()}, 8, 16));
  const auto a = chain_hashes("a", 4);
  const TransferJob store = t.store("a", a);
  const auto jobs = t.tier_jobs();
  REQUIRE(jobs.size() == 1);
  const TierJob& w = jobs[0];
  CHECK(w.kind == JobKind::write);
  CHECK(w.tier == 0);
  CHECK(w.keys == keys_of(a));
  CHECK(w.host_block_ids == store.host_block_ids);
  CHECK(w.slots == std::vector<std::int64_t>{0, 1, 2, 3});
  CHECK(t.in_tier(a[0]) == LookupResult::pending);
  for (const HostBlockId id : store.host_block_ids) CHECK(t.h.s.manager().readers(id) == 1);

  t.complete(w);
  for (const BlockHash& hash : a) CHECK(t.in_tier(hash) == LookupResult::hit);
  for (const HostBlockId id : store.host_block_ids) CHECK(t.h.s.manager().readers(id) == 0);
  const TierStats s = t.h.s.tier_stats(0);
  CHECK(s.blocks_written == 4);
  CHECK(s.blocks_used == 4);
  CHECK(s.write_jobs == 1);
  CHECK(t.h.s.num_jobs_in_flight() == 0);
  CHECK(t.tier_jobs().empty());  // written once
}

TEST_CASE("A pinned host block is not evicted while its tier write runs", "[scheduler][tier]") {
  Tiered t(tiered({full()}, 4, 16));
  const auto a = chain_hashes("a", 4);
  t.store("a", a);
  const auto jobs = t.tier_jobs();
  REQUIRE(jobs.size() == 1);
  // The host cache is full of a's pinned blocks: b finds no room until the write completes.
  const auto b = chain_hashes("b", 2);
  REQUIRE(t.h.lookup("b", b, 33, 0) == 0);
  t.h.alloc_none("b");
  CHECK(t.h.step("b", 0, 33, {ids(100, 3)}).store_jobs.empty());
  CHECK(t.h.s.cache_stats().stores_without_room == 1);
  for (const BlockHash& hash : a) CHECK(t.in_host(hash) == LookupResult::hit);
  t.complete(jobs[0]);
  CHECK(t.h.step("b", 33, 1, {{}}).store_jobs.size() == 1);
}

TEST_CASE("A key only in the tier is promoted before the lookup answers", "[scheduler][tier]") {
  Tiered t(tiered({full()}, 4, 16));
  const auto a = chain_hashes("a", 4);
  t.store("a", a);
  t.complete(t.tier_jobs().at(0));
  t.store("b", chain_hashes("b", 4));  // evicts a from host memory
  t.complete(t.tier_jobs().at(0));
  for (const BlockHash& hash : a) REQUIRE(t.in_host(hash) == LookupResult::miss);

  // c shares a's blocks: retry later, and the next step promotes all four. The lookup only
  // reserves the slots; host blocks are taken in the step (a lookup never evicts).
  CHECK_FALSE(t.h.lookup("c", a, 65, 0).has_value());
  for (const BlockHash& hash : a) CHECK(t.in_host(hash) == LookupResult::miss);
  CHECK(t.h.s.tier_index(0).num_being_read() == 4);
  CHECK_FALSE(t.h.s.lookup("c", 0).has_value());  // planned: still retry later
  const auto jobs = t.tier_jobs();
  for (const BlockHash& hash : a) CHECK(t.in_host(hash) == LookupResult::pending);
  REQUIRE(jobs.size() == 1);
  const TierJob& p = jobs[0];
  CHECK(p.kind == JobKind::promote);
  CHECK(p.request_id == "c");
  CHECK(p.keys == keys_of(a));
  CHECK(p.slots == std::vector<std::int64_t>{0, 1, 2, 3});
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(t.h.s.manager().block_of(p.keys[i]) == p.host_block_ids[i]);
  }
  CHECK(t.h.s.tier_index(0).num_being_read() == 4);  // not evicted from the tier meanwhile
  CHECK_FALSE(t.h.s.lookup("c", 0).has_value());     // still pending

  t.complete(p);
  CHECK(t.h.s.lookup("c", 0) == 64);
  const TierStats s = t.h.s.tier_stats(0);
  CHECK(s.promotions == 4);
  CHECK(s.promote_jobs == 1);
  CHECK(s.blocks_being_read == 0);
}

TEST_CASE("Promotion takes the prefix the lookup uses, not keys after a miss",
          "[scheduler][tier]") {
  Tiered t(tiered({full()}, 8, 16));
  const auto a = chain_hashes("a", 2);
  t.store("a", a);
  t.complete(t.tier_jobs().at(0));
  t.store("b", chain_hashes("b", 8));  // evicts a
  t.complete(t.tier_jobs().at(0));
  // d = a's two blocks, a block nobody has, then b's first block (in the tier).
  auto d = a;
  d.push_back(chain_hashes("none", 1)[0]);
  d.push_back(chain_hashes("b", 1)[0]);
  CHECK_FALSE(t.h.lookup("d", d, 65, 0).has_value());
  const auto jobs = t.tier_jobs();
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].keys == keys_of(a));
  t.complete(jobs[0]);
  CHECK(t.h.s.lookup("d", 0) == 32);
}

TEST_CASE("A windowed group promotes only the blocks its window needs", "[scheduler][tier]") {
  Tiered t(tiered({full(), mamba()}, 8, 16));
  const auto a = chain_hashes("a", 4);
  t.store("a", a);
  const auto writes = t.tier_jobs();
  REQUIRE(writes.size() == 1);
  CHECK(writes[0].keys.size() == 8);
  t.complete(writes[0]);
  t.store("b", chain_hashes("b", 4));  // 8 more keys: evicts a's
  t.complete(t.tier_jobs().at(0));

  // 64 tokens: the last one is recomputed, and a mamba block holds the state at its end, so
  // the hit ends at 48, the last whole block (the state at 63 is in no block).
  CHECK_FALSE(t.h.lookup("c", a, 64, 0).has_value());
  const auto jobs = t.tier_jobs();
  REQUIRE(jobs.size() == 1);
  std::vector<Key> expected = keys_of({a[0], a[1], a[2]}, 0);
  expected.push_back(Key{a[2], 1});  // mamba: the last block only
  CHECK(jobs[0].keys == expected);
  t.complete(jobs[0]);
  CHECK(t.h.s.lookup("c", 0) == 48);
  CHECK(t.in_host(a[0], 1) == LookupResult::miss);
}

TEST_CASE("A failed promotion is a miss and the tier forgets the keys", "[scheduler][tier]") {
  Tiered t(tiered({full()}, 4, 16));
  const auto a = chain_hashes("a", 4);
  t.store("a", a);
  t.complete(t.tier_jobs().at(0));
  t.store("b", chain_hashes("b", 4));
  t.complete(t.tier_jobs().at(0));
  CHECK_FALSE(t.h.lookup("c", a, 65, 0).has_value());
  t.complete(t.tier_jobs().at(0), false);
  for (const BlockHash& hash : a) {
    CHECK(t.in_host(hash) == LookupResult::miss);
    CHECK(t.in_tier(hash) == LookupResult::miss);
  }
  CHECK(t.h.s.lookup("c", 0) == 0);
  CHECK(t.h.s.tier_stats(0).failed_promotions == 4);
  const auto events = t.h.s.take_events();
  const bool removed_from_disk = std::any_of(events.begin(), events.end(), [&](const auto& e) {
    return e.removed && e.medium == Medium::disk && e.keys == keys_of(a);
  });
  CHECK(removed_from_disk);
}

TEST_CASE("Without host room for a promotion the answer is the host cache's", "[scheduler][tier]") {
  Tiered t(tiered({full()}, 4, 16));
  const auto a = chain_hashes("a", 4);
  t.store("a", a);
  t.complete(t.tier_jobs().at(0));
  const auto b = chain_hashes("b", 4);
  t.store("b", b);
  t.complete(t.tier_jobs().at(0));
  // A load of b keeps every host block read: nothing can be evicted.
  REQUIRE(t.h.lookup("r", b, 65, 0) == 64);
  t.h.s.on_allocated("r", std::vector<AllocatedGroup>{{ids(500, 5), 0}}, 64);
  CHECK_FALSE(t.h.lookup("c", a, 65, 0).has_value());  // planned
  CHECK(t.h.s.build_step({}).tier_jobs.empty());       // no room: nothing promoted
  CHECK(t.h.s.tier_stats(0).promotions_without_room == 4);
  CHECK(t.h.s.tier_index(0).num_being_read() == 0);  // the slots were released
  CHECK(t.h.s.lookup("c", 0) == 0);                  // one host-only answer
}

TEST_CASE("A lookup never evicts: a hit another lookup promised stays loadable",
          "[scheduler][tier]") {
  // Two requests are looked up before either is allocated (an engine may batch lookups).
  Tiered t(tiered({full()}, 4, 16));
  const auto a = chain_hashes("a", 4);
  t.store("a", a);
  t.complete(t.tier_jobs().at(0));
  const auto b = chain_hashes("b", 4);
  t.store("b", b);  // the host cache holds b, the tier a and b
  t.complete(t.tier_jobs().at(0));
  REQUIRE(t.h.lookup("rb", b, 65, 0) == 64);            // b: a host hit, promised
  CHECK_FALSE(t.h.lookup("ra", a, 65, 0).has_value());  // a: a promotion, planned
  // rb's allocation still finds every key it was promised.
  t.h.s.on_allocated("rb", std::vector<AllocatedGroup>{{ids(500, 5), 0}}, 64);
  // The step: b's blocks are being read by the load, so a's promotion finds no room.
  const StepResult st = t.h.s.build_step({});
  CHECK(st.load_jobs.size() == 1);
  CHECK(st.tier_jobs.empty());
}

TEST_CASE("Tier admission: a key is written once it was looked up store_threshold times",
          "[scheduler][tier]") {
  Tiered t(tiered({full()}, 8, 16, /*threshold=*/2));
  const auto a = chain_hashes("a", 2);
  t.store("a", a);  // looked up once: not admitted
  CHECK(t.tier_jobs().empty());
  CHECK(t.h.s.tier_stats(0).writes_skipped == 2);
  // The first lookup stopped at its first miss: a[0] was looked up once, a[1] never. A
  // second lookup (host hits) brings a[0] to the threshold: written through now.
  REQUIRE(t.h.lookup("c", a, 33, 0) == 32);
  auto jobs = t.tier_jobs();
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].keys == std::vector<Key>{Key{a[0], 0}});
  REQUIRE(t.h.lookup("d", a, 33, 0) == 32);
  jobs = t.tier_jobs();
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].keys == std::vector<Key>{Key{a[1], 0}});
}

TEST_CASE("A full write queue skips and counts, and never blocks a step", "[scheduler][tier]") {
  Tiered t(tiered({full()}, 8, 16, 0, /*queue=*/3));
  const auto a = chain_hashes("a", 4);
  t.store("a", a);
  auto jobs = t.tier_jobs();
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].keys.size() == 3);
  CHECK(t.h.s.tier_stats(0).writes_queue_full == 1);
  t.store("b", chain_hashes("b", 1));  // the queue is still full
  CHECK(t.tier_jobs().empty());
  CHECK(t.h.s.tier_stats(0).writes_queue_full == 2);
  t.complete(jobs[0]);
  t.store("e", chain_hashes("e", 1));
  CHECK(t.tier_jobs().size() == 1);
}

TEST_CASE("The tier evicts by its own policy, with events naming the disk", "[scheduler][tier]") {
  Tiered t(tiered({full()}, 8, 4));
  const auto a = chain_hashes("a", 4);
  t.store("a", a);
  t.complete(t.tier_jobs().at(0));
  const auto b = chain_hashes("b", 2);
  t.store("b", b);
  t.complete(t.tier_jobs().at(0));
  // LRU: a's two oldest slots went.
  CHECK(t.in_tier(a[0]) == LookupResult::miss);
  CHECK(t.in_tier(a[1]) == LookupResult::miss);
  CHECK(t.in_tier(a[2]) == LookupResult::hit);
  CHECK(t.in_tier(b[1]) == LookupResult::hit);
  CHECK(t.h.s.tier_stats(0).evictions == 2);
  const auto events = t.h.s.take_events();
  std::size_t disk_events = 0;
  for (const ManagerEvent& e : events) {
    if (e.medium != Medium::disk) continue;
    ++disk_events;
    if (e.removed) CHECK(e.keys == std::vector<Key>{Key{a[0], 0}, Key{a[1], 0}});
  }
  CHECK(disk_events == 3);  // stored a, removed a0 a1, stored b
}

TEST_CASE("reset_cache drops the tiers; restore_tier rebuilds one after a restart",
          "[scheduler][tier]") {
  Tiered t(tiered({full()}, 4, 16));
  const auto a = chain_hashes("a", 2);
  t.store("a", a);
  const auto jobs = t.tier_jobs();
  // With tiers a reset needs the new weights' identity (the old blocks outlive the call).
  CHECK_THROWS_WITH(t.h.s.reset_cache(), Catch::Matchers::ContainsSubstring(
                                             "this scheduler has tiers: give the new weights"));
  CHECK(t.in_tier(a[0]) != LookupResult::miss);  // the refused call changed nothing
  t.h.s.reset_cache("new weights");
  CHECK(t.in_tier(a[0]) == LookupResult::miss);
  // The write was emitted and may still read its host blocks: they and its slots are held
  // until it reports (scheduler_tier_stall_test.cpp); no step waits for it.
  CHECK(t.h.s.build_step({}).flush.empty());
  t.complete(jobs.at(0));
  CHECK(t.h.s.tier_stats(0).blocks_used == 0);
  CHECK(t.h.s.manager().num_held() == 0);

  Tiered fresh(tiered({full()}, 4, 16));
  std::vector<std::optional<Key>> slots(6);
  slots[2] = Key{a[0], 0};
  slots[5] = Key{a[1], 0};
  CHECK(fresh.h.s.restore_tier(0, slots) == 2);
  CHECK_FALSE(fresh.h.lookup("c", a, 33, 0).has_value());
  const auto promote = fresh.tier_jobs();
  REQUIRE(promote.size() == 1);
  CHECK(promote[0].slots == std::vector<std::int64_t>{2, 5});
  fresh.complete(promote[0]);
  CHECK(fresh.h.s.lookup("c", 0) == 32);
  CHECK_THROWS_AS(fresh.h.s.restore_tier(1, slots), invalid_argument);
}

TEST_CASE("Tier configuration errors name the field", "[scheduler][tier]") {
  auto c = tiered({full()}, 4, 0);
  CHECK_THROWS_WITH(Scheduler(c), "tiers[0].blocks must be 1 to 2^31 - 2, got 0");
  c = tiered({full()}, 4, 4, 1);
  CHECK_THROWS_WITH(Scheduler(c), "tiers[0].store_threshold must be 0 (off) or at least 2, got 1");
  c = tiered({full()}, 4, 4);
  c.tiers[0].medium = Medium::host;
  CHECK_THROWS_AS(Scheduler(c), invalid_argument);
}

TEST_CASE(
    "Write-back: no write-through; the blocks the host would evict next are written, "
    "then evicted, and come back by promotion",
    "[scheduler][tier]") {
  auto c = tiered({full()}, 8, 16);
  c.tiers[0].write_back = true;
  c.tiers[0].write_back_free_blocks = 2;
  Tiered t(c);
  const auto a = chain_hashes("a", 4);
  t.store("a", a);
  CHECK(t.tier_jobs().empty());  // 4 of 8 blocks free: nothing to do
  const auto b = chain_hashes("b", 4);
  t.store("b", b);  // the host cache is full
  const auto jobs = t.tier_jobs();
  REQUIRE(jobs.size() == 1);
  // LRU: a's blocks are older than b's, and a request's tail goes before its head.
  CHECK(jobs[0].keys == std::vector<Key>{Key{a[3], 0}, Key{a[2], 0}});
  CHECK(t.in_host(a[3]) == LookupResult::hit);  // still loadable while written
  const auto evictions = t.h.s.cache_stats().evictions;
  t.complete(jobs[0]);
  CHECK(t.in_host(a[3]) == LookupResult::miss);  // written, then evicted
  CHECK(t.in_host(a[2]) == LookupResult::miss);
  CHECK(t.in_tier(a[3]) == LookupResult::hit);
  CHECK(t.h.s.cache_stats().evictions == evictions + 2);
  CHECK(t.h.s.cache_stats().blocks_free == 2);
  CHECK(t.tier_jobs().empty());  // two blocks free again

  // a's head is in host memory, its tail on disk: the lookup promotes the tail.
  CHECK_FALSE(t.h.lookup("c", a, 65, 0).has_value());
  const auto promote = t.tier_jobs();
  REQUIRE(promote.size() == 1);
  CHECK(promote[0].kind == JobKind::promote);
  CHECK(promote[0].keys == std::vector<Key>{Key{a[2], 0}, Key{a[3], 0}});
  t.complete(promote[0]);
  CHECK(t.h.s.lookup("c", 0) == 64);
}

TEST_CASE("Write-back evicts at once what the tier has or does not admit", "[scheduler][tier]") {
  auto c = tiered({full()}, 4, 16, /*threshold=*/2);
  c.tiers[0].write_back = true;
  c.tiers[0].write_back_free_blocks = 1;
  Tiered t(c);
  t.store("a", chain_hashes("a", 4));  // looked up once: below the tier's threshold
  const StepResult st = t.h.s.build_step({});
  CHECK(st.tier_jobs.empty());
  CHECK(t.h.s.cache_stats().blocks_free == 1);  // evicted without a write
  CHECK(t.h.s.tier_stats(0).writes_skipped == 1);
}

TEST_CASE("A block stored without its leading sub-blocks stays in host memory (SEMANTICS 6.8)",
          "[scheduler][tier]") {
  // f = 2, window 48: a request whose first three GPU blocks are null (outside its window)
  // stores key 1 from sub-block 1 on. It is a host block like any other, but no tier gets it:
  // a tier's index cannot say which sub-blocks a promoted block would lack.
  SchedulerConfig c = make_config({window(48)}, 2, 8);
  TierConfig t;
  t.blocks = 16;
  c.tiers.push_back(t);
  Harness h(c);
  const auto a = chain_hashes("a", 8);
  REQUIRE(h.lookup("a", a, 128, 96) == 0);
  StepResult st = h.step("a", 96, 32, {{0, 0, 0, 4, 5, 6, 7, 8}});
  REQUIRE(st.store_jobs.size() == 1);
  const TransferJob& job = st.store_jobs[0];
  REQUIRE(job.keys.size() == 3);  // keys 1, 2, 3 (key 0 is entirely null)
  CHECK(h.s.manager().valid_from(job.host_block_ids[0]) == 1);
  CHECK(h.s.manager().valid_from(job.host_block_ids[1]) == 0);
  CHECK(h.s.cache_stats().partial_stores == 1);
  h.complete(job.id);
  const std::vector<TierJob> writes = h.s.build_step({}).tier_jobs;
  REQUIRE(writes.size() == 1);
  CHECK(writes[0].keys == std::vector<Key>{job.keys[1], job.keys[2]});
  CHECK(h.s.tier_stats(0).writes_partial == 1);
  CHECK(h.s.tier_index(0).peek(job.keys[0]) == LookupResult::miss);
}

TEST_CASE("A window group promotes the block its window reaches into, the hit ended inside one",
          "[scheduler][tier]") {
  // Full attention in 16-token blocks ends the hit at 48, inside block 1 of a 20-token window
  // over 32-token blocks: the window read at 48 (tokens 29-47) needs blocks 0 and 1 of it.
  Tiered t(tiered({full(16), window(20, 32)}, 6, 16));
  const auto a = chain_hashes("a", 4);
  std::vector<JobId> stores;
  for (std::size_t i = 0; i < 3; ++i) stores.push_back(t.h.place(a, 0, i, false));
  stores.push_back(t.h.place(a, 1, 0, false));
  stores.push_back(t.h.place(a, 1, 1, false));
  for (const JobId job : stores) t.h.complete(job);
  for (const TierJob& w : t.tier_jobs()) t.complete(w);
  REQUIRE(t.in_tier(a[1], 1) == LookupResult::hit);
  const auto b = chain_hashes("b", 4);  // 6 keys: evicts a's 5 from host memory
  REQUIRE(t.h.lookup("b", b, 65, 0) == 0);
  t.h.alloc_none("b");
  const StepResult st = t.h.step("b", 0, 65, {ids(1, 5), ids(11, 3)});
  REQUIRE(st.store_jobs.size() == 1);
  t.h.complete(st.store_jobs[0].id);
  t.complete(t.tier_jobs().at(0));  // b's write: its host blocks unpinned
  REQUIRE(t.in_host(a[1], 1) == LookupResult::miss);

  CHECK_FALSE(t.h.lookup("c", a, 64, 0).has_value());
  const auto jobs = t.tier_jobs();
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].kind == JobKind::promote);
  std::vector<Key> expected = keys_of({a[0], a[1], a[2]}, 0);
  expected.push_back(Key{a[1], 1});
  expected.push_back(Key{a[3], 1});
  CHECK(jobs[0].keys == expected);
  t.complete(jobs[0]);
  CHECK(t.h.s.lookup("c", 0) == 48);
  std::vector<AllocatedGroup> groups{{ids(21, 3), 0}, {ids(31, 2), 0}};
  CHECK_NOTHROW(t.h.s.on_allocated("c", groups, 48));
}
