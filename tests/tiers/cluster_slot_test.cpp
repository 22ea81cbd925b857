// The cluster key-slot rule of the shared tier (issue 17), against published values: the
// CRC-16/XMODEM check value, and CLUSTER KEYSLOT answers from the Redis and Dragonfly command
// references ("same as in Valkey"), with the hash-tag rules of the cluster specification.

#include <catch2/catch_test_macros.hpp>

#include "tiers/shared/cluster_slot.hpp"

using namespace kvoffload::detail;

TEST_CASE("CRC-16/XMODEM has its catalogued check value", "[cluster_slot]") {
  CHECK(crc16_xmodem("123456789") == 0x31C3);
  CHECK(crc16_xmodem("") == 0);
}

TEST_CASE("Key slots match CLUSTER KEYSLOT's published answers", "[cluster_slot]") {
  CHECK(cluster_slot("somekey") == 11058);
  CHECK(cluster_slot("foo{hash_tag}") == 2515);
  CHECK(cluster_slot("bar{hash_tag}") == 2515);
  CHECK(cluster_slot("{user1}.following") == 8106);
  CHECK(cluster_slot("user:case") == 9491);
  CHECK(cluster_slot("user:info") == 15429);
  CHECK(cluster_slot("user:case{1}") == 9842);
  CHECK(cluster_slot("user:info{1}") == 9842);
}

TEST_CASE("Hash tags follow the cluster specification's rules", "[cluster_slot]") {
  CHECK(hash_tag("{user1000}.following") == "user1000");
  CHECK(hash_tag("{user1000}.followers") == "user1000");
  CHECK(hash_tag("foo{}{bar}") == "foo{}{bar}");  // empty first tag: the whole key
  CHECK(hash_tag("foo{{bar}}zap") == "{bar");     // up to the first '}' after the first '{'
  CHECK(hash_tag("foo{bar}{zap}") == "bar");      // the first tag only
  CHECK(hash_tag("no tag") == "no tag");
  CHECK(hash_tag("open{only") == "open{only");
  CHECK(cluster_slot("{user1000}.following") == cluster_slot("{user1000}.followers"));
  for (const char* key : {"a", "kvoffload/x/0", "\xff\xfe", "{}"}) {
    const int slot = cluster_slot(key);
    CHECK(slot >= 0);
    CHECK(slot < kClusterSlots);
  }
}
