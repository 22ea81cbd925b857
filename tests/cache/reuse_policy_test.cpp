// Policy reuse (issue 55): owners, chains, eviction order, and the invariants every policy
// keeps through the manager (capacity, protected blocks never evicted, determinism).

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include <catch2/catch_test_macros.hpp>

#include "kvoffload/host_block_manager.hpp"
#include "kvoffload/reuse_policy.hpp"

using namespace kvoffload;

namespace {

Key key(int i) {
  const std::uint8_t bytes[] = {0x5e, static_cast<std::uint8_t>(i & 0xff),
                                static_cast<std::uint8_t>(i >> 8)};
  return Key{BlockHash::from_bytes(bytes), 0};
}

const auto any = [](HostBlockId) { return true; };

/// One request as the scheduler drives the policy: its context, a touch of the blocks it
/// found, its new blocks inserted, a touch of all of them in order.
void request(ReusePolicy& p, std::uint64_t id, double now, std::vector<HostBlockId> found,
             std::vector<int> fresh, int first_fresh_block, std::int8_t continues = -1) {
  p.set_context({id, now, continues});
  p.touch(found, any);
  std::vector<HostBlockId> all = found;
  for (std::size_t i = 0; i < fresh.size(); ++i) {
    const HostBlockId b = first_fresh_block + static_cast<HostBlockId>(i);
    p.insert(b, key(fresh[i]));
    all.push_back(b);
  }
  p.touch(all, any);
  p.set_context({});
}

}  // namespace

TEST_CASE("Reuse: a block belongs to the last request that used it; turns follow the chain",
          "[reuse]") {
  ReusePolicy p(16, {.samples = 64, .seed = 1, .prior = false});
  request(p, 1, 0, {}, {0, 1, 2}, 0);
  CHECK(p.turn_of(1) == 1);
  CHECK(p.blocks_of(1) == std::vector<HostBlockId>{0, 1, 2});
  // Its continuation extends the whole prompt: turn 2, and it owns the prefix now.
  request(p, 2, 10, {0, 1, 2}, {3, 4}, 3);
  CHECK(p.turn_of(2) == 2);
  CHECK(p.owner_of(0) == 2);
  CHECK(p.blocks_of(2) == std::vector<HostBlockId>{0, 1, 2, 3, 4});
  CHECK(p.blocks_of(1).empty());
  CHECK(p.active_owners() == 1);
  request(p, 3, 20, {0, 1, 2, 3, 4}, {5}, 5);
  CHECK(p.turn_of(3) == 3);
  // A request sharing only part of a prompt (a system prompt) does not continue it.
  request(p, 4, 25, {0, 1}, {6, 7}, 6);
  CHECK(p.turn_of(4) == 1);
  CHECK(p.blocks_of(3) == std::vector<HostBlockId>{2, 3, 4, 5});
  CHECK(p.resident() == 8);
}

TEST_CASE("Reuse: the least valuable request is cut from its deepest block; nothing changes",
          "[reuse]") {
  ReusePolicy p(16, {.samples = 64, .seed = 1, .prior = false});
  request(p, 1, 0, {}, {0, 1, 2}, 0, /*continues=*/1);
  request(p, 2, 5, {}, {10, 11, 12}, 3, /*continues=*/0);  // the engine says it ends
  request(p, 3, 6, {}, {20, 21}, 6);
  p.set_context({0, 10, -1});
  CHECK(p.value_of(2) < p.value_of(3));
  CHECK(p.value_of(3) < p.value_of(1));
  std::vector<HostBlockId> v;
  REQUIRE(p.select_victims(4, any, v));
  // Request 2's blocks deepest first, then request 3's deepest.
  CHECK(v == std::vector<HostBlockId>{5, 4, 3, 7});
  std::vector<HostBlockId> again;
  REQUIRE(p.select_victims(4, any, again));
  CHECK(again == v);  // select_victims changed nothing
  CHECK(p.resident() == 8);
  // Protected blocks are skipped; all or nothing.
  const auto not_2 = [](HostBlockId id) { return id < 3 || id > 5; };
  std::vector<HostBlockId> some{42};
  REQUIRE(p.select_victims(2, not_2, some));
  CHECK(some == std::vector<HostBlockId>{42, 7, 6});
  CHECK_FALSE(p.select_victims(6, not_2, some));
  CHECK(some == std::vector<HostBlockId>{42, 7, 6});
  // Evicting cuts the owner's list; the next victim is its new deepest block.
  p.evict(5, key(12));
  CHECK(p.blocks_of(2) == std::vector<HostBlockId>{3, 4});
  CHECK(p.owner_of(5) == 0);
  p.erase(3);
  p.erase(4);
  CHECK(p.blocks_of(2).empty());
  CHECK(p.active_owners() == 2);
  p.reset();
  CHECK(p.resident() == 0);
  CHECK(p.active_owners() == 0);
}

TEST_CASE("Reuse: owners beyond the sample are found, and records stay bounded", "[reuse]") {
  // 300 single-block requests in a 256-block policy with 8 samples: sampled eviction, then
  // the full scan when asked for every block.
  constexpr std::size_t kCap = 256;
  ReusePolicy p(kCap, {.samples = 8, .seed = 7, .prior = true});
  for (int r = 0; r < static_cast<int>(kCap); ++r) {
    request(p, static_cast<std::uint64_t>(r + 1), r, {}, {r}, r);
  }
  std::vector<HostBlockId> v;
  REQUIRE(p.select_victims(kCap, any, v));
  CHECK(std::set<HostBlockId>(v.begin(), v.end()).size() == kCap);
  CHECK_FALSE(p.select_victims(kCap + 1, any, v));
  // Requests keep coming, each evicting one block: records are reused, never more than the
  // capacity plus the history.
  for (int r = static_cast<int>(kCap); r < 20000; ++r) {
    std::vector<HostBlockId> one;
    REQUIRE(p.select_victims(1, any, one));
    p.evict(one[0], key(0));
    request(p, static_cast<std::uint64_t>(r + 1), r, {}, {r}, static_cast<int>(one[0]));
    REQUIRE(p.resident() == kCap);
  }
  CHECK(p.owner_records() <= kCap + 4096);
  CHECK(p.active_owners() == kCap);
}

TEST_CASE("Reuse through the manager: capacity, pinned blocks and determinism", "[reuse]") {
  // Conversations over a manager with policy reuse: each request extends an earlier prompt or
  // starts one, looks up, stores, and completes; some blocks are pinned (a tier write) for a
  // while. After every request: within capacity, every pinned key present. Two runs of the
  // same seed give the same events.
  const auto seed = std::random_device{}();
  INFO("seed " << seed);
  const auto run = [&](std::vector<std::vector<Key>>& removed) {
    std::mt19937_64 rng(seed);
    ManagerConfig mc;
    mc.host_blocks = 64;
    mc.policy = EvictionPolicyKind::reuse;
    HostBlockManager m(mc);
    std::vector<std::vector<int>> prompts;
    std::vector<HostBlockId> pinned;
    std::vector<Key> pinned_keys;
    int next_key = 0;
    PreparedStore prepared;
    for (std::uint64_t r = 1; r <= 3000; ++r) {
      std::vector<int> prompt;
      if (!prompts.empty() && rng() % 3 != 0) {
        prompt = prompts[rng() % prompts.size()];
      }
      const int extra = 1 + static_cast<int>(rng() % 6);
      for (int i = 0; i < extra; ++i) prompt.push_back(next_key++);
      if (prompt.size() > 40) prompt.erase(prompt.begin() + 40, prompt.end());
      prompts.push_back(prompt);
      if (prompts.size() > 50) prompts.erase(prompts.begin());
      std::vector<Key> keys;
      for (const int k : prompt) keys.push_back(key(k));
      m.set_context({r, static_cast<double>(r) * 0.5,
                     static_cast<std::int8_t>(static_cast<int>(rng() % 3) - 1)});
      m.touch(keys);
      if (m.prepare_store(keys, prepared)) {
        m.touch_blocks(prepared.key_blocks);
        m.complete_store_blocks(prepared.block_ids, rng() % 10 != 0);
      }
      m.set_context({});
      REQUIRE(m.num_used() <= m.capacity());
      for (const Key& k : pinned_keys) REQUIRE(m.peek(k) == LookupResult::hit);
      if (rng() % 4 == 0 && !pinned.empty()) {  // a tier write ends
        m.unpin_blocks(pinned);
        pinned.clear();
        pinned_keys.clear();
      } else if (pinned.size() < 8) {  // one starts on a ready block of this request
        for (const Key& k : keys) {
          const HostBlockId b = m.block_of(k);
          if (b >= 0 && m.peek(k) == LookupResult::hit &&
              std::find(pinned.begin(), pinned.end(), b) == pinned.end()) {
            m.pin_blocks(std::span(&b, 1));
            pinned.push_back(b);
            pinned_keys.push_back(k);
            break;
          }
        }
      }
      for (ManagerEvent& e : m.take_events()) {
        if (e.removed) removed.push_back(std::move(e.keys));
      }
    }
    return m.stats().evictions;
  };
  std::vector<std::vector<Key>> first, second;
  const auto evictions = run(first);
  CHECK(evictions > 1000);  // the cache was under pressure all along
  CHECK(run(second) == evictions);
  REQUIRE(first.size() == second.size());
  CHECK(first == second);
}

TEST_CASE("Reuse: blocks nobody's go to anonymous owners, by recency", "[reuse]") {
  // A tier's index: no request behind its writes. 64 blocks an owner at one clock tick.
  ReusePolicy p(200, {.samples = 64, .seed = 1, .prior = true});
  p.set_context({0, 1.0, -1});
  for (int i = 0; i < 65; ++i) p.insert(i, key(i));
  CHECK((p.owner_of(0) >> 63) == 1);
  CHECK(p.owner_of(63) == p.owner_of(0));
  CHECK(p.owner_of(64) != p.owner_of(0));
  p.set_context({0, 50.0, -1});
  for (int i = 65; i < 70; ++i) p.insert(i, key(i));
  // The older write batches go first, each from its last block.
  std::vector<HostBlockId> v;
  REQUIRE(p.select_victims(3, any, v));
  CHECK(v == std::vector<HostBlockId>{63, 62, 61});
  CHECK(p.value_of(p.owner_of(65)) > p.value_of(p.owner_of(0)));
}

TEST_CASE("Reuse: a running request never cuts its own earlier blocks while others can go",
          "[reuse]") {
  // Review of issue 55: a chunked prefill's second chunk, the least valuable owner being the
  // request itself, must evict another request's blocks.
  ReusePolicy p(8, {.samples = 64, .seed = 1, .prior = true});
  request(p, 1, 0, {}, {0, 1}, 0);
  request(p, 2, 10, {0, 1}, {2, 3}, 2);
  request(p, 3, 12, {}, {4, 5, 6, 7}, 4);  // its first chunk
  p.set_context({3, 13, -1});              // its second chunk needs 4 blocks
  std::vector<HostBlockId> v;
  REQUIRE(p.select_victims(4, any, v));
  for (const HostBlockId b : v) CHECK(p.owner_of(b) == 2);
  // Only when nothing else can go are its own taken, last.
  std::vector<HostBlockId> w;
  REQUIRE(p.select_victims(6, any, w));
  CHECK(w == std::vector<HostBlockId>{3, 2, 1, 0, 7, 6});
  p.set_context({});
}

TEST_CASE("Reuse: an owner whose deepest block is held loses nothing rather than a hole",
          "[reuse]") {
  ReusePolicy p(16, {.samples = 64, .seed = 1, .prior = false});
  request(p, 1, 0, {}, {0, 1, 2}, 0, /*continues=*/0);  // least valuable
  request(p, 2, 5, {}, {10, 11, 12}, 3, /*continues=*/1);
  p.set_context({0, 10, -1});
  const auto deepest_held = [](HostBlockId id) { return id != 2; };  // being read
  std::vector<HostBlockId> v;
  REQUIRE(p.select_victims(2, deepest_held, v));
  CHECK(v == std::vector<HostBlockId>{5, 4});  // request 2's, not request 1's 1 and 0
  // The last resort takes past the held block: false only when too few can go at all.
  std::vector<HostBlockId> w;
  REQUIRE(p.select_victims(5, deepest_held, w));
  CHECK(w.size() == 5);
  CHECK(std::find(w.begin(), w.end(), 2) == w.end());
  CHECK_FALSE(p.select_victims(6, deepest_held, w));
}

TEST_CASE("Reuse: a shared prefix left as an owner's deepest block gets the floor", "[reuse]") {
  // Blocks 0-3 used by three requests (a system prompt); the last one's own block 12 goes
  // first, then its value is the shared prefix's, above a lone request's.
  ReusePolicy p(16, {.samples = 64, .seed = 1, .prior = false});
  request(p, 1, 0, {}, {0, 1, 2, 3}, 0);
  request(p, 2, 1, {0, 1, 2, 3}, {10}, 4);
  request(p, 3, 2, {}, {20}, 5);               // a lone request
  request(p, 4, 3, {0, 1, 2, 3}, {30}, 6, 0);  // says it ends: only its own block is cut
  p.set_context({0, 500, -1});
  std::vector<HostBlockId> v;
  REQUIRE(p.select_victims(2, any, v));
  CHECK(v[0] == 6);
  CHECK(v[1] != 3);  // not the shared prefix: request 2's or 3's block
}

TEST_CASE("Reuse: thousands of one-block requests before the first eviction", "[reuse]") {
  // Second review of issue 55: a request storing one block (insert, then a touch of it) was
  // queued as finished for a moment; after 4096 such, the next new request found no record and
  // threw into the engine. Also a request emptied by evictions and refilled.
  constexpr int kRequests = 6000;
  ReusePolicy p(10000, {.samples = 64, .seed = 1, .prior = true});
  for (int r = 0; r < kRequests; ++r) {
    REQUIRE_NOTHROW(request(p, static_cast<std::uint64_t>(r + 1), r, {}, {r}, r));
  }
  CHECK(p.resident() == kRequests);
  CHECK(p.active_owners() == kRequests);
  CHECK(p.blocks_of(kRequests) == std::vector<HostBlockId>{kRequests - 1});
  // One request evicted to nothing and storing again, many times.
  for (int r = 0; r < 5000; ++r) {
    const auto id = static_cast<std::uint64_t>(kRequests + 1 + r);
    const HostBlockId b = 9000 + (r % 500);
    p.set_context({id, 7000.0 + r, -1});
    p.insert(b, key(b));
    p.evict(b, key(b));
    REQUIRE_NOTHROW(p.insert(b, key(b)));
    p.set_context({});
  }
  CHECK(p.owner_records() <= static_cast<std::size_t>(kRequests) + 500 + 4096 + 1);
}

TEST_CASE("Reuse: a continuation's class does not depend on the clock's origin", "[reuse]") {
  // The same two turns on a clock from 0, on a Unix-epoch clock and on an absurd one: the
  // gap, so the class and the value, must be the same (a float clock rounded 40 s to 0 or
  // 128 s at 1.7e9 and put the continuation in the wrong class).
  const auto value = [](double base, double gap, bool infinite = false) {
    ReusePolicy p(64);  // the prior: classes are known
    request(p, 1, base, {}, {0, 1, 2, 3}, 0);
    request(p, 2, base + gap, {0, 1, 2, 3}, {4}, 4);
    p.set_context({0, base + gap + 100, -1});
    // A clock value that is not finite is no time: ignored.
    if (infinite) p.set_context({0, std::numeric_limits<double>::infinity(), -1});
    REQUIRE(p.turn_of(2) == 2);
    return p.value_of(2);
  };
  for (const double gap : {20.0, 40.0, 250.0, 310.0, 1000.0}) {
    INFO("gap " << gap);
    const double at_zero = value(0, gap);
    CHECK(at_zero > 0);
    CHECK(value(1.7e9, gap) == at_zero);
    CHECK(value(0, gap, true) == at_zero);
    CHECK(value(1e300, gap) >= 0);  // defined, whatever the class
    CHECK(value(1e306, gap) >= 0);  // its milliseconds overflow to infinity: still defined
  }
  // The control: the classes this test tells apart have different values.
  CHECK(value(0, 20) != value(0, 40));
  CHECK(value(0, 250) != value(0, 310));
}

TEST_CASE("Reuse: a parent whose request arrived after its child's first chunk is a gap of 0",
          "[reuse]") {
  // Request 2's first chunk comes first; request 1 arrives later with a prompt request 2's
  // extends (it hits request 2's blocks and adds its own); request 2's next chunk then extends
  // request 1's whole prompt and takes it for its parent. The parent's record is younger than
  // the child's: the gap is 0 (<= 30 s), as if both arrived together, never a wrapped 49 days.
  const auto value = [](double child_first) {
    ReusePolicy p(64);  // the prior: classes are known
    request(p, 2, child_first, {}, {0, 1}, 0);
    request(p, 1, 10, {0, 1}, {2, 3}, 2);
    p.set_context({2, 20, -1});
    const std::vector<HostBlockId> found{0, 1, 2, 3};
    p.touch(found, any);
    p.insert(4, key(4));
    const std::vector<HostBlockId> all{0, 1, 2, 3, 4};
    p.touch(all, any);
    p.set_context({0, 120, -1});
    REQUIRE(p.turn_of(2) == 3);
    return p.value_of(2);
  };
  CHECK(value(0) == value(10));
}
