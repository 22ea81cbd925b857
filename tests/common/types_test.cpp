#include <catch2/catch_test_macros.hpp>

#include "kvoffload/error.hpp"
#include "kvoffload/types.hpp"

using namespace kvoffload;

TEST_CASE("BlockHash round-trips hex and bytes", "[types]") {
  const BlockHash h = BlockHash::from_hex("00ff10Ab");
  CHECK(h.size() == 4);
  CHECK(h.to_hex() == "00ff10ab");
  const std::uint8_t raw[] = {0x00, 0xff, 0x10, 0xab};
  CHECK(BlockHash::from_bytes(raw) == h);
  CHECK(BlockHash::from_hex(std::string(64, 'f')).size() == 32);
}

TEST_CASE("BlockHash equality includes the length", "[types]") {
  // "00" and "0000" have the same zero-padded bytes; they are different hashes.
  CHECK_FALSE(BlockHash::from_hex("00") == BlockHash::from_hex("0000"));
  CHECK_FALSE(Key{BlockHash::from_hex("aa"), 0} == Key{BlockHash::from_hex("aa"), 1});
  CHECK(KeyHash{}(Key{BlockHash::from_hex("aa"), 0}) !=
        KeyHash{}(Key{BlockHash::from_hex("aa"), 1}));
}

TEST_CASE("BlockHash rejects bad input with a clear message", "[types]") {
  CHECK_THROWS_AS(BlockHash::from_hex(""), invalid_argument);
  CHECK_THROWS_AS(BlockHash::from_hex("abc"), invalid_argument);
  CHECK_THROWS_AS(BlockHash::from_hex("zz"), invalid_argument);
  CHECK_THROWS_AS(BlockHash::from_hex(std::string(66, 'a')), invalid_argument);
  CHECK_THROWS_AS(BlockHash::from_bytes({}), invalid_argument);
  const std::uint8_t big[33] = {};
  CHECK_THROWS_AS(BlockHash::from_bytes(big), invalid_argument);
}
