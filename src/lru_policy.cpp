#include "kvoffload/lru_policy.hpp"

#include <ranges>

#include "expects.hpp"

namespace kvoffload {

EvictionPolicy::~EvictionPolicy() = default;

std::unique_ptr<EvictionPolicy> make_eviction_policy(std::string_view name, std::size_t capacity) {
  if (name == "lru") return std::make_unique<LruPolicy>(capacity);
  throw invalid_argument(fmt::format("policy: unknown eviction policy \"{}\" (lru)", name));
}

LruPolicy::LruPolicy(std::size_t capacity)
    : sentinel_(capacity), prev_(capacity + 1), next_(capacity + 1), linked_(capacity + 1, 0) {
  reset();
}

void LruPolicy::reset() {
  prev_[sentinel_] = static_cast<std::uint32_t>(sentinel_);
  next_[sentinel_] = static_cast<std::uint32_t>(sentinel_);
  std::fill(linked_.begin(), linked_.end(), std::uint8_t{0});
}

void LruPolicy::unlink(std::size_t id) noexcept {
  next_[prev_[id]] = next_[id];
  prev_[next_[id]] = prev_[id];
  linked_[id] = 0;
}

void LruPolicy::link_most_recent(std::size_t id) noexcept {
  const std::uint32_t last = prev_[sentinel_];
  prev_[id] = last;
  next_[id] = static_cast<std::uint32_t>(sentinel_);
  next_[last] = static_cast<std::uint32_t>(id);
  prev_[sentinel_] = static_cast<std::uint32_t>(id);
  linked_[id] = 1;
}

void LruPolicy::insert(HostBlockId id, const Key& /*key*/) {
  const auto i = static_cast<std::size_t>(id);
  if (linked_[i]) unlink(i);
  link_most_recent(i);
}

void LruPolicy::touch(std::span<const HostBlockId> ids) {
  for (const HostBlockId id : std::views::reverse(ids)) {
    const auto i = static_cast<std::size_t>(id);
    if (!linked_[i]) continue;
    unlink(i);
    link_most_recent(i);
  }
}

bool LruPolicy::select_victims(std::size_t count, detail::function_ref<bool(HostBlockId)> can_evict,
                               std::vector<HostBlockId>& victims) {
  const std::size_t before = victims.size();
  for (std::size_t i = next_[sentinel_]; i != sentinel_ && victims.size() - before < count;
       i = next_[i]) {
    if (can_evict(static_cast<HostBlockId>(i))) victims.push_back(static_cast<HostBlockId>(i));
  }
  if (victims.size() - before < count) {
    victims.resize(before);
    return false;
  }
  return true;
}

void LruPolicy::evict(HostBlockId id, const Key& /*key*/) {
  const auto i = static_cast<std::size_t>(id);
  if (linked_[i]) unlink(i);
}

void LruPolicy::erase(HostBlockId id) {
  const auto i = static_cast<std::size_t>(id);
  if (linked_[i]) unlink(i);
}

std::vector<HostBlockId> LruPolicy::order() const {
  std::vector<HostBlockId> out;
  for (std::size_t i = next_[sentinel_]; i != sentinel_; i = next_[i]) {
    out.push_back(static_cast<HostBlockId>(i));
  }
  return out;
}

}  // namespace kvoffload
