#include <map>
#include <random>

#include <catch2/catch_test_macros.hpp>

#include "kvoffload/detail/flat_hash_map.hpp"

using kvoffload::detail::FlatHashMap;
using kvoffload::detail::IntHash;

TEST_CASE("FlatHashMap agrees with std::map under random inserts and erases",
          "[flat_hash_map][property]") {
  const auto seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  FlatHashMap<int, int, IntHash> map;
  std::map<int, int> model;
  for (int op = 0; op < 200000; ++op) {
    const int key = static_cast<int>(rng() % 2000);
    switch (rng() % 3) {
      case 0: {
        auto [value, inserted] = map.insert(key, op);
        const bool fresh = model.emplace(key, op).second;
        REQUIRE(inserted == fresh);
        REQUIRE(*value == model[key]);
        break;
      }
      case 1: REQUIRE(map.erase(key) == (model.erase(key) == 1)); break;
      default: {
        const int* v = map.find(key);
        auto it = model.find(key);
        REQUIRE((v != nullptr) == (it != model.end()));
        if (v != nullptr) REQUIRE(*v == it->second);
      }
    }
    REQUIRE(map.size() == model.size());
  }
  std::size_t seen = 0;
  map.for_each([&](int k, int v) {
    ++seen;
    REQUIRE(model.at(k) == v);
  });
  CHECK(seen == model.size());
  map.clear();
  CHECK(map.empty());
  CHECK(map.find(1) == nullptr);
}
