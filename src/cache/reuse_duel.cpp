#include "cache/reuse_duel.hpp"

#include <algorithm>
#include <cmath>

#include "kvoffload/detail/flat_hash_map.hpp"

namespace kvoffload::detail {

namespace {
constexpr std::size_t kWhole = 8192;  // caches up to this many blocks are replayed whole
constexpr double kMinRate = 1.0 / 128;
constexpr double kKeep = 31.0 / 32;  // a score keeps this much of itself each window
constexpr double kLead = 3.0;        // standard deviations recency must lead by to take over
constexpr std::uint64_t kDrawSalt = 0xd1b54a32d192ed03ULL;

double rate_for(std::size_t capacity) {
  if (capacity <= kWhole) return 1.0;
  return std::max(kMinRate, static_cast<double>(kWhole) / static_cast<double>(capacity));
}
}  // namespace

ReuseDuel::Shadow::Shadow(std::size_t capacity, const ReusePolicy::Options& options, bool by_age,
                          std::size_t history)
    : policy(capacity, ReusePolicy::Options{.samples = options.samples,
                                            .seed = options.seed + (by_age ? 2 : 1),
                                            .prior = options.prior,
                                            .duel = false}),
      fp(capacity, 0),
      stamp(capacity, 0) {
  policy.by_age_ = by_age;
  // A shadow sees `rate` of the conversations: it needs that share of the owner's history.
  policy.history_limit_ = history;
  policy.max_owners_ = capacity + history + 1;
}

ReuseDuel::ReuseDuel(std::size_t capacity, const ReusePolicy::Options& options) {
  const double rate = rate_for(capacity);
  const auto blocks = std::max<std::size_t>(
      1, static_cast<std::size_t>(std::llround(rate * static_cast<double>(capacity))));
  const auto history = std::max<std::size_t>(
      {256, blocks / 32,
       static_cast<std::size_t>(
           std::ceil(rate * static_cast<double>(std::max<std::size_t>(4096, capacity / 32))))});
  threshold_ = static_cast<std::uint64_t>(std::ceil(rate * 16777216.0));
  window_ = std::max<std::size_t>(256, blocks / 4);
  shadows_[0] = std::make_unique<Shadow>(blocks, options, false, history);
  shadows_[1] = std::make_unique<Shadow>(blocks, options, true, history);
}

ReuseDuel::~ReuseDuel() = default;

bool ReuseDuel::sampled(const ReusePolicy& owner, std::uint64_t request,
                        std::span<const std::uint32_t> fingerprints) const {
  const ReusePolicy& shadow = shadows_[0]->policy;
  for (std::size_t i = fingerprints.size(); i-- > 0;) {
    if (shadow.record_with_tail(fingerprints[i]) != ReusePolicy::npos) return true;
    const std::uint32_t r = owner.record_with_tail(fingerprints[i]);
    if (r != ReusePolicy::npos && owner.owners_[r].request != request) return false;
  }
  return draw(request);
}

bool ReuseDuel::draw(std::uint64_t request) const {
  return (mix64(request ^ kDrawSalt) >> 40) < threshold_;
}

void ReuseDuel::set_context(const AccessContext& context) {
  context_ = context;
  for (auto& s : shadows_) s->policy.set_context(context);
}

void ReuseDuel::access(std::span<const std::uint32_t> fingerprints) {
  if (++replays_ == 0) {  // wrapped: clear the stamps
    for (auto& s : shadows_) std::fill(s->stamp.begin(), s->stamp.end(), 0);
    replays_ = 1;
  }
  for (auto& s : shadows_) replay(*s, fingerprints);
  seen_ += fingerprints.size();
  if (seen_ < window_) return;
  seen_ = 0;
  for (auto& s : shadows_) {
    s->score = s->score * kKeep + static_cast<double>(s->window);
    s->window = 0;
  }
  // Leaving the learnt order costs what it kept for later (a burst of recency evicts it), so
  // recency must lead by kLead standard deviations of the scores' difference (hits as
  // Poisson counts); it keeps the lead while ahead at all.
  const double lead = shadows_[1]->score - shadows_[0]->score;
  recency_ahead_ =
      recency_ahead_ ? lead > 0 : lead > kLead * std::sqrt(shadows_[1]->score + shadows_[0]->score);
}

void ReuseDuel::replay(Shadow& s, std::span<const std::uint32_t> fingerprints) {
  const auto key_of = [&s](std::uint32_t b) { return std::uint64_t{s.fp[b]}; };
  ReusePolicy& p = s.policy;
  // The parent first (the deepest key that is an earlier request's deepest block), so that
  // the touch below takes its blocks as a continuation's, not as another conversation's.
  const std::uint32_t self = p.owner_for_context();
  for (std::size_t i = fingerprints.size(); i-- > 0;) {
    if (p.adopt_parent(self, fingerprints[i])) break;
  }
  hit_ids_.clear();
  missed_.clear();
  for (const std::uint32_t f : fingerprints) {
    const std::uint32_t b = s.index.find(f, key_of);
    if (b == SlotIndex::npos) {
      missed_.push_back(f);
    } else if (s.stamp[b] != replays_) {
      s.stamp[b] = replays_;
      // The running request's own block (a lookup repeated) is no hit.
      if (p.owner_of(static_cast<HostBlockId>(b)) != context_.request) {
        ++s.hits;
        ++s.window;
      }
      hit_ids_.push_back(static_cast<HostBlockId>(b));
    }
  }
  // The hits become the request's (so that making room below spares them), then the misses
  // are stored, then one touch of all in the request's order, as the scheduler's store does.
  if (!hit_ids_.empty()) p.touch(hit_ids_, [](HostBlockId) { return true; });
  for (const std::uint32_t f : missed_) {
    if (s.index.find(f, key_of) != SlotIndex::npos) continue;  // twice in one lookup
    const std::uint32_t b = room(s);
    if (b == SlotIndex::npos) break;
    s.fp[b] = f;
    s.stamp[b] = replays_;
    s.index.insert(f, b, key_of);
    p.insert_fingerprint(b, f);
  }
  all_ids_.clear();
  for (const std::uint32_t f : fingerprints) {
    const std::uint32_t b = s.index.find(f, key_of);
    if (b != SlotIndex::npos) all_ids_.push_back(static_cast<HostBlockId>(b));
  }
  p.touch(all_ids_, [](HostBlockId) { return true; });
}

std::uint32_t ReuseDuel::room(Shadow& s) {
  if (s.used < s.fp.size()) return static_cast<std::uint32_t>(s.used++);
  victims_.clear();
  if (!s.policy.select_victims(
          1, [](HostBlockId) { return true; }, victims_)) {
    return SlotIndex::npos;
  }
  const auto b = static_cast<std::uint32_t>(victims_.front());
  s.policy.erase(victims_.front());
  s.index.erase(s.fp[b], b, [&s](std::uint32_t x) { return std::uint64_t{s.fp[x]}; });
  s.fp[b] = 0;
  return b;
}

void ReuseDuel::reset() {
  for (auto& s : shadows_) {
    s->policy.reset();
    std::fill(s->fp.begin(), s->fp.end(), 0);
    std::fill(s->stamp.begin(), s->stamp.end(), 0);
    s->index.clear();
    s->used = 0;
    s->hits = s->window = 0;
    s->score = 0;
  }
  seen_ = 0;
  replays_ = 0;
  recency_ahead_ = false;
  context_ = {};
}

}  // namespace kvoffload::detail
