#include <catch2/catch_test_macros.hpp>

#include "kvoffload/lru_policy.hpp"

using namespace kvoffload;

namespace {
const Key k{BlockHash::from_hex("01"), 0};
}

TEST_CASE("LRU inserts at the recent end in the order given", "[lru]") {
  LruPolicy lru(8);
  for (HostBlockId id : {3, 1, 2}) lru.insert(id, k);
  CHECK(lru.order() == std::vector<HostBlockId>{3, 1, 2});
}

TEST_CASE("LRU touch walks from last to first so the first key ends most recent", "[lru]") {
  LruPolicy lru(8);
  for (HostBlockId id : {0, 1, 2, 3, 4}) lru.insert(id, k);
  const HostBlockId touched[] = {1, 3};
  lru.touch(touched, [](HostBlockId) { return true; });
  CHECK(lru.order() == std::vector<HostBlockId>{0, 2, 4, 3, 1});
}

TEST_CASE("LRU selects victims from the least recent end, all or nothing", "[lru]") {
  LruPolicy lru(8);
  for (HostBlockId id : {0, 1, 2, 3}) lru.insert(id, k);
  std::vector<HostBlockId> victims{99};
  CHECK(lru.select_victims(
      2, [](HostBlockId id) { return id != 0; }, victims));
  CHECK(victims == std::vector<HostBlockId>{99, 1, 2});
  victims = {99};
  CHECK_FALSE(lru.select_victims(
      4, [](HostBlockId id) { return id != 0; }, victims));
  CHECK(victims == std::vector<HostBlockId>{99});  // unchanged on failure
  lru.evict(1, k);
  lru.erase(2);
  CHECK(lru.order() == std::vector<HostBlockId>{0, 3});
  lru.reset();
  CHECK(lru.order().empty());
}
