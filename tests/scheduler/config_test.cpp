#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "kvoffload/config.hpp"
#include "kvoffload/error.hpp"
#include "kvoffload/scheduler.hpp"
#include "support/scheduler_fixture.hpp"

using namespace kvtest;
using Catch::Matchers::ContainsSubstring;

TEST_CASE("Layouts are derived as SEMANTICS 1 says", "[config]") {
  const auto layouts =
      derive_layouts(make_config({full(16), window(1024, 16), mamba(32)}, 4, 100, 16));
  REQUIRE(layouts.size() == 3);
  CHECK(layouts[0].offloaded_block_size == 64);
  CHECK(layouts[0].hash_factor == 4);
  CHECK(layouts[0].window_blocks == 0);
  CHECK(layouts[1].window_blocks == 16);  // cdiv(1024, 64)
  CHECK(layouts[2].offloaded_block_size == 128);
  CHECK(layouts[2].hash_factor == 8);
  CHECK(layouts[2].window_blocks == 1);
  // cdiv rounds a partial block up.
  CHECK(derive_layouts(make_config({window(32, 16)}, 3, 8))[0].window_blocks == 1);
  CHECK(derive_layouts(make_config({window(100, 16)}, 3, 8))[0].window_blocks == 3);
}

TEST_CASE("Invalid configurations are rejected naming the field", "[config]") {
  auto rejects = [](SchedulerConfig c, const std::string& field) {
    CHECK_THROWS_WITH(Scheduler(c), ContainsSubstring(field));
    CHECK_THROWS_AS(Scheduler(c), invalid_argument);
  };
  rejects(make_config({}, 1, 8), "groups");
  rejects(make_config({full()}, 0, 8), "block_size_factor");
  rejects(make_config({full()}, 1, 8, 0), "hash_block_size");
  rejects(make_config({full(16)}, 1, 8, 32), "hash_block_size");  // 16 is not a multiple of 32
  rejects(make_config({full(), window(0)}, 1, 8), "groups[1].sliding_window");
  rejects(make_config({full(0)}, 1, 8), "groups[0].gpu_block_size");
  rejects(make_config({full()}, 1, 0), "host_blocks");
  rejects(make_config({full()}, 1, 8, 16, 0), "num_workers");
  CHECK_THROWS_WITH(
      parse_eviction_policy("mru", "policy"),
      ContainsSubstring("policy: unknown eviction policy \"mru\" (lru, arc or reuse)"));
  auto c = make_config({full()}, 1, 8);
  c.manager.policy = static_cast<EvictionPolicyKind>(7);  // e.g. from a bad cast in a binding
  rejects(c, "policy");
  auto hint = make_config({full()}, 1, 8);
  hint.gpu_blocks = -1;
  rejects(hint, "gpu_blocks");
  CHECK_THROWS_WITH(parse_group_kind("dense", "groups[2].kind"),
                    ContainsSubstring("groups[2].kind"));
  CHECK(parse_group_kind("mamba", "kind") == GroupKind::mamba);
}
