// The CUDA backend's ring allocator: first in, first out, released in any order.

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include <catch2/catch_test_macros.hpp>

#include "transfer/cuda/ring_allocator.hpp"

using kvoffload::detail::RingAllocator;

TEST_CASE("Ring allocator: slices never overlap and space returns once older ones go",
          "[ring_allocator]") {
  RingAllocator ring(1024);
  const auto a = ring.allocate(300);  // 320
  const auto b = ring.allocate(300);  // 320
  const auto c = ring.allocate(300);  // 320: 960 used
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(c);
  CHECK(*a == 0);
  CHECK(*b == 320);
  CHECK(*c == 640);
  CHECK_FALSE(ring.allocate(100));  // 64 left at the end, nothing at the front
  ring.release(*b);                 // not the oldest: no space yet
  CHECK_FALSE(ring.allocate(100));
  ring.release(*a);  // a and b go: 640 free at the front
  const auto d = ring.allocate(600);
  REQUIRE(d);
  CHECK(*d == 0);
  CHECK_FALSE(ring.allocate(64));  // between d's end (640) and c (640): nothing
  ring.release(*c);
  ring.release(*d);
  CHECK(ring.live() == 0);
  CHECK(ring.allocate(1024) == std::optional<std::uint64_t>(0));
  CHECK_FALSE(ring.allocate(0));
}

TEST_CASE("Ring allocator: random traffic keeps live slices disjoint",
          "[ring_allocator][property]") {
  std::mt19937 rng(5);
  std::printf("ring allocator seed 5\n");
  RingAllocator ring(64 * 1024);
  struct Live {
    std::uint64_t at, size;
  };
  std::vector<Live> live;
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 2 == 0) {
      const std::uint64_t size = 1 + rng() % 5000;
      if (auto at = ring.allocate(size)) {
        const std::uint64_t rounded = (size + 63) / 64 * 64;
        REQUIRE(*at + rounded <= ring.capacity());
        for (const Live& l : live) REQUIRE((*at + rounded <= l.at || l.at + l.size <= *at));
        live.push_back({*at, rounded});
      }
    } else {
      const std::size_t i = rng() % live.size();
      ring.release(live[i].at);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
}
