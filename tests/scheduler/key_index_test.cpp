#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <cstdio>
#include <random>
#include <unordered_map>

#include "kvoffload/detail/key_index.hpp"

using kvoffload::BlockHash;
using kvoffload::HostBlockId;
using kvoffload::Key;
using kvoffload::detail::KeyIndex;

namespace {
Key key_of(std::uint64_t n, std::uint32_t group) {
  std::uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<std::uint8_t>(n >> (8 * i));
  return Key{BlockHash::from_bytes(b), group};
}
}  // namespace

TEST_CASE("KeyIndex agrees with a reference map under random inserts and erases", "[property]") {
  const std::uint64_t seed = std::random_device{}();
  std::printf("KeyIndex test seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  // 128 slots, and sizes that are no power of two (the table is exactly twice the entries, so
  // probe chains wrap at the end at any size), each at most half full: long shared chains.
  const int kBlocks = GENERATE(64, 37, 9);
  std::printf("KeyIndex test: %d blocks\n", kBlocks);
  KeyIndex index(static_cast<std::size_t>(kBlocks));
  std::vector<Key> keys(kBlocks);
  std::vector<bool> used(kBlocks, false);
  std::unordered_map<std::uint64_t, HostBlockId> reference;  // key number -> block
  std::vector<std::uint64_t> number(kBlocks);
  for (int op = 0; op < 20000; ++op) {
    const HostBlockId id = static_cast<HostBlockId>(rng() % kBlocks);
    if (used[static_cast<std::size_t>(id)]) {
      const Key& k = keys[static_cast<std::size_t>(id)];
      REQUIRE(index.erase(KeyIndex::hash(k), id));
      reference.erase(number[static_cast<std::size_t>(id)]);
      used[static_cast<std::size_t>(id)] = false;
    } else {
      const std::uint64_t n =
          rng() % (3 * kBlocks);  // repeats: inserting a present key must not add it
      const Key k = key_of(n, static_cast<std::uint32_t>(n % 3));
      const auto [found, added] = index.insert(k, KeyIndex::hash(k), id, keys.data());
      const auto it = reference.find(n);
      REQUIRE(added == (it == reference.end()));
      if (added) {
        keys[static_cast<std::size_t>(id)] = k;
        number[static_cast<std::size_t>(id)] = n;
        used[static_cast<std::size_t>(id)] = true;
        reference[n] = id;
      } else {
        REQUIRE(found == it->second);
      }
    }
    REQUIRE(index.size() == reference.size());
    for (std::uint64_t n = 0; n < 3 * static_cast<std::uint64_t>(kBlocks); ++n) {
      const Key k = key_of(n, static_cast<std::uint32_t>(n % 3));
      const auto it = reference.find(n);
      REQUIRE(index.find(k, KeyIndex::hash(k), keys.data()) ==
              (it == reference.end() ? -1 : it->second));
    }
  }
  index.clear();
  REQUIRE(index.size() == 0);
  const Key k = key_of(1, 1);
  REQUIRE(index.find(k, KeyIndex::hash(k), keys.data()) == -1);
}

TEST_CASE("KeyIndex tells keys apart by group and erases only the given block") {
  KeyIndex index(4);
  std::vector<Key> keys(4);
  const Key a0 = key_of(7, 0), a1 = key_of(7, 1);
  keys[0] = a0;
  REQUIRE(index.insert(a0, KeyIndex::hash(a0), 0, keys.data()).second);
  keys[1] = a1;
  REQUIRE(index.insert(a1, KeyIndex::hash(a1), 1, keys.data()).second);
  REQUIRE(index.find(a1, KeyIndex::hash(a1), keys.data()) == 1);
  REQUIRE_FALSE(index.erase(KeyIndex::hash(a0), 3));  // not block 3's entry
  REQUIRE(index.erase(KeyIndex::hash(a0), 0));
  REQUIRE(index.find(a0, KeyIndex::hash(a0), keys.data()) == -1);
  REQUIRE(index.find(a1, KeyIndex::hash(a1), keys.data()) == 1);
}
