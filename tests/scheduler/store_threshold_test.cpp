#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "kvoffload/error.hpp"
#include "kvoffload/host_block_manager.hpp"
#include "support/scheduler_fixture.hpp"

using namespace kvtest;

namespace {

Key key(int i) {
  const std::uint8_t bytes[] = {0x7e, static_cast<std::uint8_t>(i)};
  return Key{BlockHash::from_bytes(bytes), 0};
}

}  // namespace

TEST_CASE("A key is stored only after it was looked up store_threshold times",
          "[threshold][manager]") {
  ManagerConfig c;
  c.host_blocks = 8;
  c.store_threshold = 3;
  HostBlockManager m(c);
  PreparedStore p;
  for (int lookups = 0; lookups < 3; ++lookups) {
    REQUIRE(m.prepare_store(std::vector<Key>{key(1)}, p));
    CHECK(p.keys_to_store.empty());
    CHECK(p.key_blocks == std::vector<HostBlockId>{-1});  // skipped: no block
    CHECK(m.lookup(key(1)) == LookupResult::miss);
  }
  CHECK(m.stats().stores_skipped == 3);
  CHECK(m.lookup_count(key(1)) == 3);
  REQUIRE(m.prepare_store(std::vector<Key>{key(1), key(2)}, p));
  CHECK(p.keys_to_store == std::vector<Key>{key(1)});  // key 2 was never looked up
  CHECK(p.key_stored == std::vector<std::uint8_t>{1, 0});
  CHECK(m.stats().stores_skipped == 4);
}

TEST_CASE("The lookup tracker is bounded and keeps recent counts", "[threshold][manager]") {
  ManagerConfig c;
  c.host_blocks = 8;
  c.store_threshold = 2;
  c.threshold_tracker_keys = 4;
  HostBlockManager m(c);
  m.lookup(key(1));
  for (int i = 10; i < 13; ++i) m.lookup(key(i));  // fills a generation
  m.lookup(key(1));                                // survives in the previous generation
  CHECK(m.lookup_count(key(1)) == 2);
  for (int i = 20; i < 40; ++i) m.lookup(key(i));  // two generations later it is gone
  CHECK(m.lookup_count(key(1)) == 0);
}

TEST_CASE("Through the scheduler, a prefix is stored when a second request asks for it",
          "[threshold][scheduler]") {
  auto config = make_config({full()}, 1, 8);
  config.manager.store_threshold = 2;
  Harness h(config);
  const auto hashes = chain_hashes("popular", 2);
  REQUIRE(h.lookup("a", hashes, 32, 0) == 0);
  h.alloc_none("a");
  CHECK(h.step("a", 0, 32, {ids(1, 2)}).store_jobs.empty());
  CHECK(h.s.cache_stats().stores_skipped == 2);
  REQUIRE(h.lookup("b", hashes, 32, 0) == 0);  // the second lookup of block 0
  h.alloc_none("b");
  const StepResult st = h.step("b", 0, 32, {ids(11, 2)});
  REQUIRE(st.store_jobs.size() == 1);
  // Block 1 was looked up only once (a's scan stopped at block 0's miss each time).
  CHECK(st.store_jobs[0].keys.size() == 1);
}

TEST_CASE("A store threshold of 1 or a negative one is rejected", "[threshold][config]") {
  for (const std::int64_t bad : {1, -2}) {
    ManagerConfig c;
    c.host_blocks = 8;
    c.store_threshold = bad;
    CHECK_THROWS_WITH(HostBlockManager(c), Catch::Matchers::ContainsSubstring("store_threshold"));
  }
}
