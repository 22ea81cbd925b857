#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "kvoffload/detail/function_ref.hpp"
#include "kvoffload/enums.hpp"
#include "kvoffload/export.hpp"
#include "kvoffload/types.hpp"

namespace kvoffload {

/// Who is behind the inserts and touches that follow, for a policy that values blocks by the
/// request that last used them (ReusePolicy); the others ignore it. The scheduler sets it
/// around each request's touches and stores and clears it after (request 0: nobody's).
struct AccessContext {
  std::uint64_t request = 0;  ///< the scheduler's serial number of the request; 0: none
  double now = 0;             ///< seconds on the scheduler's clock (Scheduler::set_time)
  /// The engine's hint for the request (kv_transfer_params "kvoffload_continues"): 1 its
  /// conversation will go on, 0 it will not, -1 unknown.
  std::int8_t continues = -1;
};

/// Orders the resident host blocks for eviction. The HostBlockManager owns one and tells it
/// about every block that enters or leaves; the policy never decides on its own which blocks
/// are protected (being written, read, or stored right now): the manager passes that as a
/// predicate. Keys are passed along so that policies with history (ARC's ghost lists) can
/// remember blocks after they leave. Not thread-safe; called only by the manager.
class KVOFFLOAD_EXPORT EvictionPolicy {
 public:
  virtual ~EvictionPolicy();

  /// The request behind the calls that follow (see AccessContext). Default: ignored.
  virtual void set_context(const AccessContext& context);

  /// The running request looked up these keys, resident or not, in its order (before the
  /// touch of those it found). Default: ignored; ReusePolicy's duel replays them.
  virtual void looked_up(std::span<const Key> keys);

  /// A new block (just prepared for a store) enters as the most recent.
  virtual void insert(HostBlockId id, const Key& key) = 0;
  /// The engine used these blocks again: one access each, however often an id repeats in the
  /// call. Walked from last to first, so after the call ids.front() is the most valuable: a
  /// request's first block outlives its tail. ready(id) tells whether a block's store has
  /// completed (ARC promotes only ready blocks). Negative ids (unknown blocks) are skipped.
  virtual void touch(std::span<const HostBlockId> ids,
                     detail::function_ref<bool(HostBlockId)> ready) = 0;
  /// Appends to `victims`, least valuable first, `count` distinct blocks for which
  /// can_evict(id) is true. Returns false, with `victims` as it was, if there are fewer.
  /// Changes nothing: the manager calls evict() for each victim it takes.
  virtual bool select_victims(std::size_t count, detail::function_ref<bool(HostBlockId)> can_evict,
                              std::vector<HostBlockId>& victims) = 0;
  /// The block is evicted to make room.
  virtual void evict(HostBlockId id, const Key& key) = 0;
  /// The block is dropped without eviction (its store failed).
  virtual void erase(HostBlockId id) = 0;
  /// Forget everything.
  virtual void reset() = 0;
};

/// The policy of that kind for `capacity` blocks.
KVOFFLOAD_EXPORT std::unique_ptr<EvictionPolicy> make_eviction_policy(EvictionPolicyKind kind,
                                                                      std::size_t capacity);

}  // namespace kvoffload
