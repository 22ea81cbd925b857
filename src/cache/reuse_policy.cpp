#include "kvoffload/reuse_policy.hpp"

#include <algorithm>
#include <cmath>

#include "cache/reuse_duel.hpp"
#include "common/expects.hpp"

namespace kvoffload {

namespace {
constexpr std::uint64_t kAnonymous = std::uint64_t{1} << 63;  // owners without a request
constexpr std::uint32_t kAnonymousBlocks = 64;  // blocks an anonymous owner takes at one time
constexpr std::uint64_t kRefreshEvery = 256;    // births between recomputed tables
constexpr std::uint64_t kHalveEvery = 8192;     // births between halvings of the counts
constexpr double kHintContinues = 4.0;
constexpr double kHintEnds = 0.05;

// What the policy starts from: the counts it learnt on the first half of the Mooncake
// conversation trace (issue 55: tuned on the first half by time, reported on the second; the
// first 5376 requests with a class), per class with births: the class, births, continuations
// by the age bucket of their gap (0, 1, 2, 4, ... 4096 s, more) and those gaps' sums in
// seconds. Online counts add to them, and every kHalveEvery births all counts are halved, so
// another workload's own counts take over.
struct Prior {
  std::uint8_t cls;
  std::uint16_t born;
  std::array<std::uint16_t, 15> cont;
  std::array<std::uint32_t, 15> sum;
};
constexpr std::array<Prior, 10> kPrior{{
    {0,
     3215,
     {378, 0, 0, 44, 1, 11, 14, 119, 201, 158, 151, 67, 7, 0, 0},
     {0, 0, 0, 132, 6, 147, 333, 5967, 18480, 28926, 54831, 44211, 8721, 0, 0}},
    {5,
     447,
     {67, 0, 0, 7, 1, 3, 8, 26, 35, 19, 14, 10, 0, 0, 0},
     {0, 0, 0, 21, 6, 36, 228, 1323, 3216, 3504, 5148, 6729, 0, 0, 0}},
    {6,
     514,
     {65, 0, 0, 10, 0, 1, 5, 21, 51, 48, 27, 5, 0, 0, 0},
     {0, 0, 0, 30, 0, 12, 132, 1044, 4857, 8634, 9552, 3078, 0, 0, 0}},
    {7,
     190,
     {24, 0, 0, 2, 0, 0, 0, 6, 11, 12, 19, 6, 0, 0, 0},
     {0, 0, 0, 6, 0, 0, 0, 276, 1053, 2100, 6570, 3714, 0, 0, 0}},
    {9,
     193,
     {28, 0, 0, 3, 0, 1, 3, 8, 17, 15, 10, 2, 0, 0, 0},
     {0, 0, 0, 9, 0, 12, 69, 372, 1686, 2661, 3900, 1437, 0, 0, 0}},
    {10,
     249,
     {22, 0, 0, 6, 0, 1, 3, 18, 37, 25, 12, 1, 0, 0, 0},
     {0, 0, 0, 18, 0, 12, 78, 918, 3507, 4311, 3990, 594, 0, 0, 0}},
    {11,
     61,
     {7, 0, 0, 1, 1, 1, 1, 5, 8, 4, 3, 2, 0, 0, 0},
     {0, 0, 0, 3, 6, 15, 30, 201, 711, 768, 993, 1149, 0, 0, 0}},
    {13,
     128,
     {15, 0, 0, 1, 0, 0, 4, 11, 13, 9, 4, 1, 1, 0, 0},
     {0, 0, 0, 3, 0, 0, 84, 477, 1248, 1896, 1425, 627, 1146, 0, 0}},
    {14,
     324,
     {8, 0, 0, 1, 0, 3, 13, 39, 45, 41, 25, 4, 0, 0, 0},
     {0, 0, 0, 3, 0, 42, 300, 1926, 4290, 7158, 8718, 2703, 0, 0, 0}},
    {15,
     55,
     {3, 0, 0, 0, 1, 0, 1, 1, 5, 7, 4, 2, 0, 0, 0},
     {0, 0, 0, 0, 6, 0, 18, 45, 432, 1248, 1284, 1065, 0, 0, 0}},
}};

double age_of_bucket(std::size_t b) {
  return b == 0 ? 0.0 : std::ldexp(1.0, static_cast<int>(b) - 1);
}
}  // namespace

ReusePolicy::ReusePolicy(std::size_t capacity, Options options)
    : options_(options),
      history_limit_(std::max<std::size_t>(4096, capacity / 32)),
      max_owners_(capacity + history_limit_ + 1),
      owner_(capacity, npos),
      prev_(capacity, npos),
      next_(capacity, npos),
      fp_(capacity, 0),
      shared_(capacity, false),
      history_(64, npos),  // grows with the records (at most max_owners_)
      rng_(detail::mix64(options.seed ^ 0x5851f42d4c957f2dULL)) {
  KVOFFLOAD_EXPECTS(capacity < npos, "reuse policy: capacity {} is too large", capacity);
  KVOFFLOAD_EXPECTS(options.samples >= 1, "reuse policy: samples must be at least 1");
  start_counts();
}

ReusePolicy::~ReusePolicy() = default;

void ReusePolicy::start_counts() {
  counts_ = {};
  if (options_.prior) {
    for (const Prior& p : kPrior) {
      Counts& c = counts_[p.cls];
      c.born = p.born;
      for (std::size_t b = 0; b <= kAges; ++b) {
        c.cont[b] = p.cont[b];
        c.sum[b] = p.sum[b];
      }
    }
  }
  refresh_table();
}

void ReusePolicy::reset() {
  std::fill(owner_.begin(), owner_.end(), npos);
  std::fill(prev_.begin(), prev_.end(), npos);
  std::fill(next_.begin(), next_.end(), npos);
  std::fill(fp_.begin(), fp_.end(), 0);
  std::fill(shared_.begin(), shared_.end(), false);
  resident_ = 0;
  owners_.clear();
  active_.clear();
  history_.assign(64, npos);
  history_head_ = history_size_ = 0;
  slot_of_.clear();
  chain_.clear();
  context_ = {};
  anonymous_slot_ = npos;
  now_ = 0;
  rng_ = detail::mix64(options_.seed ^ 0x5851f42d4c957f2dULL);
  stamp_ = 0;
  table_ = {};
  known_ = {};
  events_ = 0;
  start_counts();
  if (duel_) {
    duel_->reset();
    by_age_ = false;
  }
}

void ReusePolicy::set_context(const AccessContext& context) {
  context_ = context;
  // The clock never goes back, and a value that is not finite is no time at all.
  if (std::isfinite(context.now) && context.now > now_) now_ = context.now;
  if (duel_) duel_->set_context(context);
}

std::uint32_t ReusePolicy::new_owner(std::uint64_t request) {
  std::uint32_t slot = npos;
  if (history_size_ >= history_limit_ || owners_.size() >= max_owners_) {
    // The oldest finished record once history_limit_ of them are queued (or every record is
    // made); a queued record that holds blocks again is skipped (and queued again when it
    // empties).
    while (history_size_ > 0) {
      const std::uint32_t s = history_[history_head_];
      history_head_ = (history_head_ + 1) % history_.size();
      --history_size_;
      owners_[s].queued = false;
      if (owners_[s].blocks == 0) {
        slot = s;
        break;
      }
    }
  }
  if (slot == npos) {
    // None finished: a new record. At most max_owners_ exist; at that many, more than the
    // capacity hold no block and every such one is queued, so the loop above found one.
    KVOFFLOAD_ASSERT(owners_.size() < max_owners_,
                     "reuse policy: no owner record free ({} records)", owners_.size());
    slot = static_cast<std::uint32_t>(owners_.size());
    if (owners_.size() == owners_.capacity()) {  // grow by a quarter, not twice: it is memory
      owners_.reserve(std::min(max_owners_, owners_.size() + owners_.size() / 4 + 64));
    }
    owners_.emplace_back();
  } else {
    Owner& old = owners_[slot];
    slot_of_.erase(old.request, slot, request_key());
    if (old.tail != 0) chain_.erase(old.tail, slot, tail_key());
    old = Owner{};
  }
  Owner& o = owners_[slot];
  o.request = request;
  o.first_ms = wrapped_ms(now_);
  o.last = now_;
  o.continues = context_.continues;
  slot_of_.insert(request, slot, request_key());
  return slot;
}

std::uint32_t ReusePolicy::owner_for_context() {
  if (context_.request == 0) {
    if (anonymous_slot_ != npos && owners_[anonymous_slot_].request == anonymous_ &&
        owners_[anonymous_slot_].last == now_ &&
        owners_[anonymous_slot_].blocks < kAnonymousBlocks) {
      return anonymous_slot_;
    }
    anonymous_ = kAnonymous | (anonymous_ + 1);
    anonymous_slot_ = new_owner(anonymous_);
    return anonymous_slot_;
  }
  const std::uint32_t s = slot_of_.find(context_.request, request_key());
  const std::uint32_t slot = s != npos ? s : new_owner(context_.request);
  Owner& o = owners_[slot];
  o.last = now_;
  if (context_.continues >= 0) o.continues = context_.continues;
  return slot;
}

void ReusePolicy::unlink(std::uint32_t block, Owner& o) {
  const std::uint32_t p = prev_[block];
  const std::uint32_t n = next_[block];
  if (p != npos) {
    next_[p] = n;
  } else {
    o.head = n;
  }
  if (n != npos) {
    prev_[n] = p;
  } else {
    o.back = p;
  }
}

void ReusePolicy::append(std::uint32_t block, Owner& o) {
  prev_[block] = o.back;
  next_[block] = npos;
  if (o.back != npos) {
    next_[o.back] = block;
  } else {
    o.head = block;
  }
  o.back = block;
}

void ReusePolicy::attach(std::uint32_t block, std::uint32_t owner) {
  Owner& o = owners_[owner];
  if (owner_[block] == owner) {
    // Already its: to the back of its list, its count and its queue state unchanged.
    if (o.back == block) return;
    unlink(block, o);
    append(block, o);
    return;
  }
  if (owner_[block] != npos) detach(block);
  owner_[block] = owner;
  append(block, o);
  if (o.blocks++ == 0) {
    o.active_index = static_cast<std::uint32_t>(active_.size());
    active_.push_back(owner);
  }
}

void ReusePolicy::detach(std::uint32_t block) {
  const std::uint32_t owner = owner_[block];
  Owner& o = owners_[owner];
  unlink(block, o);
  prev_[block] = next_[block] = npos;
  owner_[block] = npos;
  if (--o.blocks == 0) {
    const std::uint32_t last = active_.back();
    active_[o.active_index] = last;
    owners_[last].active_index = o.active_index;
    active_.pop_back();
    o.active_index = npos;
    if (!o.queued) {
      if (history_size_ == history_.size()) {  // full: twice the room, oldest first
        std::vector<std::uint32_t> grown(std::min(2 * history_.size(), max_owners_), npos);
        for (std::size_t i = 0; i < history_size_; ++i) {
          grown[i] = history_[(history_head_ + i) % history_.size()];
        }
        history_.swap(grown);
        history_head_ = 0;
      }
      history_[(history_head_ + history_size_) % history_.size()] = owner;
      ++history_size_;
      o.queued = true;
    }
  }
}

void ReusePolicy::insert(HostBlockId id, const Key& key) {
  insert_fingerprint(static_cast<std::uint32_t>(id), fingerprint_of(key));
}

std::uint32_t ReusePolicy::fingerprint_of(const Key& key) {
  const auto fp = static_cast<std::uint32_t>(KeyHash{}(key));
  return fp != 0 ? fp : 1;  // never 0: 0 is "none"
}

void ReusePolicy::insert_fingerprint(std::uint32_t block, std::uint32_t fingerprint) {
  fp_[block] = fingerprint;
  shared_[block] = false;
  if (owner_[block] == npos) ++resident_;
  attach(block, owner_for_context());
}

std::uint32_t ReusePolicy::record_with_tail(std::uint32_t fingerprint) const {
  return chain_.find(fingerprint, tail_key());
}

void ReusePolicy::looked_up(std::span<const Key> keys) {
  if (!options_.duel || context_.request == 0 || keys.empty()) return;
  // Made at the first lookup: a tier's index (no requests, no lookups) never has one.
  if (!duel_) {
    duel_ = std::make_unique<detail::ReuseDuel>(owner_.size(), options_);
    duel_->set_context(context_);
  }
  scratch_.clear();
  for (const Key& k : keys) scratch_.push_back(fingerprint_of(k));
  if (!duel_->sampled(context_.request, scratch_)) return;
  duel_->access(scratch_);
  by_age_ = duel_->recency_ahead();
}

void ReusePolicy::touch(std::span<const HostBlockId> ids,
                        detail::function_ref<bool(HostBlockId)> /*ready*/) {
  const auto valid = [&](HostBlockId id) {
    return id >= 0 && owner_[static_cast<std::size_t>(id)] != npos;
  };
  if (context_.request == 0) {  // nobody's: the owners were used again, nothing moves
    for (const HostBlockId id : ids) {
      if (valid(id)) owners_[owner_[static_cast<std::size_t>(id)]].last = now_;
    }
    return;
  }
  if (std::none_of(ids.begin(), ids.end(), valid)) return;
  const std::uint32_t slot = owner_for_context();
  if (owners_[slot].scans < 2) find_parent(slot, ids);
  std::uint32_t deepest = 0;
  for (const HostBlockId id : ids) {
    if (!valid(id)) continue;
    const auto block = static_cast<std::uint32_t>(id);
    if (owner_[block] != slot) {
      // Used by another conversation (a shared system prompt), not just an earlier turn of
      // this one: the blocks the shared floor keeps, and the "ends" hint spares.
      if (owners_[owner_[block]].request != owners_[slot].parent) shared_[block] = true;
      // Another request used this block since the one whose deepest block it is: a request
      // that extends past it now follows this one, not that one (whose chain it left).
      const std::uint32_t held = chain_.find(fp_[block], tail_key());
      if (held != npos && held != slot) {
        chain_.erase(fp_[block], held, tail_key());
        owners_[held].tail = 0;
      }
    }
    attach(block, slot);  // to the back: the list follows the request's order
    deepest = fp_[block];
  }
  set_tail(slot, deepest);
  count_birth(slot);
}

void ReusePolicy::find_parent(std::uint32_t slot, std::span<const HostBlockId> ids) {
  Owner& o = owners_[slot];
  ++o.scans;
  for (std::size_t i = ids.size(); i-- > 0;) {
    const HostBlockId id = ids[i];
    if (id < 0 || owner_[static_cast<std::size_t>(id)] == npos) continue;
    const std::uint32_t found = chain_.find(fp_[static_cast<std::size_t>(id)], tail_key());
    if (found == npos || found == slot) continue;
    const Owner& parent = owners_[found];
    // The deepest earlier request whose whole prompt this one extends; a later search
    // replaces what an earlier one found only with a later turn (the lookup's touch may see
    // a grandparent when the parent's tail was evicted; the store's touch sees the parent).
    if (o.gap < 0 || parent.turn + 1 > o.turn) {
      if (o.parent_class != kNone) {
        Counts& c = counts_[static_cast<std::size_t>(o.parent_class)];
        const auto b = static_cast<std::size_t>(o.parent_bucket);
        c.cont[b] = std::max(0.0, c.cont[b] - 1);
        c.sum[b] = std::max(0.0, c.sum[b] - std::max(0.0, static_cast<double>(o.gap)));
      }
      o.turn = static_cast<std::uint8_t>(std::min(255, parent.turn + 1));
      // The difference as signed milliseconds: exact for gaps under 24.8 days whatever the
      // clock's origin; 0 when the parent's record is the younger one (its request arrived
      // after this one's first chunk).
      const auto ms = static_cast<std::int32_t>(o.first_ms - parent.first_ms);
      o.gap = static_cast<float>(std::max<std::int32_t>(0, ms)) / 1000.0F;
      const std::size_t pc = class_of(parent);
      const std::size_t pb = bucket_of(o.gap);
      counts_[pc].cont[pb] += 1;
      counts_[pc].sum[pb] += o.gap;
      o.parent_class = static_cast<std::uint8_t>(pc);
      o.parent = parent.request;
      o.parent_bucket = static_cast<std::uint8_t>(pb);
    }
    return;
  }
}

void ReusePolicy::set_tail(std::uint32_t slot, std::uint32_t fingerprint) {
  Owner& o = owners_[slot];
  if (fingerprint == 0 || fingerprint == o.tail) return;
  // Another live request's tail stays its own (a repeat of the same prompt, or the parent's
  // tail seen by the lookup's touch): its other continuations must still find it.
  if (chain_.find(fingerprint, tail_key()) != npos) return;  // (not this one's: o.tail differs)
  if (o.tail != 0) chain_.erase(o.tail, slot, tail_key());
  o.tail = fingerprint;
  chain_.insert(fingerprint, slot, tail_key());
}

void ReusePolicy::count_birth(std::uint32_t slot) {
  Owner& o = owners_[slot];
  const auto cls = static_cast<std::uint8_t>(class_of(o));
  if (o.counted == cls) return;
  const bool first = o.counted == kNone;
  if (!first) {
    Counts& c = counts_[static_cast<std::size_t>(o.counted)];
    c.born = std::max(0.0, c.born - 1);
  }
  counts_[static_cast<std::size_t>(cls)].born += 1;
  o.counted = cls;
  if (!first) return;
  ++events_;
  if (events_ % kHalveEvery == 0) {
    for (Counts& c : counts_) {
      c.born /= 2;
      for (double& x : c.cont) x /= 2;
      for (double& x : c.sum) x /= 2;
    }
  }
  if (events_ % kRefreshEvery == 0) refresh_table();
}

void ReusePolicy::refresh_table() {
  Counts all;
  for (const Counts& c : counts_) {
    all.born += c.born;
    for (std::size_t b = 0; b <= kAges; ++b) {
      all.cont[b] += c.cont[b];
      all.sum[b] += c.sum[b];
    }
  }
  for (std::size_t k = 0; k <= kClasses; ++k) {
    const Counts& c = k < kClasses ? counts_[k] : all;
    double total = 0, total_sum = 0;
    for (std::size_t b = 0; b <= kAges; ++b) {
      total += c.cont[b];
      total_sum += c.sum[b];
    }
    known_[k] = total >= 2 && c.born >= 1;
    if (!known_[k]) continue;
    const double p = std::min(1.0, total / c.born);
    double upto = 0, upto_sum = 0;
    for (std::size_t b = 0; b < kAges; ++b) {
      upto += c.cont[b];
      upto_sum += c.sum[b];
      const double f = upto / total;
      // Continued later, given not continued by this age; over the expected wait for it.
      const double again = p * (1 - f) / std::max(1e-9, 1 - p * f);
      const double rest = total - upto;
      const double wait = rest > 1e-9 ? (total_sum - upto_sum) / rest - age_of_bucket(b) : 1e9;
      table_[k][b] = again / std::max(1.0, wait);
    }
  }
}

std::size_t ReusePolicy::class_of(const Owner& o) {
  const std::size_t t = std::min<std::size_t>(o.turn, kTurns) - 1;
  const std::size_t g = o.gap < 0 ? 0 : o.gap <= 30 ? 1 : o.gap <= 300 ? 2 : 3;
  return t * kGaps + g;
}

std::size_t ReusePolicy::bucket_of(double seconds) {
  // The first age bucket whose age is at least `seconds` (kAges past the last).
  if (seconds <= 0) return 0;
  for (std::size_t b = 1; b < kAges; ++b) {
    if (seconds <= age_of_bucket(b)) return b;
  }
  return kAges;
}

std::uint32_t ReusePolicy::wrapped_ms(double seconds) {
  // fmod keeps it exact for clocks too large for an integer; a clock past about 1.8e305 s
  // (milliseconds that are not finite) is 0. Only differences of these are used.
  const double ms = std::round(seconds * 1000.0);
  if (!std::isfinite(ms) || ms <= 0) return 0;
  return static_cast<std::uint32_t>(std::fmod(ms, 4294967296.0));
}

double ReusePolicy::value(const Owner& o, std::uint32_t deepest) const {
  // Age since its last use: a request still running (decoding, a chunked prefill) is young.
  const double age = std::max(0.0, now_ - o.last);
  // The last age bucket at or below `age`: 0 below 1 s, else 1 + floor(log2(age)), at most
  // the last (one ilogb, not a loop: 64 of these per evicted block).
  const std::size_t b =
      age < 1.0 ? 0
                : std::min<std::size_t>(kAges - 1, 1 + static_cast<std::size_t>(std::ilogb(age)));
  // Nobody's, or the duel found recency ahead: by recency.
  if ((o.request & kAnonymous) != 0 || by_age_) return 1.0 / (1.0 + age);
  const std::size_t c = class_of(o);
  double v = known_[c]          ? table_[c][b]
             : known_[kClasses] ? table_[kClasses][b]
                                : 1.0 / (1.0 + age);  // nothing learnt yet: by age alone
  // A block two or more requests used (a system prompt) is another request's too: the floor,
  // and never the "ends" hint.
  const bool shared = deepest != npos && shared_[deepest];
  if (shared) v = std::max(v, 1.0 / std::max(1.0, age));
  if (o.continues == 1) v *= kHintContinues;
  if (o.continues == 0 && !shared) v *= kHintEnds;
  return v;
}

std::uint64_t ReusePolicy::next_random() {
  rng_ += 0x9e3779b97f4a7c15ULL;
  return detail::mix64(rng_);
}

bool ReusePolicy::take_one(std::uint32_t owner, detail::function_ref<bool(HostBlockId)> can_evict,
                           std::vector<HostBlockId>& victims) {
  Owner& o = owners_[owner];
  const std::uint32_t b = o.stamp == stamp_ ? o.cursor : o.back;
  o.stamp = stamp_;
  o.held = false;
  if (b != npos && can_evict(static_cast<HostBlockId>(b))) {
    victims.push_back(static_cast<HostBlockId>(b));
    o.cursor = prev_[b];
    return true;
  }
  // A block that cannot go (being read, written, pinned, or stored by this call) ends the
  // owner's turn: taking the blocks before it would leave a hole its continuation stops at.
  o.held = true;
  o.cursor = b;
  return false;
}

std::size_t ReusePolicy::take_rest(std::uint32_t owner, std::size_t need,
                                   detail::function_ref<bool(HostBlockId)> can_evict,
                                   std::vector<HostBlockId>& victims) {
  Owner& o = owners_[owner];
  // Past what this call took from it already: below its cursor, or below the block it stopped
  // at; from its deepest block if it was not visited.
  std::uint32_t b = o.back;
  if (o.stamp == stamp_) b = o.cursor;
  o.stamp = stamp_;
  std::size_t taken = 0;
  for (; b != npos && taken < need; b = prev_[b]) {
    if (can_evict(static_cast<HostBlockId>(b))) {
      victims.push_back(static_cast<HostBlockId>(b));
      ++taken;
    }
  }
  o.cursor = npos;
  o.held = false;
  return taken;
}

bool ReusePolicy::select_victims(std::size_t count,
                                 detail::function_ref<bool(HostBlockId)> can_evict,
                                 std::vector<HostBlockId>& victims) {
  const std::size_t before = victims.size();
  if (++stamp_ == 0) {  // wrapped: clear the marks
    for (Owner& o : owners_) o.stamp = 0;
    stamp_ = 1;
  }
  const auto spent = [&](std::uint32_t o) {
    return owners_[o].stamp == stamp_ && (owners_[o].held || owners_[o].cursor == npos);
  };
  const auto deepest = [&](std::uint32_t o) {
    return owners_[o].stamp == stamp_ ? owners_[o].cursor : owners_[o].back;
  };
  // The request this store is for is never sampled: a request still running (a chunked
  // prefill, a decode) would otherwise cut its own earlier blocks. They go last, if at all.
  const std::uint32_t self =
      context_.request != 0 ? slot_of_.find(context_.request, request_key()) : npos;
  std::size_t need = count;
  // One block a round: the deepest block not taken yet of the least valuable of `samples`
  // owners (all of them when there are fewer), valued with that block as its deepest. An
  // owner's taken blocks are remembered by a cursor for the rest of the call, so victims are
  // distinct and nothing changes.
  for (std::size_t round = 0; need > 0 && round < 4 * count + 64; ++round) {
    const std::size_t n = active_.size();
    std::uint32_t best = npos;
    double best_value = 0;
    const std::size_t draws = std::min<std::size_t>(options_.samples, n);
    for (std::size_t s = 0; s < draws; ++s) {
      const std::uint32_t o = n <= options_.samples ? active_[s] : active_[next_random() % n];
      if (o == self || spent(o)) continue;
      const double v = value(owners_[o], deepest(o));
      // Equal values (nothing learnt for either, or both past every gap seen): the older.
      if (best == npos || v < best_value ||
          (v == best_value && owners_[o].last < owners_[best].last)) {
        best = o;
        best_value = v;
      }
    }
    if (best == npos) break;
    if (take_one(best, can_evict, victims)) --need;
  }
  // The last resort: every other owner in order, then the request's own, past blocks that
  // cannot go (holes), so that false means fewer than `count` blocks can go at all.
  for (std::size_t i = 0; need > 0 && i < active_.size(); ++i) {
    if (active_[i] != self) need -= take_rest(active_[i], need, can_evict, victims);
  }
  if (need > 0 && self != npos && owners_[self].blocks > 0) {
    need -= take_rest(self, need, can_evict, victims);
  }
  if (need > 0) {
    victims.resize(before);
    return false;
  }
  return true;
}

void ReusePolicy::evict(HostBlockId id, const Key& /*key*/) {
  erase(id);
}

void ReusePolicy::erase(HostBlockId id) {
  const auto block = static_cast<std::uint32_t>(id);
  if (id < 0 || block >= owner_.size() || owner_[block] == npos) return;
  detach(block);
  fp_[block] = 0;
  shared_[block] = false;
  --resident_;
}

std::uint64_t ReusePolicy::owner_of(HostBlockId id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= owner_.size()) return 0;
  const std::uint32_t o = owner_[static_cast<std::size_t>(id)];
  return o == npos ? 0 : owners_[o].request;
}

std::uint32_t ReusePolicy::turn_of(std::uint64_t request) const {
  const std::uint32_t s = slot_of_.find(request, request_key());
  return s == npos ? 0 : owners_[s].turn;
}

double ReusePolicy::value_of(std::uint64_t request) const {
  const std::uint32_t s = slot_of_.find(request, request_key());
  return s == npos ? -1.0 : value(owners_[s], owners_[s].back);
}

std::array<std::uint64_t, 2> ReusePolicy::duel_hits() const {
  return duel_ ? duel_->hits() : std::array<std::uint64_t, 2>{};
}

std::vector<HostBlockId> ReusePolicy::blocks_of(std::uint64_t request) const {
  std::vector<HostBlockId> out;
  const std::uint32_t s = slot_of_.find(request, request_key());
  if (s == npos) return out;
  for (std::uint32_t b = owners_[s].head; b != npos; b = next_[b]) {
    out.push_back(static_cast<HostBlockId>(b));
  }
  return out;
}

}  // namespace kvoffload
