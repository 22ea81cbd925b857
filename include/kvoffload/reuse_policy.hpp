#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvoffload/detail/slot_index.hpp"
#include "kvoffload/eviction_policy.hpp"

namespace kvoffload {

namespace detail {
class ReuseDuel;
}

/// Eviction that predicts reuse (issue 55; docs/bench/trace.md, "Policy reuse"). A block
/// belongs to the request that last stored or touched it (its owner, from AccessContext). An
/// owner's value is its hit density (LHD: Beckmann et al., NSDI 2018) at its age since its
/// last use: the chance its conversation is continued given it was not yet, over the expected
/// wait for that, learnt online per class of owner: the chain's turn count (1, 2, 3, 4+: how
/// often the prefix was extended, found through the hash of each request's deepest block) and
/// the gap since the previous turn (none, <= 30 s, <= 300 s, more). A block another
/// conversation used too (a shared system prompt) is worth at least 1/age once it is an
/// owner's deepest block left; an engine's hint (AccessContext's `continues`) multiplies the
/// value by 4 (continues) or 1/20 (ends; not for such shared blocks). Eviction samples
/// `samples` owners with a seeded generator, never the request the store is for, and takes
/// the deepest block of the least valuable one, ending an owner's turn at a block that cannot
/// go (no holes); all or nothing as for LRU: when sampling finds too few, a last resort takes
/// any block that can go, the storing request's last. Deterministic: the same calls give the
/// same victims. Blocks stored with no request behind them (AccessContext{}: a tier's index,
/// promotions) belong to anonymous owners of up to 64 blocks a clock tick, valued by age.
/// With `duel` (the default), two shadow caches replay a sample of the lookups
/// (detail::ReuseDuel), one by these values and one by age alone, and the policy values by
/// age alone while the second has clearly more hits: traffic unlike what the values were
/// learnt on falls back to recency rather than below it.
///
/// Costs O(1) per insert, touch and evicted block (O(samples) per sampled owner); the parent
/// search hashes each id of a request's first two touches; the duel replays a sampled lookup
/// in both shadows (every lookup for caches up to 8,192 blocks). Memory: 16 bytes and a bit a
/// block plus, per owner record, 72 bytes, two 4-byte index entries (at a load of 1/4 to 1/2)
/// and a 4-byte entry in the active list or the history ring; the records are the owners
/// holding blocks and a history of max(4096, capacity / 32) finished ones, grown by a quarter
/// at a time; the duel's shadows, min(capacity, max(8192, capacity / 128)) blocks each, with
/// their own records. 95-99 bytes a stored block for the whole manager with requests of 16
/// blocks at 1M-10M blocks; below 1M the shadows are a fixed 0.7 MB (140 bytes a block at
/// 16K blocks; docs/bench/trace.md). Not thread-safe: the manager calls it.
class KVOFFLOAD_EXPORT ReusePolicy final : public EvictionPolicy {
 public:
  static constexpr std::size_t kTurns = 4;  // 1, 2, 3, 4+
  static constexpr std::size_t kGaps = 4;   // none, <= 30 s, <= 300 s, more
  static constexpr std::size_t kAges = 14;  // 0, 1, 2, 4, ... 4096 s
  static constexpr std::size_t kClasses = kTurns * kGaps;

  struct Options {
    std::uint32_t samples = 64;  ///< owners compared per victim
    std::uint64_t seed = 1;      ///< the sampler's seed
    /// Start from the counts learnt on the first half of the Mooncake conversation trace
    /// (false: from nothing, valuing owners by age alone until a class has continuations).
    bool prior = true;
    /// Follow whichever order gives more hits now: the learnt values or recency alone, as
    /// two shadow caches replaying a sample of the conversations tell (detail::ReuseDuel).
    bool duel = true;
  };

  explicit ReusePolicy(std::size_t capacity) : ReusePolicy(capacity, Options{}) {}
  ReusePolicy(std::size_t capacity, Options options);
  ~ReusePolicy() override;
  ReusePolicy(const ReusePolicy&) = delete;
  ReusePolicy& operator=(const ReusePolicy&) = delete;

  void set_context(const AccessContext& context) override;
  void looked_up(std::span<const Key> keys) override;
  void insert(HostBlockId id, const Key& key) override;
  void touch(std::span<const HostBlockId> ids,
             detail::function_ref<bool(HostBlockId)> ready) override;
  bool select_victims(std::size_t count, detail::function_ref<bool(HostBlockId)> can_evict,
                      std::vector<HostBlockId>& victims) override;
  void evict(HostBlockId id, const Key& key) override;
  void erase(HostBlockId id) override;
  void reset() override;

  // Introspection for tests and statistics.
  /// The request owning block `id`, 0 if none (or an anonymous owner's id, which has bit 63).
  [[nodiscard]] std::uint64_t owner_of(HostBlockId id) const;
  /// The turn count found for `request` (1 if it had no parent), 0 if it owns no record.
  [[nodiscard]] std::uint32_t turn_of(std::uint64_t request) const;
  /// The value eviction compares for `request` now (the least goes first); -1 if unknown.
  [[nodiscard]] double value_of(std::uint64_t request) const;
  /// The blocks of `request`, first to deepest.
  [[nodiscard]] std::vector<HostBlockId> blocks_of(std::uint64_t request) const;
  /// Owners holding at least one block; owner records in use (with the history).
  [[nodiscard]] std::size_t active_owners() const { return active_.size(); }
  [[nodiscard]] std::size_t owner_records() const { return slot_of_.size(); }
  [[nodiscard]] std::size_t resident() const { return resident_; }
  /// Whether eviction follows recency alone now (the duel's recency shadow is ahead).
  [[nodiscard]] bool follows_recency() const { return by_age_; }
  /// The duel's shadows' hits so far (learnt order, recency); zeros without a duel.
  [[nodiscard]] std::array<std::uint64_t, 2> duel_hits() const;

 private:
  static constexpr std::uint32_t npos = 0xffffffffU;
  static constexpr std::uint8_t kNone = 0xff;
  // 72 bytes: a record per request holding blocks, and the history's.
  struct Owner {
    std::uint64_t request = 0;  // 0: a free record
    std::uint64_t parent = 0;   // the request whose turn it continues (0: none)
    double last = 0;            // its last access
    // When it was first seen: milliseconds of the clock modulo 2^32. Only differences are
    // used, as signed milliseconds: a gap under 24.8 days comes out right whatever the
    // clock's origin (to the millisecond below about 4.7 hours: `gap` is a float).
    std::uint32_t first_ms = 0;
    float gap = -1;          // seconds since its parent's first access (-1: no parent)
    std::uint32_t tail = 0;  // fingerprint of its deepest block at its last touch (0: none)
    std::uint32_t head = npos, back = npos, blocks = 0;
    std::uint32_t active_index = npos;  // in active_
    std::uint32_t stamp = 0;            // select_victims' visit mark
    // With stamp: the next block that call may take; if `held`, the block that ended its turn.
    std::uint32_t cursor = npos;
    std::uint8_t turn = 1;
    std::int8_t continues = -1;
    std::uint8_t scans = 0;        // parent searches done (at most 2)
    std::uint8_t counted = kNone;  // the class its birth is counted in (kNone: not yet)
    std::uint8_t parent_class = kNone, parent_bucket = kNone;  // the continuation it counted
    bool queued = false;                                       // in the history FIFO
    bool held = false;                                         // with stamp: see cursor
  };
  static_assert(sizeof(Owner) <= 72, "an owner record is 72 bytes (the memory budget counts it)");
  struct Counts {
    double born = 0;
    std::array<double, kAges + 1> cont{};  // continuations by the gap's age bucket
    std::array<double, kAges + 1> sum{};   // their gaps' sum
  };

  friend class detail::ReuseDuel;
  void insert_fingerprint(std::uint32_t block, std::uint32_t fingerprint);
  /// The record whose deepest block (tail) is `fingerprint`, npos if none.
  [[nodiscard]] std::uint32_t record_with_tail(std::uint32_t fingerprint) const;
  [[nodiscard]] static std::uint32_t fingerprint_of(const Key& key);
  std::uint32_t owner_for_context();
  std::uint32_t new_owner(std::uint64_t request);
  void attach(std::uint32_t block, std::uint32_t owner);
  void detach(std::uint32_t block);
  /// Takes `block` out of o's list / puts it at the back (links only, no counts).
  void unlink(std::uint32_t block, Owner& o);
  void append(std::uint32_t block, Owner& o);
  void find_parent(std::uint32_t owner, std::span<const HostBlockId> ids);
  void set_tail(std::uint32_t owner, std::uint32_t fingerprint);
  void count_birth(std::uint32_t owner);
  void refresh_table();
  void start_counts();
  /// Its value with `deepest` its deepest block left (the floor for a shared one).
  [[nodiscard]] double value(const Owner& o, std::uint32_t deepest) const;
  [[nodiscard]] static std::size_t class_of(const Owner& o);
  [[nodiscard]] static std::size_t bucket_of(double seconds);
  /// `seconds` in milliseconds modulo 2^32 (any finite clock value).
  [[nodiscard]] static std::uint32_t wrapped_ms(double seconds);
  std::uint64_t next_random();
  /// Appends owner's deepest block not taken yet in this call if it can go; else ends the
  /// owner's turn in this call (false).
  bool take_one(std::uint32_t owner, detail::function_ref<bool(HostBlockId)> can_evict,
                std::vector<HostBlockId>& victims);
  /// The last resort: up to `need` of its blocks not taken yet that can go, past any that
  /// cannot. Returns how many.
  std::size_t take_rest(std::uint32_t owner, std::size_t need,
                        detail::function_ref<bool(HostBlockId)> can_evict,
                        std::vector<HostBlockId>& victims);

  Options options_;
  std::size_t history_limit_;  // finished owners remembered (for their continuations' turns)
  std::size_t max_owners_;
  // Per block, 16 bytes and a bit: its owner, its neighbours in the owner's list, a 32-bit
  // fingerprint of its key (never 0) and whether another conversation used it too.
  std::vector<std::uint32_t> owner_, prev_, next_, fp_;
  std::vector<bool> shared_;
  std::size_t resident_ = 0;
  // Owners: records, the active ones (holding blocks) densely for sampling, finished ones in
  // a FIFO whose oldest record is reused first.
  std::vector<Owner> owners_;
  std::vector<std::uint32_t> active_;
  std::vector<std::uint32_t> history_;  // a ring, doubled from 64 up to max_owners_ entries
  std::size_t history_head_ = 0, history_size_ = 0;
  // Record by request, and by tail fingerprint (of records whose tail nobody took over):
  // indexes of 4-byte entries that read the keys back from the records.
  detail::SlotIndex slot_of_, chain_;
  [[nodiscard]] auto request_key() const {
    return [this](std::uint32_t s) { return owners_[s].request; };
  }
  [[nodiscard]] auto tail_key() const {
    return [this](std::uint32_t s) { return std::uint64_t{owners_[s].tail}; };
  }
  AccessContext context_;
  std::uint64_t anonymous_ = 0;  // the last anonymous owner's request id
  std::uint32_t anonymous_slot_ = npos;
  double now_ = 0;
  std::uint64_t rng_;
  std::uint32_t stamp_ = 0;
  // What it learnt: counts per class (halved every kHalveEvery births), and the table of hit
  // densities by class and age bucket they give.
  std::array<Counts, kClasses> counts_{};
  std::array<std::array<double, kAges>, kClasses + 1> table_{};  // the last row: all classes
  std::array<bool, kClasses + 1> known_{};
  std::uint64_t events_ = 0;
  bool by_age_ = false;  // value by recency alone (the duel's choice, or a shadow's order)
  std::unique_ptr<detail::ReuseDuel> duel_;
  std::vector<std::uint32_t> scratch_;  // the fingerprints a lookup passes to the duel
};

}  // namespace kvoffload
