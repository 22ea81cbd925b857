#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvoffload/enums.hpp"
#include "kvoffload/export.hpp"
#include "kvoffload/tiers/tier_config.hpp"

namespace kvoffload {

/// One KV-cache group of the model (SEMANTICS 1).
struct GroupConfig {
  GroupKind kind = GroupKind::full_attention;
  std::int64_t gpu_block_size = 16;  ///< tokens per GPU block
  std::int64_t sliding_window = 0;   ///< tokens; sliding_window groups only, > 0
};

/// The host block manager: capacity in offloaded blocks and eviction policy.
struct ManagerConfig {
  std::int64_t host_blocks = 0;
  EvictionPolicyKind policy = EvictionPolicyKind::lru;
  /// Store admission: 0 (off) or N >= 2, a key is stored only once it was looked up N times.
  std::int64_t store_threshold = 0;
  /// Keys whose lookups the admission tracker remembers (0: 4 x host_blocks, at least 1024).
  std::int64_t threshold_tracker_keys = 0;
  /// Bytes of one host block, for the byte counters of the statistics (0: unknown).
  std::int64_t block_bytes = 0;
  /// Record "stored"/"removed" events for take_events(). They accumulate until taken, so an
  /// engine that does not publish KV events must turn this off (or call take_events() every
  /// step) to keep memory flat.
  bool enable_events = true;
  /// The medium the manager's events name (a tier's index is a manager too).
  Medium medium = Medium::host;
};

/// A tier below the host cache (docs/semantics.md, "Tiers"), described once for both sides:
/// the scheduler keeps its index (which key is in which slot: the fields below), the workers
/// run its store and move the bytes (derive_worker_config hands them `store`).
struct TierConfig {
  Medium medium = Medium::disk;
  std::int64_t blocks = 0;  ///< capacity in offloaded blocks (slots), > 0
  EvictionPolicyKind policy = EvictionPolicyKind::lru;
  /// Admission: 0 (off) or N >= 2, a key is written to the tier only once it was looked up N
  /// times, so single-use blocks do not wear the disk.
  std::int64_t store_threshold = 0;
  /// Blocks that may wait for or be in a tier write at once (0: 1024). A write that does not
  /// fit is skipped and counted; a step never waits for the tier.
  std::int64_t write_queue_blocks = 0;
  /// Write-back instead of write-through: blocks are written to the tier when the host cache
  /// evicts them. The scheduler keeps `write_back_free_blocks` host blocks free (0: 1/16 of
  /// host_blocks, at least 1) by writing the blocks its policy would evict next and evicting
  /// them once written; a block whose key the tier has, or does not admit, is evicted at once.
  bool write_back = false;
  std::int64_t write_back_free_blocks = 0;
  /// How long lookups wait for a promotion from this tier (0: 5000 ms; at most one hour).
  /// Past it, the keys the promotion is filling are misses for every lookup (the request
  /// computes them; counted in TierStats::promotions_overdue) while their host blocks stay
  /// out of use until the workers report the job: a stalled disk or a slow node never keeps a
  /// request waiting, and a late read never lands in a block that holds something else.
  std::int64_t promote_timeout_ms = 0;
  /// The workers' side: the disk tier's files or the shared tier's cluster, of this medium.
  /// The scheduler reads none of it; a worker derived from this config (derive_worker_config)
  /// and make_scheduler_services (a shared tier's presence checks) need it. Unset: a config
  /// for a scheduler whose workers and services are configured apart.
  std::optional<TierStore> store;
};

/// Everything the scheduler needs to know about the model and the cache.
struct KVOFFLOAD_EXPORT SchedulerConfig {
  std::vector<GroupConfig> groups;
  std::int64_t block_size_factor = 1;  ///< GPU blocks per offloaded block, f >= 1
  std::int64_t hash_block_size = 16;   ///< tokens per engine block hash
  std::int64_t num_workers = 1;        ///< reports needed before a job completes
  bool prefix_caching = true;          ///< defer requests that would load keys being loaded
  /// The engine's GPU block count, if known: sizes the block-reuse fence's table up front
  /// (0: it grows as block ids appear).
  std::int64_t gpu_blocks = 0;
  ManagerConfig manager;
  /// Tiers below the host cache, nearest first. Empty: no tier, every behaviour as without.
  std::vector<TierConfig> tiers;
  /// The model weights' identity (a checkpoint digest, a training step), engine-given: every
  /// tier keys blocks by its epoch (weights_epoch), so blocks stored under other weights are
  /// never found, and a disk tier restores only its own weights' slots after a restart.
  /// Scheduler::reset_cache(weights) moves to new weights in the same call.
  std::string weights;

  /// Throws invalid_argument naming the first bad field (e.g. "groups[1].sliding_window").
  void validate() const;
};

/// The epoch of a weights identity (SchedulerConfig::weights): a 64-bit digest that tier jobs
/// carry (TierJob::epoch) and the tiers key their blocks by; 0 for no identity ("").
KVOFFLOAD_EXPORT std::uint64_t weights_epoch(std::string_view weights) noexcept;

/// Validates a manager configuration; throws invalid_argument naming the field.
KVOFFLOAD_EXPORT void validate(const ManagerConfig& config);

/// The per-group quantities SEMANTICS 1 derives from a configuration.
struct GroupLayout {
  GroupKind kind = GroupKind::full_attention;
  std::int64_t gpu_block_size = 0;
  std::int64_t offloaded_block_size = 0;  ///< gpu_block_size * block_size_factor
  std::int64_t hash_factor = 0;           ///< offloaded_block_size / hash_block_size
  std::int64_t window_blocks = 0;         ///< 0 for full attention

  [[nodiscard]] bool windowed() const noexcept { return kind != GroupKind::full_attention; }
};

/// Validates `config` and derives every group's layout.
KVOFFLOAD_EXPORT std::vector<GroupLayout> derive_layouts(const SchedulerConfig& config);

}  // namespace kvoffload
