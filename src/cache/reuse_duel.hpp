#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kvoffload/detail/slot_index.hpp"
#include "kvoffload/reuse_policy.hpp"

namespace kvoffload::detail {

/// Which order a ReusePolicy follows, chosen by the hits each gives on this traffic (issue 55:
/// the learnt values lose to recency on traffic unlike what they were learnt on). Two shadow
/// caches, each a ReusePolicy of a fraction `rate` of the capacity, one valuing by the learnt
/// table (with its owner's seed) and one by recency alone, replay the lookups of the same
/// sample of conversations (set dueling, Qureshi et al., ISCA 2007, with SHARDS-style
/// scaling, Waldspurger et al., FAST 2015). Every window their hits are added to decayed
/// scores, and the owner follows recency once the recency shadow's score is clearly the
/// higher, until it is not the higher.
///
/// A shadow replays a sampled request's lookup (every key it asked for, by the 32-bit
/// fingerprints its owner uses, resident in the owner or not) as the scheduler drives a cache:
/// the longest resident prefix, not the request's own blocks, is the hit; every resident key
/// is touched; room for the missing keys is made at once, sparing the lookup's blocks, and
/// they are stored (all or none) and all touched. Only lookups reach the shadows, so what the
/// owner holds or follows changes nothing they do. At rate 1, when each store follows its
/// lookup at once (the unit test's model), the learnt shadow is the owner's order without a
/// duel, eviction for eviction; the scheduler's later or skipped stores, blocks it protects
/// and blocks stored without a lookup (decoded ones: a shadow stores them when a later lookup
/// names them) make it close rather than exact.
///
/// rate = min(1, max(1/128, 8192 / capacity)): caches up to 8,192 blocks are replayed whole;
/// from 1,048,576 blocks on the shadows hold capacity/128 blocks each. Below rate 1 a request
/// is in the sample if an earlier sampled request's deepest looked-up key is among its keys
/// (the shadow's record), else drawn by its id: a conversation whose earlier turns were left
/// out may join at a later turn (its turn count then starts there). The recency shadow must
/// lead by kLead standard deviations to take over (leaving the learnt order costs what it
/// kept for later). Deterministic; not thread-safe.
class ReuseDuel {
 public:
  ReuseDuel(std::size_t capacity, const ReusePolicy::Options& options);
  ~ReuseDuel();
  ReuseDuel(const ReuseDuel&) = delete;
  ReuseDuel& operator=(const ReuseDuel&) = delete;

  /// Whether `request`, looking up `fingerprints`, is in the sample: if an earlier sampled
  /// request's deepest looked-up key is among them (its parent), else drawn by its id with
  /// probability `rate`.
  [[nodiscard]] bool sampled(std::uint64_t request, std::span<const std::uint32_t> fingerprints);
  void set_context(const AccessContext& context);
  /// One touch or store of the running request, its blocks' fingerprints in its order.
  void access(std::span<const std::uint32_t> fingerprints);
  /// True while the recency shadow is ahead.
  [[nodiscard]] bool recency_ahead() const { return recency_ahead_; }
  [[nodiscard]] std::array<std::uint64_t, 2> hits() const {
    return {shadows_[0]->hits, shadows_[1]->hits};
  }
  void reset();

 private:
  struct Shadow {
    Shadow(std::size_t capacity, const ReusePolicy::Options& options, bool by_age,
           std::size_t history);
    ReusePolicy policy;
    std::vector<std::uint32_t> stamp;  // per shadow block: the last replay that saw it
    SlotIndex index;                   // block by fingerprint (the policy's fp_)
    std::size_t used = 0;              // blocks handed out so far (the rest were never used)
    std::vector<std::uint32_t> free;   // evicted for a key repeated in its lookup: unused
    std::uint64_t hits = 0, window = 0;
    double score = 0;
  };
  void replay(Shadow& s, std::span<const std::uint32_t> fingerprints);
  [[nodiscard]] bool draw(std::uint64_t request) const;

  std::uint64_t threshold_;  // draw(): the top 24 bits of a mixed request id below this
  std::size_t window_;       // accesses between score updates
  std::size_t seen_ = 0;
  std::uint32_t replays_ = 0;                       // stamps
  std::array<std::unique_ptr<Shadow>, 2> shadows_;  // learnt order, recency
  bool recency_ahead_ = false;
  AccessContext context_;
  std::vector<HostBlockId> hit_ids_, all_ids_, victims_;
  std::vector<std::uint32_t> missed_;
  bool sample_all_ = true;  // rate 1
};

}  // namespace kvoffload::detail
