#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "kvoffload/config.hpp"
#include "kvoffload/detail/flat_hash_map.hpp"
#include "kvoffload/detail/key_index.hpp"
#include "kvoffload/eviction_policy.hpp"
#include "kvoffload/export.hpp"
#include "kvoffload/types.hpp"

namespace kvoffload {

/// "stored" (removed == false) or "removed" keys, in the order the manager changed them.
struct ManagerEvent {
  bool removed = false;
  std::vector<Key> keys;
  Medium medium = Medium::host;  ///< the host cache, or the tier whose index changed
};

/// prepare_store's answer. Reuse one across calls: its vectors keep their capacity.
struct PreparedStore {
  bool ok = false;                       ///< false: room could not be made; nothing changed
  std::vector<Key> keys_to_store;        ///< the keys to copy now, in the order given
  std::vector<HostBlockId> block_ids;    ///< their new blocks (writing), same order
  std::vector<HostBlockId> key_blocks;   ///< per given key: its block after the call (present
                                         ///< or new); -1 if the store threshold skipped it
  std::vector<std::uint8_t> key_stored;  ///< per given key: 1 if this call stores it, else 0
};

struct ManagerStats {
  std::uint64_t hits = 0;                 ///< lookups of ready keys
  std::uint64_t misses = 0;               ///< lookups of absent keys
  std::uint64_t pending = 0;              ///< lookups of keys being written
  std::uint64_t evictions = 0;            ///< blocks evicted to make room
  std::uint64_t stores = 0;               ///< blocks stored successfully
  std::uint64_t failed_store_blocks = 0;  ///< blocks whose store failed
  std::uint64_t store_rejections = 0;     ///< prepare_store calls that could not make room
  std::uint64_t stores_skipped = 0;       ///< keys not stored: looked up fewer than store_threshold
  std::uint64_t loads = 0;                ///< blocks handed to loads
};

/// The host block manager of SEMANTICS 9: which key lives in which host block, block states
/// (writing, ready, readers), eviction through an EvictionPolicy, and events. It hands out
/// block ids only; the memory behind them is the pool's business.
///
/// Every operation costs O(keys passed) plus O(blocks evicted) and allocates nothing per key
/// in steady state. Not thread-safe: the scheduler calls it from one thread.
class KVOFFLOAD_EXPORT HostBlockManager {
 public:
  /// Throws invalid_argument naming the field for a bad config.
  explicit HostBlockManager(const ManagerConfig& config);
  ~HostBlockManager();
  HostBlockManager(const HostBlockManager&) = delete;
  HostBlockManager& operator=(const HostBlockManager&) = delete;

  /// Miss if absent, pending if being written, hit if ready. Counts in stats() and, with a
  /// store threshold, towards the key's admission.
  LookupResult lookup(const Key& key);
  /// lookup() that also gives the block's valid_from (0 when the key is absent).
  LookupResult lookup(const Key& key, std::uint16_t& valid_from);
  /// Like lookup() (hits and misses counted) but not toward the store threshold: a caller
  /// that asks about a key again for the same request.
  LookupResult lookup_again(const Key& key);
  /// Like lookup() but counts nothing.
  [[nodiscard]] LookupResult peek(const Key& key) const;
  /// peek() that also gives the block's valid_from (0 when the key is absent).
  LookupResult peek(const Key& key, std::uint16_t& valid_from) const;

  /// Prepares blocks for storing `keys`. Keys already present are dropped, and so, with a
  /// store threshold, are keys looked up fewer times than it; a key given twice is stored
  /// once. For the rest, room is made by evicting ready, unread blocks whose key is not in
  /// `keys`, in policy order, all or nothing. Fills `out` (see PreparedStore; the new blocks
  /// are `writing`) and returns out.ok. On false nothing changed: room could not be made.
  /// With `admit_all`, the store threshold is not applied (promotions into the host cache).
  bool prepare_store(std::span<const Key> keys, PreparedStore& out, bool admit_all = false);
  /// Ends the stores of `keys`: with ok, writing blocks become ready (one "stored" event);
  /// without, writing blocks are removed and freed. Keys not writing are ignored.
  void complete_store(std::span<const Key> keys, bool ok);

  /// complete_store for the blocks prepare_store returned, without looking the keys up again
  /// (a writing block can be neither evicted nor reused). Ids not writing are ignored.
  void complete_store_blocks(std::span<const HostBlockId> ids, bool ok);

  /// SEMANTICS 6.8: the index of the first sub-block a store wrote into block `id` (0: all
  /// of them). New blocks start at 0; the scheduler sets it for a store whose leading
  /// sub-blocks were null. Only a `writing` block can be changed (invalid_argument otherwise).
  void set_valid_from(HostBlockId id, std::uint16_t valid_from);
  /// valid_from of block `id` (0 for a free or out-of-range block).
  [[nodiscard]] std::uint16_t valid_from(HostBlockId id) const noexcept;

  /// True if every key is ready (what prepare_load requires).
  [[nodiscard]] bool all_ready(std::span<const Key> keys) const;
  /// Adds a reader to each key's block and appends the ids in key order. Throws
  /// invalid_argument naming the key, changing nothing, unless all are ready.
  void prepare_load(std::span<const Key> keys, std::vector<HostBlockId>& block_ids);
  /// Removes the reader prepare_load added. Absent keys are ignored (after reset()).
  void complete_load(std::span<const Key> keys);

  /// Adds a reader to each block without counting a load: the block can then be neither
  /// evicted nor reused (a tier write reads it). Ids of blocks that are not ready are refused
  /// with invalid_argument, changing nothing.
  void pin_blocks(std::span<const HostBlockId> ids);
  /// Removes the reader pin_blocks added; free blocks (after reset()) are ignored.
  void unpin_blocks(std::span<const HostBlockId> ids);
  /// Removes the ready, unread keys among `keys` (one "removed" event); others are ignored.
  /// Returns the number removed.
  std::int64_t erase(std::span<const Key> keys);
  /// Appends up to `n` ready, unread blocks in the order the policy would evict them, least
  /// valuable first. Changes nothing.
  void eviction_candidates(std::size_t n, std::vector<HostBlockId>& out);
  /// Evicts the ready, unread blocks among `ids` (counted as evictions, one "removed" event);
  /// others are left. Returns the number evicted.
  std::int64_t evict_blocks(std::span<const HostBlockId> ids);
  /// Counts a lookup of `key` towards its admission (store threshold) only.
  void note_lookup(const Key& key) {
    if (store_threshold_ > 0) count_lookup(key);
  }

  /// The request behind the stores and touches that follow, for a policy that uses it
  /// (EvictionPolicyKind::reuse); AccessContext{} when nobody's.
  void set_context(const AccessContext& context) { policy_->set_context(context); }

  /// Policy recency update for the present keys among `keys` (SEMANTICS 10).
  void touch(std::span<const Key> keys);
  /// The same for blocks the caller already knows (ids of present keys; -1 entries skipped).
  void touch_blocks(std::span<const HostBlockId> ids);
  /// Forgets every block; ids become never-used again. Emits no event.
  void reset();
  /// The same, but the blocks `held` (ids in range; repeats allowed) stay out of use, keyless
  /// and never handed out, until release_held: a job issued before the reset may still write
  /// or read them (a tier job on a stalled disk; docs/semantics.md "Tiers"). The other ids
  /// are handed out lowest first.
  void reset(std::span<const HostBlockId> held);
  /// Frees the held blocks among `ids` (others are ignored); they are handed out again.
  void release_held(std::span<const HostBlockId> ids);
  /// Rebuilds an empty manager from what a tier found at open (DiskSlots::scanned()): block
  /// `id` holds `blocks[id]` when set, ready, with no readers. A key found twice keeps its
  /// first block (the others stay free). Restored keys enter the eviction order in block
  /// order (the disk keeps no recency) and, with events on, one "stored" event. Free blocks
  /// are handed out lowest first. Returns the number of keys restored. Throws
  /// invalid_argument unless the manager is empty and `blocks` fits its capacity.
  std::int64_t restore(std::span<const std::optional<Key>> blocks);

  /// Events since the last call, oldest first.
  std::vector<ManagerEvent> take_events();

  [[nodiscard]] const ManagerStats& stats() const noexcept { return stats_; }
  [[nodiscard]] std::int64_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::int64_t num_used() const noexcept;
  [[nodiscard]] std::int64_t num_writing() const noexcept { return num_writing_; }
  /// Blocks with at least one reader.
  [[nodiscard]] std::int64_t num_being_read() const noexcept { return num_being_read_; }
  /// Blocks held out of use since a reset (reset(held)), neither used nor free.
  [[nodiscard]] std::int64_t num_held() const noexcept { return num_held_; }
  /// The key held by block `id`, or nullptr if the block is free.
  [[nodiscard]] const Key* key_of(HostBlockId id) const noexcept;
  /// The block of `key`, or -1.
  [[nodiscard]] HostBlockId block_of(const Key& key) const noexcept;
  /// Readers of block `id` (0 for a free block).
  [[nodiscard]] std::int32_t readers(HostBlockId id) const noexcept;
  [[nodiscard]] const EvictionPolicy& policy() const noexcept { return *policy_; }
  [[nodiscard]] std::int64_t block_bytes() const noexcept { return block_bytes_; }
  [[nodiscard]] std::int64_t store_threshold() const noexcept { return store_threshold_; }
  /// Lookups of `key` the admission tracker remembers (0 without a store threshold).
  [[nodiscard]] std::uint32_t lookup_count(const Key& key) const noexcept;

 private:
  enum class State : std::uint8_t { free, writing, ready, held };
  struct Block {  // a block's key is keys_[id]; 12 bytes
    State state = State::free;
    std::uint16_t valid_from = 0;  // SEMANTICS 6.8: first written sub-block
    std::int32_t readers = 0;
    std::uint32_t protect_epoch = 0;
  };

  HostBlockId allocate_id() noexcept;
  void free_id(HostBlockId id);

  void count_lookup(const Key& key);
  LookupResult count_result(LookupResult r) noexcept;  // hits, misses, pending

  std::int64_t capacity_;
  bool enable_events_;
  Medium medium_;
  std::int64_t store_threshold_;
  std::int64_t block_bytes_;
  // Admission tracker: two generations of lookup counts; when the current one is full it
  // becomes the previous one, so memory stays bounded and recent counts survive.
  std::size_t tracker_keys_ = 0;
  detail::FlatHashMap<Key, std::uint32_t, KeyHash> counts_;
  detail::FlatHashMap<Key, std::uint32_t, KeyHash> previous_counts_;
  std::unique_ptr<EvictionPolicy> policy_;
  std::vector<Block> blocks_;
  std::vector<Key> keys_;  // per block; meaningful while the block is not free
  detail::KeyIndex index_;
  HostBlockId next_never_used_ = 0;
  std::vector<HostBlockId> freed_;  // a stack: most recently freed on top
  std::uint32_t epoch_ = 0;
  std::int64_t num_writing_ = 0;
  std::int64_t num_being_read_ = 0;
  std::int64_t num_held_ = 0;
  std::vector<ManagerEvent> events_;
  ManagerStats stats_;
  std::vector<HostBlockId> scratch_ids_;
  std::vector<std::uint64_t> key_hashes_;     // prepare_store: each key's hash
  std::vector<std::uint32_t> new_positions_;  // prepare_store: where each new key was given
};

}  // namespace kvoffload
