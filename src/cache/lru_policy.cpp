#include "kvoffload/lru_policy.hpp"

#include "common/expects.hpp"

namespace kvoffload {

namespace {
constexpr std::size_t kRecency = 0;
}

LruPolicy::LruPolicy(std::size_t capacity) : list_(capacity, 1) {}

void LruPolicy::reset() {
  list_.clear();
}

void LruPolicy::insert(HostBlockId id, const Key& /*key*/) {
  list_.push_back(kRecency, static_cast<std::uint32_t>(id));
}

void LruPolicy::touch(std::span<const HostBlockId> ids,
                      detail::function_ref<bool(HostBlockId)> /*ready*/) {
  // Moving an id twice leaves it where its first occurrence from the front puts it, which is
  // one access either way.
  // Last to first (a plain loop: clang 14 cannot compile libstdc++ 12's views::reverse).
  for (std::size_t i = ids.size(); i-- > 0;) {
    const HostBlockId id = ids[i];
    const auto node = static_cast<std::uint32_t>(id);
    if (id >= 0 && list_.linked(node)) list_.push_back(kRecency, node);
  }
}

bool LruPolicy::select_victims(std::size_t count, detail::function_ref<bool(HostBlockId)> can_evict,
                               std::vector<HostBlockId>& victims) {
  const std::size_t before = victims.size();
  for (std::uint32_t n = list_.front(kRecency);
       n != detail::IntrusiveLists::npos && victims.size() - before < count; n = list_.next(n)) {
    if (can_evict(static_cast<HostBlockId>(n))) victims.push_back(static_cast<HostBlockId>(n));
  }
  if (victims.size() - before < count) {
    victims.resize(before);
    return false;
  }
  return true;
}

void LruPolicy::evict(HostBlockId id, const Key& /*key*/) {
  erase(id);
}

void LruPolicy::erase(HostBlockId id) {
  const auto node = static_cast<std::uint32_t>(id);
  if (list_.linked(node)) list_.remove(node);
}

std::vector<HostBlockId> LruPolicy::order() const {
  std::vector<HostBlockId> out;
  for (std::uint32_t n = list_.front(kRecency); n != detail::IntrusiveLists::npos;
       n = list_.next(n)) {
    out.push_back(static_cast<HostBlockId>(n));
  }
  return out;
}

}  // namespace kvoffload
