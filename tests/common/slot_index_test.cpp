#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include <catch2/catch_test_macros.hpp>

#include "kvoffload/detail/slot_index.hpp"

using kvoffload::detail::SlotIndex;

// Records whose keys change, as the reuse policy's do: the index must find each record by its
// current key, after growth and after backward-shift erases moved entries of the same run.
TEST_CASE("SlotIndex agrees with a map under random inserts, erases and key changes",
          "[slot_index][property]") {
  const auto seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  constexpr std::uint32_t kRecords = 3000;
  std::vector<std::uint64_t> key(kRecords, 0);  // 0: not indexed
  const auto key_of = [&key](std::uint32_t s) { return key[s]; };
  SlotIndex index;
  std::map<std::uint64_t, std::uint32_t> model;
  for (int op = 0; op < 300000; ++op) {
    const auto s = static_cast<std::uint32_t>(rng() % kRecords);
    // Few distinct keys, so runs are long and erases shift entries.
    const std::uint64_t k = 1 + rng() % 5000;
    if (rng() % 2 == 0) {
      // Re-key record s to k if nobody holds k: erase under the old key first.
      if (model.count(k) == 0) {
        if (key[s] != 0) {
          REQUIRE(index.erase(key[s], s, key_of));
          model.erase(key[s]);
        }
        key[s] = k;
        index.insert(k, s, key_of);
        model.emplace(k, s);
      }
    } else if (key[s] != 0 && rng() % 2 == 0) {
      REQUIRE(index.erase(key[s], s, key_of));
      model.erase(key[s]);
      key[s] = 0;
    } else {
      // Erasing a key under another slot changes nothing.
      const auto it = model.find(k);
      if (it != model.end()) REQUIRE_FALSE(index.erase(k, (it->second + 1) % kRecords, key_of));
    }
    const auto it = model.find(k);
    REQUIRE(index.find(k, key_of) == (it == model.end() ? SlotIndex::npos : it->second));
    REQUIRE(index.size() == model.size());
  }
  for (const auto& [k, s] : model) REQUIRE(index.find(k, key_of) == s);
  index.clear();
  REQUIRE(index.size() == 0);
  REQUIRE(index.find(model.begin()->first, key_of) == SlotIndex::npos);
}
