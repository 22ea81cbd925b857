#include "kvoffload/eviction_policy.hpp"

#include "expects.hpp"
#include "kvoffload/arc_policy.hpp"
#include "kvoffload/lru_policy.hpp"

namespace kvoffload {

EvictionPolicy::~EvictionPolicy() = default;

std::unique_ptr<EvictionPolicy> make_eviction_policy(std::string_view name, std::size_t capacity) {
  if (name == "lru") return std::make_unique<LruPolicy>(capacity);
  if (name == "arc") return std::make_unique<ArcPolicy>(capacity);
  throw invalid_argument(fmt::format("policy: unknown eviction policy \"{}\" (lru or arc)", name));
}

}  // namespace kvoffload
