#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "kvoffload/arc_policy.hpp"
#include "kvoffload/host_block_manager.hpp"

using namespace kvoffload;
using List = ArcPolicy::List;

namespace {

Key key(int i) {
  const std::uint8_t bytes[] = {0xac, static_cast<std::uint8_t>(i)};
  return Key{BlockHash::from_bytes(bytes), 0};
}

const auto all_ready = [](HostBlockId) { return true; };
const auto none_ready = [](HostBlockId) { return false; };
const auto any = [](HostBlockId) { return true; };

void touch(ArcPolicy& arc, std::initializer_list<HostBlockId> ids, bool ready = true) {
  const std::vector<HostBlockId> v(ids);
  if (ready) {
    arc.touch(v, all_ready);
  } else {
    arc.touch(v, none_ready);
  }
}

std::vector<HostBlockId> victims(ArcPolicy& arc, std::size_t n) {
  std::vector<HostBlockId> out;
  REQUIRE(arc.select_victims(n, any, out));
  return out;
}

}  // namespace

TEST_CASE("ARC puts new blocks in T1", "[arc]") {
  ArcPolicy arc(4);
  arc.insert(0, key(0));
  arc.insert(1, key(1));
  CHECK(arc.where(0) == List::t1);
  CHECK(arc.t1_size() == 2);
  CHECK(arc.t2_size() == 0);
  CHECK(arc.where(3) == List::none);
}

TEST_CASE("ARC promotes a ready block to T2 on touch, not one still being written", "[arc]") {
  ArcPolicy arc(4);
  arc.insert(0, key(0));
  arc.insert(1, key(1));
  touch(arc, {0}, /*ready=*/false);  // its own request's touch right after prepare_store
  CHECK(arc.where(0) == List::t1);
  touch(arc, {0});
  CHECK(arc.where(0) == List::t2);
  CHECK(arc.where(1) == List::t1);
  // A block touched twice in one call is one access: it does not count as two.
  touch(arc, {1, 1}, /*ready=*/false);
  CHECK(arc.where(1) == List::t1);
}

TEST_CASE("ARC evicts from T1 while it is at least its target, least recent first", "[arc]") {
  ArcPolicy arc(4);
  for (int i = 0; i < 4; ++i) arc.insert(i, key(i));
  touch(arc, {2, 3});  // T1 = {0, 1}, T2 = {3, 2} (2 most recent)
  CHECK(arc.target() == 0);
  CHECK(victims(arc, 1) == std::vector<HostBlockId>{0});
  CHECK(victims(arc, 3) == std::vector<HostBlockId>{0, 1, 3});  // T1 first, then T2
}

TEST_CASE("Ghost hits move the target both ways", "[arc]") {
  ArcPolicy arc(4);
  for (int i = 0; i < 4; ++i) arc.insert(i, key(i));
  touch(arc, {3});
  // Evict block 0 from T1: its key becomes a B1 ghost.
  arc.evict(0, key(0));
  CHECK(arc.b1_size() == 1);
  CHECK(arc.is_ghost(key(0)));
  // It comes back: T1 should have been larger. The block enters T2.
  arc.insert(0, key(0));
  CHECK(arc.target() == 1);
  CHECK(arc.where(0) == List::t2);
  CHECK_FALSE(arc.is_ghost(key(0)));
  // Evict block 3 from T2 (B2 ghost) and bring it back: the target shrinks again.
  arc.evict(3, key(3));
  CHECK(arc.b2_size() == 1);
  arc.insert(3, key(3));
  CHECK(arc.target() == 0);
  CHECK(arc.where(3) == List::t2);
}

TEST_CASE("ARC ghost lists are bounded by the capacity", "[arc]") {
  ArcPolicy arc(2);
  for (int i = 0; i < 10; ++i) {
    arc.insert(i % 2, key(i));
    arc.evict(i % 2, key(i));
  }
  CHECK(arc.b1_size() == 2);
  CHECK(arc.is_ghost(key(9)));
  CHECK_FALSE(arc.is_ghost(key(0)));
}

TEST_CASE("ARC eviction skips protected blocks and is all or nothing", "[arc]") {
  ArcPolicy arc(4);
  for (int i = 0; i < 4; ++i) arc.insert(i, key(i));
  std::vector<HostBlockId> out{7};
  const auto not_0_or_2 = [](HostBlockId id) { return id != 0 && id != 2; };
  CHECK(arc.select_victims(2, not_0_or_2, out));
  CHECK(out == std::vector<HostBlockId>{7, 1, 3});
  out = {7};
  CHECK_FALSE(arc.select_victims(3, not_0_or_2, out));
  CHECK(out == std::vector<HostBlockId>{7});
  CHECK(arc.t1_size() == 4);  // selection changes nothing
}

TEST_CASE("The manager with ARC never evicts protected blocks and promotes on reuse",
          "[arc][manager]") {
  ManagerConfig c;
  c.host_blocks = 3;
  c.policy = EvictionPolicyKind::arc;
  HostBlockManager m(c);
  PreparedStore p;
  REQUIRE(m.prepare_store(std::vector<Key>{key(1), key(2), key(3)}, p));
  const std::vector<Key> stored = p.keys_to_store;
  m.touch(stored);  // still writing: stays in T1
  const auto& arc = dynamic_cast<const ArcPolicy&>(m.policy());
  CHECK(arc.t1_size() == 3);
  m.complete_store(stored, true);
  m.touch(std::vector<Key>{key(1)});  // a reuse of a ready block
  CHECK(arc.where(m.block_of(key(1))) == List::t2);
  std::vector<HostBlockId> read;
  m.prepare_load(std::vector<Key>{key(2)}, read);
  // Room for 2: key 2 is read, so 3 (T1) and then 1 (T2) go.
  REQUIRE(m.prepare_store(std::vector<Key>{key(4), key(5)}, p));
  CHECK(m.peek(key(2)) == LookupResult::hit);
  CHECK(m.peek(key(1)) == LookupResult::miss);
  CHECK(m.peek(key(3)) == LookupResult::miss);
  // Nothing else is evictable: all or nothing.
  CHECK_FALSE(m.prepare_store(std::vector<Key>{key(6)}, p));
}

TEST_CASE("ARC refuses a capacity its ghost ids cannot number, by field, before allocating",
          "[arc]") {
  kvoffload::ManagerConfig c;
  c.policy = kvoffload::EvictionPolicyKind::arc;
  c.host_blocks = (std::int64_t{1} << 30) + 1;  // 2^31 + 2 ghost ids: past a HostBlockId
  REQUIRE_THROWS_WITH(kvoffload::HostBlockManager(c),
                      Catch::Matchers::ContainsSubstring("too large for policy arc"));
  c.policy = kvoffload::EvictionPolicyKind::lru;
  REQUIRE_NOTHROW(kvoffload::validate(c));  // LRU numbers only the blocks
}
