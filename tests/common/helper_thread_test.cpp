#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include <catch2/catch_test_macros.hpp>

#include "common/helper_thread.hpp"

using kvoffload::detail::HelperThread;

TEST_CASE("A helper thread runs posted work in order, off the poster's thread", "[helper_thread]") {
  HelperThread helper;
  std::vector<int> order;  // written by the helper only, read after wait()
  std::atomic<bool> other_thread{true};
  const auto poster = std::this_thread::get_id();
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 50; ++i) {
      helper.post([&, i] {
        if (i % 10 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        if (std::this_thread::get_id() == poster) other_thread = false;
        order.push_back(round * 50 + i);
      });
    }
    helper.wait();  // everything posted so far has run, and its writes are visible
    REQUIRE(order.size() == static_cast<std::size_t>((round + 1) * 50));
  }
  for (std::size_t i = 0; i < order.size(); ++i) CHECK(order[i] == static_cast<int>(i));
  CHECK(other_thread);
  helper.wait();  // nothing posted: returns at once
}

TEST_CASE("A helper thread runs what was posted before it is destroyed", "[helper_thread]") {
  int ran = 0;
  {
    HelperThread helper;
    for (int i = 0; i < 20; ++i) {
      helper.post([&ran] {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        ++ran;
      });
    }
  }
  CHECK(ran == 20);
}

TEST_CASE("Work that throws on a helper thread ends neither it nor the process",
          "[helper_thread]") {
  HelperThread helper;
  int after = 0;
  helper.post([] { throw std::runtime_error("out of memory"); });
  helper.post([&after] { after = 1; });
  helper.wait();
  CHECK(after == 1);
}
