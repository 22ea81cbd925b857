#include "manager_fill.hpp"

#include <algorithm>
#include <span>
#include <stdexcept>
#include <string>

namespace kvbench {

ManagerFiller::ManagerFiller() : batch_(kBatch) {
  prepared_.keys_to_store.reserve(kBatch);
  prepared_.block_ids.reserve(kBatch);
  prepared_.key_blocks.reserve(kBatch);
  prepared_.key_stored.reserve(kBatch);
}

void ManagerFiller::store(kvoffload::HostBlockManager& m, std::uint64_t first, std::uint64_t last,
                          const std::function<kvoffload::Key(std::uint64_t)>& key_of,
                          const char* what) {
  const std::size_t batch = requests ? kRequest : kBatch;
  for (std::uint64_t at = first; at < last; at += batch) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(batch, last - at));
    for (std::size_t i = 0; i < n; ++i) batch_[i] = key_of(at + i);
    if (requests) {
      // The scheduler's lookup first: it touches what is resident and shows policy reuse
      // (its duel's shadows) every key the request asked for.
      m.set_context({++request_, static_cast<double>(request_) * 0.01, -1});
      m.touch(std::span<const kvoffload::Key>(batch_.data(), n));
    }
    if (!m.prepare_store(std::span<const kvoffload::Key>(batch_.data(), n), prepared_)) {
      throw std::runtime_error(std::string(what) + ": no room for a store");
    }
    if (requests) {
      m.touch_blocks(prepared_.key_blocks);
      m.set_context({});
    }
    m.complete_store_blocks(prepared_.block_ids, true);
    (void)m.take_events();  // as an engine does every step
  }
}

}  // namespace kvbench
