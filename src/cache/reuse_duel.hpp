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
/// table and one by recency alone, replay the blocks of the same sample of conversations (a
/// fraction `rate` of them, a continuation in its parent's sample; set dueling, Qureshi et
/// al., ISCA 2007, with SHARDS-style scaling, Waldspurger et al., FAST 2015). Every window
/// their hits are added to decayed scores, and the owner follows recency once the recency
/// shadow's score is clearly the higher, until it is not the higher. A shadow replays each sampled
/// request's lookup (every key it asked for, by the 32-bit fingerprints the owner uses, resident in
/// the owner or not, so that what the owner holds changes nothing): a key resident in the shadow
/// and not the request's own is a hit; the misses are stored, room made by the shadow's own order.
///
/// rate = min(1, max(1/128, 8192 / capacity)): caches up to 8,192 blocks are replayed whole
/// (the shadows are then the two orders exactly); from 1,048,576 blocks on the shadows hold
/// capacity/128 blocks each, under a byte a block of the owner's capacity
/// (docs/bench/trace.md). The recency shadow must lead by kLead standard deviations to take
/// over (leaving the learnt order costs what it kept for later). Deterministic; not
/// thread-safe.
class ReuseDuel {
 public:
  ReuseDuel(std::size_t capacity, const ReusePolicy::Options& options);
  ~ReuseDuel();
  ReuseDuel(const ReuseDuel&) = delete;
  ReuseDuel& operator=(const ReuseDuel&) = delete;

  /// Whether `request`, looking up `fingerprints`, is in the sample: as its parent (the
  /// request whose deepest block is the deepest of them: in the sample if the shadows hold
  /// its record, out if only `owner` does), else drawn by its id with probability `rate`.
  [[nodiscard]] bool sampled(const ReusePolicy& owner, std::uint64_t request,
                             std::span<const std::uint32_t> fingerprints) const;
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
    std::vector<std::uint32_t> fp;     // per shadow block: its fingerprint (0: free)
    std::vector<std::uint32_t> stamp;  // per shadow block: the last replay that counted it
    SlotIndex index;                   // block by fingerprint
    std::size_t used = 0;              // blocks handed out so far (the rest were never used)
    std::uint64_t hits = 0, window = 0;
    double score = 0;
  };
  void replay(Shadow& s, std::span<const std::uint32_t> fingerprints);
  [[nodiscard]] bool draw(std::uint64_t request) const;
  std::uint32_t room(Shadow& s);

  std::uint64_t threshold_;  // draw(): the top 24 bits of a mixed request id below this
  std::size_t window_;       // accesses between score updates
  std::size_t seen_ = 0;
  std::uint32_t replays_ = 0;                       // stamps
  std::array<std::unique_ptr<Shadow>, 2> shadows_;  // learnt order, recency
  bool recency_ahead_ = false;
  AccessContext context_;
  std::vector<HostBlockId> hit_ids_, all_ids_, victims_;
  std::vector<std::uint32_t> missed_;
};

}  // namespace kvoffload::detail
