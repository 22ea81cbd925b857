#include "kvoffload/config.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/expects.hpp"

namespace kvoffload {

void validate(const ManagerConfig& config) {
  KVOFFLOAD_EXPECTS(config.host_blocks >= 1, "host_blocks must be at least 1, got {}",
                    config.host_blocks);
  KVOFFLOAD_EXPECTS(config.host_blocks <= (std::int64_t{1} << 31) - 2,
                    "host_blocks {} is too large (at most 2^31 - 2)", config.host_blocks);
  KVOFFLOAD_EXPECTS(
      config.policy != EvictionPolicyKind::arc || config.host_blocks <= (std::int64_t{1} << 30),
      "host_blocks {} is too large for policy arc (at most 2^30: its ghost lists "
      "need two ids a block)",
      config.host_blocks);
  KVOFFLOAD_EXPECTS(config.store_threshold == 0 || config.store_threshold >= 2,
                    "store_threshold must be 0 (off) or at least 2, got {}",
                    config.store_threshold);
  KVOFFLOAD_EXPECTS(config.threshold_tracker_keys >= 0,
                    "threshold_tracker_keys must not be negative, got {}",
                    config.threshold_tracker_keys);
  KVOFFLOAD_EXPECTS(config.block_bytes >= 0, "block_bytes must not be negative, got {}",
                    config.block_bytes);
  KVOFFLOAD_EXPECTS(config.policy == EvictionPolicyKind::lru ||
                        config.policy == EvictionPolicyKind::arc ||
                        config.policy == EvictionPolicyKind::reuse,
                    "policy: unknown eviction policy {}", static_cast<int>(config.policy));
}

std::vector<GroupLayout> derive_layouts(const SchedulerConfig& config) {
  KVOFFLOAD_EXPECTS(!config.groups.empty(), "groups: a model needs at least one group");
  KVOFFLOAD_EXPECTS(config.groups.size() <= 64, "groups: at most 64 groups, got {}",
                    config.groups.size());
  const std::int64_t f = config.block_size_factor;
  const std::int64_t h = config.hash_block_size;
  KVOFFLOAD_EXPECTS(f >= 1 && f <= 4096, "block_size_factor must be 1 to 4096, got {}", f);
  KVOFFLOAD_EXPECTS(h >= 1, "hash_block_size must be at least 1, got {}", h);
  KVOFFLOAD_EXPECTS(config.num_workers >= 1, "num_workers must be at least 1, got {}",
                    config.num_workers);
  validate(config.manager);
  KVOFFLOAD_EXPECTS(config.tiers.size() <= 8, "tiers: at most 8 tiers, got {}",
                    config.tiers.size());
  for (std::size_t t = 0; t < config.tiers.size(); ++t) {
    const TierConfig& tier = config.tiers[t];
    KVOFFLOAD_EXPECTS(tier.medium != Medium::host,
                      "tiers[{}].medium: a tier is below the host "
                      "cache, not \"host\"",
                      t);
    // The tiers' logic (a promotion reads the nearest tier that has the key, write-back goes
    // to the nearest tier) is built and tested for local tiers before the shared one.
    KVOFFLOAD_EXPECTS(
        t == 0 || tier.medium != Medium::disk || config.tiers[t - 1].medium == Medium::disk,
        "tiers[{}].medium: disk after a shared tier; disk tiers come first", t);
    KVOFFLOAD_EXPECTS(!tier.store || medium_of(*tier.store) == tier.medium,
                      "tiers[{}].store: a {} tier's store, but the tier's medium is {}", t,
                      to_string(medium_of(*tier.store)), to_string(tier.medium));
    KVOFFLOAD_EXPECTS(tier.blocks >= 1 && tier.blocks <= (std::int64_t{1} << 31) - 2,
                      "tiers[{}].blocks must be 1 to 2^31 - 2, got {}", t, tier.blocks);
    KVOFFLOAD_EXPECTS(tier.store_threshold == 0 || tier.store_threshold >= 2,
                      "tiers[{}].store_threshold must be 0 (off) or at least 2, got {}", t,
                      tier.store_threshold);
    KVOFFLOAD_EXPECTS(tier.write_queue_blocks >= 0,
                      "tiers[{}].write_queue_blocks must not be negative, got {}", t,
                      tier.write_queue_blocks);
    KVOFFLOAD_EXPECTS(tier.write_back_free_blocks >= 0 &&
                          tier.write_back_free_blocks <= config.manager.host_blocks,
                      "tiers[{}].write_back_free_blocks must be 0 to host_blocks ({}), got {}", t,
                      config.manager.host_blocks, tier.write_back_free_blocks);
    KVOFFLOAD_EXPECTS(tier.promote_timeout_ms >= 0 && tier.promote_timeout_ms <= 3'600'000,
                      "tiers[{}].promote_timeout_ms must be 0 (5000) to 3600000 (one hour), got {}",
                      t, tier.promote_timeout_ms);
    KVOFFLOAD_EXPECTS(
        tier.policy == EvictionPolicyKind::lru || tier.policy == EvictionPolicyKind::arc ||
            tier.policy == EvictionPolicyKind::reuse,
        "tiers[{}].policy: unknown eviction policy {}", t, static_cast<int>(tier.policy));
  }
  KVOFFLOAD_EXPECTS(config.gpu_blocks >= 0 && config.gpu_blocks <= (std::int64_t{1} << 31),
                    "gpu_blocks must be 0 (unknown) to 2^31, got {}", config.gpu_blocks);

  std::vector<GroupLayout> layouts;
  layouts.reserve(config.groups.size());
  for (std::size_t g = 0; g < config.groups.size(); ++g) {
    const GroupConfig& group = config.groups[g];
    KVOFFLOAD_EXPECTS(group.gpu_block_size >= 1 && group.gpu_block_size <= (1 << 20),
                      "groups[{}].gpu_block_size must be 1 to 2^20, got {}", g,
                      group.gpu_block_size);
    GroupLayout layout;
    layout.kind = group.kind;
    layout.gpu_block_size = group.gpu_block_size;
    layout.offloaded_block_size = group.gpu_block_size * f;
    KVOFFLOAD_EXPECTS(layout.offloaded_block_size % h == 0,
                      "groups[{}]: offloaded block size {} (gpu_block_size {} x "
                      "block_size_factor {}) is not a multiple of hash_block_size {}",
                      g, layout.offloaded_block_size, group.gpu_block_size, f, h);
    layout.hash_factor = layout.offloaded_block_size / h;
    switch (group.kind) {
      case GroupKind::full_attention:
        KVOFFLOAD_EXPECTS(group.sliding_window == 0,
                          "groups[{}].sliding_window is only for sliding_window groups", g);
        layout.window_blocks = 0;
        break;
      case GroupKind::sliding_window:
        KVOFFLOAD_EXPECTS(group.sliding_window > 0,
                          "groups[{}].sliding_window must be positive, got {}", g,
                          group.sliding_window);
        layout.window_blocks =
            (group.sliding_window + layout.offloaded_block_size - 1) / layout.offloaded_block_size;
        break;
      case GroupKind::mamba:
        KVOFFLOAD_EXPECTS(group.sliding_window == 0,
                          "groups[{}].sliding_window is only for sliding_window groups", g);
        layout.window_blocks = 1;
        break;
    }
    layouts.push_back(layout);
  }
  return layouts;
}

std::uint64_t weights_epoch(std::string_view weights) noexcept {
  // No identity is epoch 0: what a tier built without a scheduler (a test, a tool) uses.
  if (weights.empty()) return 0;
  constexpr std::uint64_t kSeed = 0x6b766f2d77656967;  // "kvo-weig": epochs of no other use
  return XXH3_64bits_withSeed(weights.data(), weights.size(), kSeed);
}

void SchedulerConfig::validate() const {
  (void)derive_layouts(*this);
}

}  // namespace kvoffload
