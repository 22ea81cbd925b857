#include "kvoffload/eviction_policy.hpp"

#include "common/expects.hpp"
#include "kvoffload/arc_policy.hpp"
#include "kvoffload/lru_policy.hpp"
#include "kvoffload/reuse_policy.hpp"

namespace kvoffload {

EvictionPolicy::~EvictionPolicy() = default;

void EvictionPolicy::set_context(const AccessContext& /*context*/) {}

void EvictionPolicy::looked_up(std::span<const Key> /*keys*/) {}

std::unique_ptr<EvictionPolicy> make_eviction_policy(EvictionPolicyKind kind,
                                                     std::size_t capacity) {
  switch (kind) {
    case EvictionPolicyKind::lru: return std::make_unique<LruPolicy>(capacity);
    case EvictionPolicyKind::arc: return std::make_unique<ArcPolicy>(capacity);
    case EvictionPolicyKind::reuse: return std::make_unique<ReusePolicy>(capacity);
  }
  throw invalid_argument(fmt::format("policy: unknown eviction policy {}", static_cast<int>(kind)));
}

}  // namespace kvoffload
