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
                                            // The learnt shadow draws as its owner does.
                                            .seed = options.seed + (by_age ? 1 : 0),
                                            .prior = options.prior,
                                            .duel = false}),
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
  sample_all_ = rate >= 1;
  window_ = std::max<std::size_t>(256, blocks / 4);
  shadows_[0] = std::make_unique<Shadow>(blocks, options, false, history);
  shadows_[1] = std::make_unique<Shadow>(blocks, options, true, history);
}

ReuseDuel::~ReuseDuel() = default;

bool ReuseDuel::sampled(std::uint64_t request, std::span<const std::uint32_t> fingerprints) {
  if (sample_all_) return true;  // every conversation: the shadows are the cache's size
  // In with its parent: an earlier sampled request whose deepest looked-up key is among
  // these (the shadow's record, fed by lookups only, so what the real cache holds changes
  // nothing). Else drawn: a new conversation, or one whose earlier turns were left out
  // (joining the sample at this turn; nothing remembers left-out requests, whose keys may be
  // a prefix every conversation shares).
  const ReusePolicy& shadow = shadows_[0]->policy;
  for (std::size_t i = fingerprints.size(); i-- > 0;) {
    if (shadow.record_with_tail(fingerprints[i]) != ReusePolicy::npos) return true;
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
  ReusePolicy& p = s.policy;
  const auto key_of = [&p](std::uint32_t b) { return std::uint64_t{p.fp_[b]}; };
  // As the scheduler drives its cache: the lookup (the longest resident prefix is the hit)
  // touches every resident key; the store makes room for the missing ones all at once,
  // sparing this lookup's blocks, stores them (all or none) and touches the request's keys.
  hit_ids_.clear();
  missed_.clear();
  bool prefix = true;
  for (const std::uint32_t f : fingerprints) {
    const std::uint32_t b = s.index.find(f, key_of);
    if (b == SlotIndex::npos) {
      prefix = false;
      missed_.push_back(f);  // (a key repeated in the lookup: stored once, below)
      continue;
    }
    if (s.stamp[b] == replays_) continue;  // twice in one lookup
    s.stamp[b] = replays_;
    // The running request's own block (a lookup repeated) is no hit.
    if (prefix && p.owner_of(static_cast<HostBlockId>(b)) != context_.request) {
      ++s.hits;
      ++s.window;
    }
    hit_ids_.push_back(static_cast<HostBlockId>(b));
  }
  if (!hit_ids_.empty()) p.touch(hit_ids_, [](HostBlockId) { return true; });
  if (missed_.empty()) return;
  const std::size_t fresh = std::min(missed_.size(), s.stamp.size() - s.used + s.free.size());
  victims_.clear();
  if (fresh < missed_.size()) {
    const auto spare = [&s, this](HostBlockId b) {
      return s.stamp[static_cast<std::size_t>(b)] != replays_;
    };
    if (!p.select_victims(missed_.size() - fresh, spare, victims_)) return;  // no room: none
  }
  for (const HostBlockId v : victims_) {
    s.index.erase(p.fp_[static_cast<std::size_t>(v)], static_cast<std::uint32_t>(v), key_of);
    p.erase(v);
    s.free.push_back(static_cast<std::uint32_t>(v));
  }
  for (const std::uint32_t f : missed_) {
    if (s.index.find(f, key_of) != SlotIndex::npos) continue;  // repeated in the lookup
    std::uint32_t b = 0;
    if (!s.free.empty()) {
      b = s.free.back();
      s.free.pop_back();
    } else {
      b = static_cast<std::uint32_t>(s.used++);
    }
    s.stamp[b] = replays_;
    p.insert_fingerprint(b, f);
    s.index.insert(f, b, key_of);
  }
  all_ids_.clear();
  for (const std::uint32_t f : fingerprints) {
    const std::uint32_t b = s.index.find(f, key_of);
    if (b != SlotIndex::npos) all_ids_.push_back(static_cast<HostBlockId>(b));
  }
  p.touch(all_ids_, [](HostBlockId) { return true; });
}

void ReuseDuel::reset() {
  for (auto& s : shadows_) {
    s->policy.reset();
    std::fill(s->stamp.begin(), s->stamp.end(), 0);
    s->index.clear();
    s->used = 0;
    s->free.clear();
    s->hits = s->window = 0;
    s->score = 0;
  }
  seen_ = 0;
  replays_ = 0;
  recency_ahead_ = false;
  context_ = {};
}

}  // namespace kvoffload::detail
