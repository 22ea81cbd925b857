#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "kvoffload/error.hpp"
#include "kvoffload/host_block_manager.hpp"
#include "kvoffload/lru_policy.hpp"

using namespace kvoffload;

namespace {

Key key(int i, std::uint32_t group = 0) {
  const auto byte = static_cast<std::uint8_t>(i);
  const std::uint8_t bytes[] = {0xee, byte};
  return Key{BlockHash::from_bytes(bytes), group};
}

std::vector<Key> keys(std::initializer_list<int> is) {
  std::vector<Key> out;
  for (int i : is) out.push_back(key(i));
  return out;
}

HostBlockManager make(std::int64_t capacity) {
  ManagerConfig c;
  c.host_blocks = capacity;
  return HostBlockManager(c);
}

struct Stored {
  std::vector<Key> keys;
  std::vector<HostBlockId> ids;
  bool ok = false;
};

Stored store(HostBlockManager& m, const std::vector<Key>& ks) {
  Stored s;
  PreparedStore p;
  s.ok = m.prepare_store(ks, p);
  CHECK(p.ok == s.ok);
  s.keys = p.keys_to_store;
  s.ids = p.block_ids;
  return s;
}

Stored store_ready(HostBlockManager& m, const std::vector<Key>& ks) {
  Stored s = store(m, ks);
  m.complete_store(s.keys, true);
  return s;
}

std::vector<Key> removed_keys(HostBlockManager& m) {
  std::vector<Key> out;
  for (const auto& e : m.take_events()) {
    if (e.removed) out.insert(out.end(), e.keys.begin(), e.keys.end());
  }
  return out;
}

}  // namespace

TEST_CASE("A stored key is pending while writing and a hit once complete", "[manager]") {
  auto m = make(4);
  CHECK(m.lookup(key(1)) == LookupResult::miss);
  const Stored s = store(m, keys({1, 2}));
  REQUIRE(s.ok);
  CHECK(s.ids == std::vector<HostBlockId>{0, 1});
  CHECK(m.lookup(key(1)) == LookupResult::pending);
  CHECK(m.num_writing() == 2);
  m.complete_store(s.keys, true);
  CHECK(m.lookup(key(1)) == LookupResult::hit);
  CHECK(m.num_writing() == 0);
  const auto events = m.take_events();
  REQUIRE(events.size() == 1);
  CHECK_FALSE(events[0].removed);
  CHECK(events[0].keys == keys({1, 2}));
  CHECK(m.stats().hits == 1);
  CHECK(m.stats().misses == 1);
  CHECK(m.stats().pending == 1);
  CHECK(m.stats().stores == 2);
}

TEST_CASE("Keys already present are dropped from a store", "[manager]") {
  auto m = make(4);
  store_ready(m, keys({1}));
  const Stored s = store(m, keys({1, 2}));
  CHECK(s.ok);
  CHECK(s.keys == keys({2}));
  const Stored again = store(m, keys({1, 2}));
  CHECK(again.ok);
  CHECK(again.keys.empty());
}

TEST_CASE("A failed store is never a hit and frees its blocks", "[manager]") {
  auto m = make(2);
  const Stored s = store(m, keys({1, 2}));
  m.complete_store(s.keys, false);
  CHECK(m.lookup(key(1)) == LookupResult::miss);
  CHECK(m.num_used() == 0);
  CHECK(m.take_events().empty());  // nothing was ever stored
  CHECK(m.stats().failed_store_blocks == 2);
  // Freed ids come back most recently freed first: 1 then 0.
  CHECK(store(m, keys({3, 4})).ids == std::vector<HostBlockId>{1, 0});
}

TEST_CASE("Eviction follows LRU order and makes one removed event", "[manager]") {
  auto m = make(3);
  store_ready(m, keys({1, 2, 3}));
  m.take_events();
  m.touch(keys({1}));  // 1 becomes most recent: order 2, 3, 1
  const Stored s = store(m, keys({4, 5}));
  REQUIRE(s.ok);
  CHECK(removed_keys(m) == keys({2, 3}));
  CHECK(m.lookup(key(1)) == LookupResult::hit);
  CHECK(m.lookup(key(2)) == LookupResult::miss);
  // Ids: never-used first, then most recently freed: 3 was evicted last (id 2), then 2 (id 1).
  CHECK(s.ids == std::vector<HostBlockId>{2, 1});
  CHECK(m.stats().evictions == 2);
}

TEST_CASE("Never-used ids are handed out in increasing order before freed ones", "[manager]") {
  auto m = make(4);
  store_ready(m, keys({1, 2}));
  const Stored b = store(m, keys({3}));
  m.complete_store(b.keys, false);  // frees id 2
  CHECK(store(m, keys({4, 5})).ids == std::vector<HostBlockId>{3, 2});
}

TEST_CASE("reset(held) keeps those blocks out of use until release_held", "[manager]") {
  auto m = make(4);
  const Stored a = store_ready(m, keys({1, 2, 3}));
  REQUIRE(a.ids == std::vector<HostBlockId>{0, 1, 2});
  const std::vector<HostBlockId> held{2, 0, 2};  // a repeat counts once
  m.reset(held);
  CHECK(m.num_held() == 2);
  CHECK(m.num_used() == 0);
  CHECK(m.key_of(0) == nullptr);
  CHECK(m.peek(key(1)) == LookupResult::miss);
  // Only 1 and 3 are free, lowest first; nothing can evict a held block.
  CHECK(store(m, keys({4})).ids == std::vector<HostBlockId>{1});
  CHECK(store(m, keys({5})).ids == std::vector<HostBlockId>{3});
  CHECK_FALSE(store(m, keys({6})).ok);
  const std::vector<HostBlockId> release{0, 1, -1, 9};  // 1 is in use, -1 and 9 out of range
  m.release_held(release);
  CHECK(m.num_held() == 1);
  CHECK(m.key_of(1) != nullptr);  // the block in use was left alone
  CHECK(store(m, keys({6})).ids == std::vector<HostBlockId>{0});
  m.reset();
  CHECK(m.num_held() == 0);
  CHECK(store(m, keys({7})).ids == std::vector<HostBlockId>{0});
  const std::vector<HostBlockId> bad{4};
  CHECK_THROWS_AS(m.reset(bad), invalid_argument);
}

TEST_CASE("Blocks being read, being written, or among the keys stored are never evicted",
          "[manager]") {
  auto m = make(3);
  store_ready(m, keys({1, 2}));
  const Stored writing = store(m, keys({3}));
  std::vector<HostBlockId> read;
  m.prepare_load(keys({1}), read);
  CHECK(m.readers(read[0]) == 1);
  // Room for one new key: 1 is read, 3 is written, 2 is in the keys being stored.
  const Stored s = store(m, keys({2, 4}));
  CHECK_FALSE(s.ok);
  CHECK(s.keys.empty());
  CHECK(m.stats().store_rejections == 1);
  // Nothing changed: all or nothing.
  CHECK(m.lookup(key(1)) == LookupResult::hit);
  CHECK(m.lookup(key(2)) == LookupResult::hit);
  CHECK(m.lookup(key(3)) == LookupResult::pending);
  CHECK(removed_keys(m).empty());
  // Once the load ends, key 1 can go.
  m.complete_load(keys({1}));
  CHECK(m.readers(read[0]) == 0);
  const Stored t = store(m, keys({2, 4}));
  CHECK(t.ok);
  CHECK(t.keys == keys({4}));
  CHECK(removed_keys(m) == keys({1}));
}

TEST_CASE("Eviction is all or nothing", "[manager]") {
  auto m = make(3);
  store_ready(m, keys({1, 2, 3}));
  std::vector<HostBlockId> read;
  m.prepare_load(keys({3}), read);
  m.take_events();
  const Stored s = store(m, keys({4, 5, 6}));  // needs 3, only 2 evictable
  CHECK_FALSE(s.ok);
  CHECK(m.num_used() == 3);
  CHECK(removed_keys(m).empty());
  CHECK(m.lookup(key(1)) == LookupResult::hit);
}

TEST_CASE("prepare_load requires ready keys and changes nothing otherwise", "[manager]") {
  auto m = make(4);
  store_ready(m, keys({1}));
  store(m, keys({2}));
  std::vector<HostBlockId> out;
  CHECK_THROWS_AS(m.prepare_load(keys({1, 2}), out), invalid_argument);
  CHECK_THROWS_WITH(m.prepare_load(keys({1, 3}), out),
                    Catch::Matchers::ContainsSubstring("not in the host cache"));
  CHECK(out.empty());
  CHECK(m.readers(m.block_of(key(1))) == 0);
  CHECK(m.all_ready(keys({1})));
  CHECK_FALSE(m.all_ready(keys({1, 2})));
}

TEST_CASE("reset forgets everything and reuses ids from 0", "[manager]") {
  auto m = make(2);
  store_ready(m, keys({1, 2}));
  m.reset();
  CHECK(m.num_used() == 0);
  CHECK(m.lookup(key(1)) == LookupResult::miss);
  CHECK(store(m, keys({3, 4})).ids == std::vector<HostBlockId>{0, 1});
}

TEST_CASE("Keys of different groups are different blocks", "[manager]") {
  auto m = make(4);
  store_ready(m, {key(1, 0), key(1, 1)});
  CHECK(m.num_used() == 2);
  CHECK(m.block_of(key(1, 0)) != m.block_of(key(1, 1)));
}

TEST_CASE("A key given twice to prepare_store is stored once and wastes no id", "[manager]") {
  auto m = make(4);
  const Stored s = store(m, keys({1, 1, 2}));
  REQUIRE(s.ok);
  CHECK(s.keys == keys({1, 2}));
  CHECK(s.ids == std::vector<HostBlockId>{0, 1});
  CHECK(store(m, keys({3})).ids == std::vector<HostBlockId>{2});  // id 2 was not consumed
}
