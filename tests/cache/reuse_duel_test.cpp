// Policy reuse's duel (issue 55): two shadow caches replay a sample of the lookups, one by the
// learnt values and one by recency, and the policy follows the one with more hits. Driven
// here as the scheduler drives it (lookup, touch of what was found, stores, touch of all).

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include <catch2/catch_test_macros.hpp>

#include "cache/reuse_duel.hpp"
#include "kvoffload/host_block_manager.hpp"
#include "kvoffload/reuse_policy.hpp"

using namespace kvoffload;

namespace {

Key key(int i) {
  const std::uint8_t bytes[] = {0xd0, static_cast<std::uint8_t>(i & 0xff),
                                static_cast<std::uint8_t>((i >> 8) & 0xff),
                                static_cast<std::uint8_t>(i >> 16)};
  return Key{BlockHash::from_bytes(bytes), 0};
}

/// A host cache of `capacity` blocks over a ReusePolicy, driven as the scheduler drives the
/// manager: the lookup touches every resident key (the hit is the resident prefix); the store
/// makes room for the missing keys at once, sparing the lookup's blocks, stores them (all or
/// none) and touches all; blocks computed while decoding are stored with no lookup.
class Cache {
 public:
  Cache(std::size_t capacity, bool duel, std::uint64_t seed = 1)
      : policy_(capacity, {.seed = seed, .duel = duel}), capacity_(capacity) {}

  /// One request of `blocks` key ids at `now`, then `decoded` more stored; returns its hit.
  std::size_t request(std::uint64_t id, double now, const std::vector<int>& blocks,
                      const std::vector<int>& decoded = {}) {
    std::vector<Key> keys;
    for (const int b : blocks) keys.push_back(key(b));
    policy_.set_context({id, now, -1});
    policy_.looked_up(keys);
    std::vector<HostBlockId> resident;
    std::size_t hit = 0;
    bool prefix = true;
    for (const int b : blocks) {
      const auto it = slot_.find(b);
      prefix = prefix && it != slot_.end();
      if (it == slot_.end()) continue;
      resident.push_back(it->second);
      if (prefix) ++hit;
    }
    policy_.touch(resident, [](HostBlockId) { return true; });
    store(blocks, resident);
    if (!decoded.empty()) {
      std::vector<int> all = blocks;
      all.insert(all.end(), decoded.begin(), decoded.end());
      store(all, {});
    }
    policy_.set_context({});
    return hit;
  }
  ReusePolicy& policy() { return policy_; }

 private:
  void store(const std::vector<int>& blocks, const std::vector<HostBlockId>& spare) {
    std::vector<int> missing;
    for (const int b : blocks) {
      if (!slot_.contains(b)) missing.push_back(b);
    }
    if (missing.empty()) return;
    const std::size_t fresh = std::min(missing.size(), capacity_ - key_of_.size() + free_.size());
    if (fresh < missing.size()) {
      const auto can_go = [&](HostBlockId x) {
        return std::find(spare.begin(), spare.end(), x) == spare.end();
      };
      std::vector<HostBlockId> v;
      if (!policy_.select_victims(missing.size() - fresh, can_go, v)) return;
      for (const HostBlockId b : v) {
        policy_.evict(b, key(key_of_[static_cast<std::size_t>(b)]));
        slot_.erase(key_of_[static_cast<std::size_t>(b)]);
        free_.push_back(b);
      }
    }
    for (const int k : missing) {
      HostBlockId b = 0;
      if (!free_.empty()) {
        b = free_.back();
        free_.pop_back();
        key_of_[static_cast<std::size_t>(b)] = k;
      } else {
        b = static_cast<HostBlockId>(key_of_.size());
        key_of_.push_back(k);
      }
      slot_[k] = b;
      policy_.insert(b, key(k));
    }
    std::vector<HostBlockId> all;
    for (const int k : blocks) all.push_back(slot_.at(k));
    policy_.touch(all, [](HostBlockId) { return true; });
  }

  ReusePolicy policy_;
  std::size_t capacity_;
  std::map<int, HostBlockId> slot_;
  std::vector<int> key_of_;
  std::vector<HostBlockId> free_;
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

struct Compared {
  std::size_t without, with;
  std::uint64_t learnt_hits, recency_hits;  // the duel's shadows
};

/// The repeats `later` prompts apart through a policy without and one with the duel.
Compared both(Cache& plain, Cache& duel, int later) {
  Compared c{repeats(plain, 2000, later, 1.0), repeats(duel, 2000, later, 1.0), 0, 0};
  c.learnt_hits = duel.policy().duel_hits()[0];
  c.recency_hits = duel.policy().duel_hits()[1];
  UNSCOPED_INFO("hits without the duel " << c.without << ", with " << c.with << "; shadows: learnt "
                                         << c.learnt_hits << ", recency " << c.recency_hits);
  return c;
}

}  // namespace

TEST_CASE("Reuse duel: follows recency where recency gives more hits", "[reuse]") {
  // 16 blocks, four prompts; each comes back right after the next one. Recency keeps every
  // repeat (8,000 of 8,000 blocks); the learnt values (the conversation trace's, where a
  // minute-old first turn is worth more than a young one) lose some.
  Cache learnt(16, false), duel(16, true);
  const auto [without, with, learnt_hits, recency_hits] = both(learnt, duel, 1);
  CHECK(recency_hits == 8000);  // every repeat's 4 blocks: recency keeps the last 4 prompts
  CHECK(learnt_hits < recency_hits);
  CHECK(duel.policy().follows_recency());
  CHECK_FALSE(learnt.policy().follows_recency());
  CHECK(learnt.policy().duel_hits() == std::array<std::uint64_t, 2>{0, 0});
  CHECK(with > without);
}

TEST_CASE("Reuse duel: keeps the learnt order where it gives more hits, with the same hits",
          "[reuse]") {
  // 32 blocks, eight prompts; each comes back five prompts later, past what recency keeps
  // (five new prompts and four repeats in between: 36 blocks), so recency misses nearly all.
  Cache learnt(32, false), duel(32, true);
  const auto [without, with, learnt_hits, recency_hits] = both(learnt, duel, 5);
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

namespace {

/// Conversations: a request continues a recent prompt (two times in three) or starts one,
/// adds 1-6 blocks, arrives 0-20 s after the one before, and maybe stores 0-2 blocks it
/// decoded (`decode`). Returns the hits summed.
std::size_t conversations(Cache& c, std::uint64_t seed, int requests, bool decode) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int>> prompts;
  int next_key = 0;
  double now = 0;
  std::size_t hits = 0;
  for (int r = 1; r <= requests; ++r) {
    std::vector<int> prompt;
    if (!prompts.empty() && rng() % 3 != 0) prompt = prompts[rng() % prompts.size()];
    const int extra = 1 + static_cast<int>(rng() % 6);
    for (int i = 0; i < extra; ++i) prompt.push_back(next_key++);
    if (prompt.size() > 40) prompt.resize(40);
    std::vector<int> decoded;
    const int d = decode ? static_cast<int>(rng() % 3) : 0;
    for (int i = 0; i < d && prompt.size() + decoded.size() < 40; ++i) {
      decoded.push_back(next_key++);
    }
    now += static_cast<double>(rng() % 20);
    hits += c.request(static_cast<std::uint64_t>(r), now, prompt, decoded);
    prompt.insert(prompt.end(), decoded.begin(), decoded.end());
    prompts.push_back(prompt);
    if (prompts.size() > 60) prompts.erase(prompts.begin());
  }
  return hits;
}

}  // namespace

TEST_CASE("Reuse duel: a cache replayed whole is the learnt order exactly, whatever it follows",
          "[reuse]") {
  // Up to 8,192 blocks every lookup is replayed, so the learnt shadow must count exactly the
  // hits of the same policy without a duel, whether the policy itself follows recency or not
  // (the shadows see lookups only, never what the real cache holds).
  const auto seed = std::random_device{}();
  INFO("seed " << seed);
  for (const std::size_t capacity : {8, 48, 200}) {
    Cache plain(capacity, false, seed), duel(capacity, true, seed);
    const std::size_t without = conversations(plain, seed, 4000, false);
    conversations(duel, seed, 4000, false);
    INFO("capacity " << capacity << ": hits without the duel " << without << "; shadows "
                     << duel.policy().duel_hits()[0] << ", " << duel.policy().duel_hits()[1]);
    CHECK(duel.policy().duel_hits()[0] == without);
  }
}

TEST_CASE("Reuse duel: continuations are replayed when their parent stored decoded blocks",
          "[reuse]") {
  // The real cache's deepest block of a turn is one it decoded, which no lookup names; the
  // next turn must still be in the sample and hit in the shadows.
  Cache c(64, true);
  c.request(1, 0, {0, 1, 2, 3}, {4});
  c.request(2, 10, {0, 1, 2, 3, 4, 5});
  // The shadows saw turn 1's four prompt blocks; turn 2 finds them (block 4 was decoded, so
  // the shadows store it now).
  CHECK(c.policy().duel_hits() == std::array<std::uint64_t, 2>{4, 4});
  Cache d(64, true, 3);
  const std::size_t hits = conversations(d, 3, 2000, true);
  INFO("hits " << hits << "; shadows " << d.policy().duel_hits()[0] << ", "
               << d.policy().duel_hits()[1]);
  CHECK(d.policy().duel_hits()[0] > hits / 2);
}

TEST_CASE("Reuse duel: a sampled conversation stays in, at the rate for its capacity", "[reuse]") {
  // 65,536 blocks: rate 8192/65536 = 1/8. A first turn is drawn; a sampled conversation's
  // continuations stay in, through decoded blocks that no lookup named. Every prompt starts
  // with a shared block (a system prompt), and every tenth request is that block alone: it
  // must neither keep new conversations out nor let them all in, whatever the request ids.
  constexpr std::uint32_t kShared = 7;
  for (const std::uint64_t first_id : {0, 1, 2, 3, 4, 5}) {
    detail::ReuseDuel duel(65536, ReusePolicy::Options{});
    int conversations_in = 0, later_turns_in = 0;
    std::uint64_t request = first_id;
    const auto ask = [&](const std::vector<std::uint32_t>& keys) {
      duel.set_context({++request, static_cast<double>(request), -1});
      const bool sampled = duel.sampled(request, keys);
      if (sampled) duel.access(keys);
      return sampled;
    };
    for (int c = 0; c < 4000; ++c) {
      if (c % 10 == 0) ask({kShared});
      std::vector<std::uint32_t> keys{kShared};
      bool in = false;
      for (int turn = 0; turn < 3; ++turn) {
        for (int i = 0; i < 3; ++i) {
          keys.push_back(static_cast<std::uint32_t>(100 + c * 64 + turn * 8 + i));
        }
        const bool sampled = ask(keys);
        INFO("ids from " << first_id << ", conversation " << c << " turn " << turn);
        if (in) REQUIRE(sampled);  // in with its parent
        if (turn == 0) conversations_in += sampled ? 1 : 0;
        if (turn > 0 && !in) later_turns_in += sampled ? 1 : 0;  // joined at a later turn
        in = in || sampled;
        keys.push_back(static_cast<std::uint32_t>(100 + c * 64 + turn * 8 + 5));  // decoded
      }
    }
    INFO("ids from " << first_id << ": " << conversations_in << " first turns in, "
                     << later_turns_in << " joined later");
    // 500 expected; a sampled request of the shared block alone lets the next new
    // conversation in until a sampled request extends past it (about 50 such).
    CHECK(conversations_in > 400);
    CHECK(conversations_in < 650);
    // A left-out conversation joins at each later turn with probability 1/8: about 820.
    CHECK(later_turns_in > 650);
    CHECK(later_turns_in < 1000);
  }
}

TEST_CASE("Reuse duel: the manager passes every lookup on", "[reuse]") {
  // The repeats of the first test through HostBlockManager::touch(keys), as the scheduler
  // calls it: the duel must see them and take over.
  ManagerConfig mc;
  mc.host_blocks = 16;
  mc.policy = EvictionPolicyKind::reuse;
  HostBlockManager m(mc);
  PreparedStore prepared;
  std::uint64_t id = 0;
  const auto ask = [&](double now, int p) {
    std::vector<Key> keys;
    for (int i = 0; i < 4; ++i) keys.push_back(key(4 * p + i));
    m.set_context({++id, now, -1});
    m.touch(keys);
    if (m.prepare_store(keys, prepared)) {
      m.touch_blocks(prepared.key_blocks);
      m.complete_store_blocks(prepared.block_ids, true);
    }
    m.set_context({});
  };
  for (int i = 0; i < 2001; ++i) {
    if (i < 2000) ask(100.0 + i, i);
    if (i >= 1) ask(100.5 + i, i - 1);
  }
  const auto& policy = dynamic_cast<const ReusePolicy&>(m.policy());
  INFO("shadows " << policy.duel_hits()[0] << ", " << policy.duel_hits()[1]);
  CHECK(policy.duel_hits()[1] == 8000);
  CHECK(policy.follows_recency());
}
