#include "kvoffload/host_block_manager.hpp"

#include "common/expects.hpp"

namespace kvoffload {

HostBlockManager::HostBlockManager(const ManagerConfig& config)
    : capacity_((validate(config), config.host_blocks)),
      enable_events_(config.enable_events),
      medium_(config.medium),
      store_threshold_(config.store_threshold),
      block_bytes_(config.block_bytes),
      policy_(make_eviction_policy(config.policy, static_cast<std::size_t>(capacity_))),
      blocks_(static_cast<std::size_t>(capacity_)),
      keys_(static_cast<std::size_t>(capacity_)),
      index_(static_cast<std::size_t>(capacity_)) {
  freed_.reserve(static_cast<std::size_t>(capacity_));
  if (store_threshold_ > 0) {
    tracker_keys_ = config.threshold_tracker_keys > 0
                        ? static_cast<std::size_t>(config.threshold_tracker_keys)
                        : std::max<std::size_t>(1024, 4 * static_cast<std::size_t>(capacity_));
    counts_.reserve(tracker_keys_);
    previous_counts_.reserve(tracker_keys_);
  }
}

void HostBlockManager::count_lookup(const Key& key) {
  auto [count, inserted] = counts_.insert(key, 0);
  if (inserted) {
    if (const std::uint32_t* old = previous_counts_.find(key)) *count = *old;
  }
  ++*count;
  if (counts_.size() >= tracker_keys_) {
    std::swap(counts_, previous_counts_);
    counts_.clear();
  }
}

std::uint32_t HostBlockManager::lookup_count(const Key& key) const noexcept {
  if (const std::uint32_t* c = counts_.find(key)) return *c;
  if (const std::uint32_t* c = previous_counts_.find(key)) return *c;
  return 0;
}

HostBlockManager::~HostBlockManager() {
  // valid_from (SEMANTICS 6.8) lives in the padding: a block's state stays 12 bytes.
  static_assert(sizeof(Block) == 12);
}

std::int64_t HostBlockManager::num_used() const noexcept {
  return static_cast<std::int64_t>(index_.size());
}

LookupResult HostBlockManager::peek(const Key& key) const {
  std::uint16_t valid_from = 0;
  return peek(key, valid_from);
}

LookupResult HostBlockManager::peek(const Key& key, std::uint16_t& valid_from) const {
  const HostBlockId id = block_of(key);
  valid_from = 0;
  if (id < 0) return LookupResult::miss;
  const Block& b = blocks_[static_cast<std::size_t>(id)];
  valid_from = b.valid_from;
  return b.state == State::writing ? LookupResult::pending : LookupResult::hit;
}

LookupResult HostBlockManager::lookup(const Key& key) {
  std::uint16_t valid_from = 0;
  return lookup(key, valid_from);
}

LookupResult HostBlockManager::lookup(const Key& key, std::uint16_t& valid_from) {
  if (store_threshold_ > 0) count_lookup(key);
  return count_result(peek(key, valid_from));
}

LookupResult HostBlockManager::lookup_again(const Key& key) {
  std::uint16_t valid_from = 0;
  return count_result(peek(key, valid_from));
}

LookupResult HostBlockManager::count_result(LookupResult r) noexcept {
  switch (r) {
    case LookupResult::miss: ++stats_.misses; break;
    case LookupResult::pending: ++stats_.pending; break;
    case LookupResult::hit: ++stats_.hits; break;
  }
  return r;
}

HostBlockId HostBlockManager::allocate_id() noexcept {
  // Never-used ids first, in increasing order, then the most recently freed (SEMANTICS 9).
  if (next_never_used_ < capacity_) return next_never_used_++;
  const HostBlockId id = freed_.back();
  freed_.pop_back();
  return id;
}

void HostBlockManager::free_id(HostBlockId id) {
  Block& block = blocks_[static_cast<std::size_t>(id)];
  index_.erase(detail::KeyIndex::hash(keys_[static_cast<std::size_t>(id)]), id);
  block.state = State::free;
  block.valid_from = 0;
  block.readers = 0;
  freed_.push_back(id);
}

bool HostBlockManager::prepare_store(std::span<const Key> keys, PreparedStore& out,
                                     bool admit_all) {
  std::vector<Key>& keys_to_store = out.keys_to_store;
  std::vector<HostBlockId>& block_ids = out.block_ids;
  keys_to_store.clear();
  block_ids.clear();
  out.key_blocks.assign(keys.size(), -1);
  out.key_stored.assign(keys.size(), 0);
  out.ok = true;
  // Mark the blocks of keys already present: they are dropped from the store and must not be
  // evicted to make room for the others (they would be lost while the engine counts on them).
  if (++epoch_ == 0) {
    for (Block& b : blocks_) b.protect_epoch = 0;
    epoch_ = 1;
  }
  // Each key is hashed once; its index slot is prefetched a few keys ahead so the cache
  // misses of a large table overlap.
  key_hashes_.resize(keys.size());
  for (std::size_t k = 0; k < keys.size(); ++k) key_hashes_[k] = detail::KeyIndex::hash(keys[k]);
  new_positions_.clear();
  keys_to_store.reserve(keys.size());
  constexpr std::size_t kAhead = 8;
  for (std::size_t k = 0; k < std::min(kAhead, keys.size()); ++k) {
    index_.prefetch(key_hashes_[k]);
  }
  for (std::size_t k = 0; k < keys.size(); ++k) {
    if (k + kAhead < keys.size()) index_.prefetch(key_hashes_[k + kAhead]);
    const Key& key = keys[k];
    if (const HostBlockId id = index_.find(key, key_hashes_[k], keys_.data()); id >= 0) {
      blocks_[static_cast<std::size_t>(id)].protect_epoch = epoch_;
      out.key_blocks[k] = id;
    } else if (store_threshold_ > 0 && !admit_all &&
               lookup_count(key) < static_cast<std::uint32_t>(store_threshold_)) {
      ++stats_.stores_skipped;  // not popular enough yet
    } else {
      keys_to_store.push_back(key);
      new_positions_.push_back(static_cast<std::uint32_t>(k));
    }
  }
  if (keys_to_store.empty()) return true;

  const auto free_now = static_cast<std::size_t>(capacity_ - next_never_used_) + freed_.size();
  if (keys_to_store.size() > free_now) {
    const std::size_t needed = keys_to_store.size() - free_now;
    scratch_ids_.clear();
    const bool found =
        needed <= static_cast<std::size_t>(capacity_) &&
        policy_->select_victims(
            needed,
            [this](HostBlockId id) {
              const Block& b = blocks_[static_cast<std::size_t>(id)];
              return b.state == State::ready && b.readers == 0 && b.protect_epoch != epoch_;
            },
            scratch_ids_);
    if (!found) {
      ++stats_.store_rejections;
      keys_to_store.clear();
      out.key_blocks.assign(keys.size(), -1);
      out.key_stored.assign(keys.size(), 0);
      out.ok = false;
      return false;
    }
    ManagerEvent removed{true, {}, medium_};
    if (enable_events_) removed.keys.reserve(scratch_ids_.size());
    for (const HostBlockId id : scratch_ids_) {
      const Key key = keys_[static_cast<std::size_t>(id)];
      policy_->evict(id, key);
      free_id(id);
      if (enable_events_) removed.keys.push_back(key);
    }
    stats_.evictions += scratch_ids_.size();
    if (enable_events_) events_.push_back(std::move(removed));
  }

  block_ids.reserve(keys_to_store.size());
  std::size_t kept = 0;
  for (std::size_t k = 0; k < keys_to_store.size(); ++k) {
    const Key& key = keys_to_store[k];
    const std::uint32_t position = new_positions_[k];
    const HostBlockId id = allocate_id();
    if (!index_.insert(key, key_hashes_[position], id, keys_.data()).second) {
      // A duplicate within `keys`: store it once, and give the id back where it came from.
      if (id == next_never_used_ - 1) {
        --next_never_used_;
      } else {
        freed_.push_back(id);
      }
      continue;
    }
    out.key_blocks[position] = id;
    out.key_stored[position] = 1;
    if (kept != k) keys_to_store[kept] = key;
    ++kept;
    keys_[static_cast<std::size_t>(id)] = key;
    Block& block = blocks_[static_cast<std::size_t>(id)];
    block.state = State::writing;
    block.valid_from = 0;
    block.readers = 0;
    policy_->insert(id, key);
    block_ids.push_back(id);
  }
  keys_to_store.resize(kept);
  num_writing_ += static_cast<std::int64_t>(kept);
  return true;
}

void HostBlockManager::complete_store(std::span<const Key> keys, bool ok) {
  // Resolve the keys to their blocks, then complete by block: one implementation of the
  // writing -> ready / freed transition.
  scratch_ids_.clear();
  for (const Key& key : keys) {
    if (const HostBlockId id = block_of(key); id >= 0) scratch_ids_.push_back(id);
  }
  complete_store_blocks(scratch_ids_, ok);
}

void HostBlockManager::complete_store_blocks(std::span<const HostBlockId> ids, bool ok) {
  ManagerEvent stored{false, {}, medium_};
  if (enable_events_ && ok) stored.keys.reserve(ids.size());
  for (const HostBlockId id : ids) {
    if (id < 0 || id >= capacity_) continue;
    Block& block = blocks_[static_cast<std::size_t>(id)];
    if (block.state != State::writing) continue;
    --num_writing_;
    if (ok) {
      block.state = State::ready;
      ++stats_.stores;
      if (enable_events_) stored.keys.push_back(keys_[static_cast<std::size_t>(id)]);
    } else {
      // A failed store is never a hit: the block goes away at once.
      policy_->erase(id);
      free_id(id);
      ++stats_.failed_store_blocks;
    }
  }
  if (enable_events_ && !stored.keys.empty()) events_.push_back(std::move(stored));
}

void HostBlockManager::set_valid_from(HostBlockId id, std::uint16_t valid_from) {
  KVOFFLOAD_EXPECTS(
      id >= 0 && id < capacity_ && blocks_[static_cast<std::size_t>(id)].state == State::writing,
      "set_valid_from: host block {} is not being written", id);
  blocks_[static_cast<std::size_t>(id)].valid_from = valid_from;
}

std::uint16_t HostBlockManager::valid_from(HostBlockId id) const noexcept {
  if (id < 0 || id >= capacity_) return 0;
  const Block& b = blocks_[static_cast<std::size_t>(id)];
  return b.state == State::free || b.state == State::held ? std::uint16_t{0} : b.valid_from;
}

bool HostBlockManager::all_ready(std::span<const Key> keys) const {
  for (const Key& key : keys) {
    if (peek(key) != LookupResult::hit) return false;
  }
  return true;
}

void HostBlockManager::prepare_load(std::span<const Key> keys,
                                    std::vector<HostBlockId>& block_ids) {
  for (const Key& key : keys) {
    const LookupResult r = peek(key);
    KVOFFLOAD_EXPECTS(r == LookupResult::hit, "key {} cannot be loaded: it is {}", to_string(key),
                      r == LookupResult::miss ? "not in the host cache" : "still being stored");
  }
  for (const Key& key : keys) {
    const HostBlockId id = block_of(key);
    Block& block = blocks_[static_cast<std::size_t>(id)];
    if (block.readers++ == 0) ++num_being_read_;
    block_ids.push_back(id);
  }
  stats_.loads += keys.size();
}

void HostBlockManager::complete_load(std::span<const Key> keys) {
  for (const Key& key : keys) {
    const HostBlockId id = block_of(key);
    if (id < 0) continue;
    Block& block = blocks_[static_cast<std::size_t>(id)];
    if (block.readers > 0 && --block.readers == 0) --num_being_read_;
  }
}

void HostBlockManager::pin_blocks(std::span<const HostBlockId> ids) {
  for (const HostBlockId id : ids) {
    KVOFFLOAD_EXPECTS(
        id >= 0 && id < capacity_ && blocks_[static_cast<std::size_t>(id)].state == State::ready,
        "pin: host block {} is not a ready block", id);
  }
  for (const HostBlockId id : ids) {
    Block& block = blocks_[static_cast<std::size_t>(id)];
    if (block.readers++ == 0) ++num_being_read_;
  }
}

void HostBlockManager::unpin_blocks(std::span<const HostBlockId> ids) {
  for (const HostBlockId id : ids) {
    if (id < 0 || id >= capacity_) continue;
    Block& block = blocks_[static_cast<std::size_t>(id)];
    if ((block.state == State::writing || block.state == State::ready) && block.readers > 0 &&
        --block.readers == 0) {
      --num_being_read_;
    }
  }
}

std::int64_t HostBlockManager::erase(std::span<const Key> keys) {
  ManagerEvent removed{true, {}, medium_};
  std::int64_t n = 0;
  for (const Key& key : keys) {
    const HostBlockId id = block_of(key);
    if (id < 0) continue;
    const Block& block = blocks_[static_cast<std::size_t>(id)];
    if (block.state != State::ready || block.readers != 0) continue;
    policy_->erase(id);
    free_id(id);
    if (enable_events_) removed.keys.push_back(key);
    ++n;
  }
  if (enable_events_ && !removed.keys.empty()) events_.push_back(std::move(removed));
  return n;
}

void HostBlockManager::eviction_candidates(std::size_t n, std::vector<HostBlockId>& out) {
  const auto can_evict = [this](HostBlockId id) {
    const Block& b = blocks_[static_cast<std::size_t>(id)];
    return b.state == State::ready && b.readers == 0;
  };
  // select_victims is all or nothing: ask for fewer until it can answer.
  for (std::size_t want = std::min<std::size_t>(n, index_.size()); want > 0; want /= 2) {
    if (policy_->select_victims(want, can_evict, out)) return;
  }
}

std::int64_t HostBlockManager::evict_blocks(std::span<const HostBlockId> ids) {
  ManagerEvent removed{true, {}, medium_};
  std::int64_t n = 0;
  for (const HostBlockId id : ids) {
    if (id < 0 || id >= capacity_) continue;
    const Block& block = blocks_[static_cast<std::size_t>(id)];
    if (block.state != State::ready || block.readers != 0) continue;
    const Key key = keys_[static_cast<std::size_t>(id)];
    policy_->evict(id, key);
    free_id(id);
    if (enable_events_) removed.keys.push_back(key);
    ++n;
  }
  stats_.evictions += static_cast<std::uint64_t>(n);
  if (enable_events_ && !removed.keys.empty()) events_.push_back(std::move(removed));
  return n;
}

void HostBlockManager::touch_blocks(std::span<const HostBlockId> ids) {
  if (ids.empty()) return;
  for (const HostBlockId id : ids) {
    KVOFFLOAD_EXPECTS(id < capacity_, "touch: host block {} is out of range (capacity {})", id,
                      capacity_);
  }
  policy_->touch(ids, [this](HostBlockId b) {
    return blocks_[static_cast<std::size_t>(b)].state == State::ready;
  });
}

void HostBlockManager::touch(std::span<const Key> keys) {
  policy_->looked_up(keys);
  scratch_ids_.clear();
  for (const Key& key : keys) {
    if (const HostBlockId id = block_of(key); id >= 0) scratch_ids_.push_back(id);
  }
  if (!scratch_ids_.empty()) {
    policy_->touch(scratch_ids_, [this](HostBlockId id) {
      return blocks_[static_cast<std::size_t>(id)].state == State::ready;
    });
  }
}

void HostBlockManager::reset() {
  reset({});
}

void HostBlockManager::reset(std::span<const HostBlockId> held) {
  for (const HostBlockId id : held) {
    KVOFFLOAD_EXPECTS(id >= 0 && id < capacity_,
                      "reset: held block {} is out of range (capacity {})", id, capacity_);
  }
  index_.clear();
  for (Block& b : blocks_) b = Block{};
  freed_.clear();
  next_never_used_ = 0;
  epoch_ = 0;
  num_writing_ = 0;
  num_being_read_ = 0;
  num_held_ = 0;
  counts_.clear();
  previous_counts_.clear();
  policy_->reset();
  for (const HostBlockId id : held) {
    Block& b = blocks_[static_cast<std::size_t>(id)];
    if (b.state == State::held) continue;
    b.state = State::held;
    ++num_held_;
  }
  if (num_held_ == 0) return;
  // Every id is now held or free; free ones are handed out lowest first.
  next_never_used_ = static_cast<HostBlockId>(capacity_);
  for (auto id = static_cast<HostBlockId>(capacity_); id-- > 0;) {
    if (blocks_[static_cast<std::size_t>(id)].state == State::free) freed_.push_back(id);
  }
}

void HostBlockManager::release_held(std::span<const HostBlockId> ids) {
  for (const HostBlockId id : ids) {
    if (id < 0 || id >= capacity_) continue;
    Block& b = blocks_[static_cast<std::size_t>(id)];
    if (b.state != State::held) continue;
    b = Block{};
    freed_.push_back(id);
    --num_held_;
  }
}

std::int64_t HostBlockManager::restore(std::span<const std::optional<Key>> blocks) {
  KVOFFLOAD_EXPECTS(index_.size() == 0 && next_never_used_ == 0 && freed_.empty(),
                    "restore: the manager already holds blocks");
  KVOFFLOAD_EXPECTS(static_cast<std::int64_t>(blocks.size()) <= capacity_,
                    "restore: {} blocks for a capacity of {}", blocks.size(), capacity_);
  ManagerEvent stored{false, {}, medium_};
  std::int64_t restored = 0;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    if (!blocks[i]) continue;
    const auto id = static_cast<HostBlockId>(i);
    const Key& key = *blocks[i];
    if (!index_.insert(key, detail::KeyIndex::hash(key), id, keys_.data()).second) continue;
    keys_[i] = key;
    blocks_[i].state = State::ready;
    blocks_[i].valid_from = 0;  // tiers hold only whole blocks (SEMANTICS 6.8, tiers)
    blocks_[i].readers = 0;
    policy_->insert(id, key);
    if (enable_events_) stored.keys.push_back(key);
    ++restored;
  }
  // Every id is now either held or free; free ones are handed out lowest first.
  next_never_used_ = static_cast<HostBlockId>(capacity_);
  for (auto id = static_cast<HostBlockId>(capacity_); id-- > 0;) {
    if (blocks_[static_cast<std::size_t>(id)].state == State::free) freed_.push_back(id);
  }
  if (enable_events_ && !stored.keys.empty()) events_.push_back(std::move(stored));
  return restored;
}

std::vector<ManagerEvent> HostBlockManager::take_events() {
  std::vector<ManagerEvent> out;
  out.swap(events_);
  return out;
}

const Key* HostBlockManager::key_of(HostBlockId id) const noexcept {
  if (id < 0 || id >= capacity_) return nullptr;
  const Block& b = blocks_[static_cast<std::size_t>(id)];
  return b.state == State::free || b.state == State::held ? nullptr
                                                          : &keys_[static_cast<std::size_t>(id)];
}

HostBlockId HostBlockManager::block_of(const Key& key) const noexcept {
  return index_.find(key, detail::KeyIndex::hash(key), keys_.data());
}

std::int32_t HostBlockManager::readers(HostBlockId id) const noexcept {
  if (id < 0 || id >= capacity_) return 0;
  return blocks_[static_cast<std::size_t>(id)].readers;
}

}  // namespace kvoffload
