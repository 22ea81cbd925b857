// Policy reuse's duel (issue 55): two shadow caches replay a sample of the lookups, one by the
// learnt values and one by recency, and the policy follows the one with more hits. Driven
// here as the scheduler drives it (lookup, touch of what was found, stores, touch of all).

#include <array>
#include <cstdint>
#include <map>
#include <vector>

#include <catch2/catch_test_macros.hpp>

#include "kvoffload/reuse_policy.hpp"

using namespace kvoffload;

namespace {

Key key(int i) {
  const std::uint8_t bytes[] = {0xd0, static_cast<std::uint8_t>(i & 0xff),
                                static_cast<std::uint8_t>((i >> 8) & 0xff),
                                static_cast<std::uint8_t>(i >> 16)};
  return Key{BlockHash::from_bytes(bytes), 0};
}

/// A host cache of `capacity` blocks over a ReusePolicy, as the manager and scheduler use it.
class Cache {
 public:
  Cache(std::size_t capacity, bool duel) : policy_(capacity, {.duel = duel}), capacity_(capacity) {}

  /// One request of `blocks` key ids at `now`; returns how many of its blocks were found.
  std::size_t request(std::uint64_t id, double now, const std::vector<int>& blocks) {
    std::vector<Key> keys;
    for (const int b : blocks) keys.push_back(key(b));
    policy_.set_context({id, now, -1});
    policy_.looked_up(keys);
    std::vector<HostBlockId> found;
    for (const int b : blocks) {
      const auto it = slot_.find(b);
      if (it == slot_.end()) break;  // a prefix: the first miss ends it
      found.push_back(it->second);
    }
    policy_.touch(found, [](HostBlockId) { return true; });
    std::vector<HostBlockId> all = found;
    for (std::size_t i = found.size(); i < blocks.size(); ++i) {
      HostBlockId b = -1;
      if (key_of_.size() < capacity_) {
        b = static_cast<HostBlockId>(key_of_.size());
        key_of_.push_back(blocks[i]);
      } else {
        // Never this request's own blocks (they are being stored).
        const auto not_mine = [&](HostBlockId x) {
          for (const HostBlockId a : all) {
            if (a == x) return false;
          }
          return true;
        };
        std::vector<HostBlockId> v;
        if (!policy_.select_victims(1, not_mine, v)) break;
        b = v.front();
        policy_.evict(b, key(key_of_[static_cast<std::size_t>(b)]));
        slot_.erase(key_of_[static_cast<std::size_t>(b)]);
        key_of_[static_cast<std::size_t>(b)] = blocks[i];
      }
      slot_[blocks[i]] = b;
      policy_.insert(b, key(blocks[i]));
      all.push_back(b);
    }
    policy_.touch(all, [](HostBlockId) { return true; });
    policy_.set_context({});
    return found.size();
  }
  ReusePolicy& policy() { return policy_; }

 private:
  ReusePolicy policy_;
  std::size_t capacity_;
  std::map<int, HostBlockId> slot_;
  std::vector<int> key_of_;
};

/// Prompts of 4 blocks each asked for again once, `later` prompts after (half a `step`
/// after that prompt), a prompt every `step` seconds: a retrying client, a repeated prompt.
std::size_t repeats(Cache& c, int prompts, int later, double step) {
  std::size_t hits = 0;
  std::uint64_t id = 0;
  for (int i = 0; i < prompts + later; ++i) {
    const double now = 100.0 + i * step;
    if (i < prompts) hits += c.request(++id, now, {4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3});
    if (i >= later) {
      const int p = i - later;
      hits += c.request(++id, now + step / 2, {4 * p, 4 * p + 1, 4 * p + 2, 4 * p + 3});
    }
  }
  return hits;
}

}  // namespace

TEST_CASE("Reuse duel: follows recency where recency gives more hits", "[reuse]") {
  // 16 blocks, four prompts; each comes back right after the next one. Recency keeps every
  // repeat (8,000 of 8,000 blocks); the learnt values (the conversation trace's, where a
  // minute-old first turn is worth more than a young one) lose some.
  Cache learnt(16, false), duel(16, true);
  const std::size_t without = repeats(learnt, 2000, 1, 1.0);
  const std::size_t with = repeats(duel, 2000, 1, 1.0);
  const auto [learnt_hits, recency_hits] = duel.policy().duel_hits();
  INFO("hits without the duel " << without << ", with " << with << "; shadows: learnt "
                                << learnt_hits << ", recency " << recency_hits);
  CHECK(recency_hits == 8000);  // every repeat's 4 blocks: recency keeps the last 4 prompts
  CHECK(learnt_hits < recency_hits);
  CHECK(duel.policy().follows_recency());
  CHECK_FALSE(learnt.policy().follows_recency());
  CHECK(learnt.policy().duel_hits() == std::array<std::uint64_t, 2>{0, 0});
  CHECK(with > without);
}

TEST_CASE("Reuse duel: keeps the learnt order where it gives more hits, victim for victim",
          "[reuse]") {
  // 32 blocks, eight prompts; each comes back five prompts later, past what recency keeps
  // (five new prompts and four repeats in between: 36 blocks), so recency misses nearly all.
  Cache learnt(32, false), duel(32, true);
  const std::size_t without = repeats(learnt, 2000, 5, 1.0);
  const std::size_t with = repeats(duel, 2000, 5, 1.0);
  const auto [learnt_hits, recency_hits] = duel.policy().duel_hits();
  INFO("hits without the duel " << without << ", with " << with << "; shadows: learnt "
                                << learnt_hits << ", recency " << recency_hits);
  CHECK(learnt_hits > 10 * recency_hits);
  CHECK_FALSE(duel.policy().follows_recency());
  // The shadows are the whole cache here (32 blocks, all sampled): the learnt one is the
  // policy without a duel, and the policy never left its order.
  CHECK(learnt_hits == without);
  CHECK(with == without);
}

TEST_CASE("Reuse duel: the same calls give the same choices and hits", "[reuse]") {
  Cache a(16, true), b(16, true);
  CHECK(repeats(a, 500, 1, 0.25) == repeats(b, 500, 1, 0.25));
  CHECK(a.policy().duel_hits() == b.policy().duel_hits());
  CHECK(a.policy().follows_recency() == b.policy().follows_recency());
  a.policy().reset();
  CHECK(a.policy().duel_hits() == std::array<std::uint64_t, 2>{0, 0});
  CHECK_FALSE(a.policy().follows_recency());
}
