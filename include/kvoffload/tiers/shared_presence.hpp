#pragma once

// How the scheduler learns what a shared tier holds: it asks, without blocking, and reads the
// answer at a later lookup (docs/semantics.md, "Tiers": the shared tier). A check of a
// request's keys is in flight while its lookup answers "retry later".

#include <cstdint>
#include <memory>
#include <vector>

#include "kvoffload/config.hpp"
#include "kvoffload/export.hpp"
#include "kvoffload/scheduler.hpp"
#include "kvoffload/types.hpp"

namespace kvoffload {

/// The answer to one check: present[i] for keys[i] of the check. A key whose check failed
/// (the cluster unreachable, a timeout, AUTH refused) is absent, and counted in `errors`.
struct PresenceAnswer {
  std::uint64_t ticket = 0;
  std::vector<bool> present;
  std::size_t errors = 0;  ///< keys without a usable answer (an outage, not a miss)
};

/// Asked by the scheduler's thread only; an implementation answers from wherever it likes.
class KVOFFLOAD_EXPORT PresenceCheck {
 public:
  virtual ~PresenceCheck();
  /// Starts checking `keys` under the weights' epoch `epoch` (a key is present if every
  /// tensor-parallel rank's row is, written under that epoch). Must not block on the network.
  virtual void submit(std::uint64_t ticket, std::uint64_t epoch, std::vector<Key> keys) = 0;
  /// The checks finished since the last call.
  virtual std::vector<PresenceAnswer> poll() = 0;
};

/// Pipelined EXISTS of every rank's key (one slot per key: the ranks share a hash tag) on the
/// cluster config.nodes names, from a thread of its own. Uses config's nodes, name, tp_size
/// and timeouts, and the scheduler's block_size_factor (the namespace: shared_namespace);
/// throws invalid_argument naming the field for a bad one.
KVOFFLOAD_EXPORT std::shared_ptr<PresenceCheck> make_cluster_presence(
    const SharedTierConfig& config, std::int64_t block_size_factor);

/// The services `config` describes, started: a make_cluster_presence for each shared tier,
/// from its store (TierConfig::store) and the config's block_size_factor. Validates the config
/// first; throws invalid_argument naming the field (a shared tier without a store, say).
KVOFFLOAD_EXPORT SchedulerServices make_scheduler_services(const SchedulerConfig& config);

}  // namespace kvoffload
