// The thread-safety contract: a Scheduler is single-threaded (debug builds detect a second
// thread inside it), a TransferEngine may be fed and polled from different threads. These run
// under ThreadSanitizer in scripts/test.

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "kvoffload/detail/single_thread_guard.hpp"
#include "kvoffload/error.hpp"
#include "kvoffload/host_backend.hpp"
#include "kvoffload/scheduler.hpp"
#include "kvoffload/transfer_engine.hpp"
#include "support/kv_fixture.hpp"

using namespace kvoffload;

TEST_CASE("The single-thread guard refuses a second thread while the first is inside",
          "[threads]") {
  detail::SingleThreadGuard guard;
  std::atomic<bool> inside{false}, release{false};
  std::thread holder([&] {
    const detail::SingleThreadGuard::Scope scope(guard, "first");
    inside = true;
    while (!release) std::this_thread::yield();
  });
  while (!inside) std::this_thread::yield();
  CHECK_THROWS_WITH((detail::SingleThreadGuard::Scope(guard, "build_step")),
                    Catch::Matchers::ContainsSubstring("build_step") &&
                        Catch::Matchers::ContainsSubstring("single-threaded"));
  release = true;
  holder.join();
  // Free again: the refused call did not leave the guard taken, nor did the holder.
  CHECK_NOTHROW(detail::SingleThreadGuard::Scope(guard, "later"));
  // Sequential use from several threads is fine.
  for (int i = 0; i < 4; ++i) {
    std::thread([&] { const detail::SingleThreadGuard::Scope s(guard, "turn"); }).join();
  }
}

#ifndef NDEBUG
TEST_CASE("A debug Scheduler detects two threads calling it at once", "[threads]") {
  SchedulerConfig c;
  c.groups = {GroupConfig{}};
  c.manager.host_blocks = 64;
  Scheduler s(c);
  std::vector<BlockHash> hashes;
  for (int i = 0; i < 64; ++i) {
    const std::uint8_t b[2] = {static_cast<std::uint8_t>(i), 7};
    hashes.push_back(BlockHash::from_bytes(b));
  }
  s.update_request("r", 1024, hashes);
  std::atomic<bool> detected{false}, stop{false};
  auto hammer = [&] {
    while (!stop) {
      try {
        (void)s.lookup("r", 0);  // a 64-key lookup: long enough to overlap
      } catch (const error& e) {
        if (std::string(e.what()).find("single-threaded") != std::string::npos) detected = true;
      }
    }
  };
  std::thread a(hammer), b(hammer);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!detected && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  stop = true;
  a.join();
  b.join();
  CHECK(detected);
}
#endif

TEST_CASE(
    "A TransferEngine fed by one thread and polled by another reports every job once, "
    "in order",
    "[threads][engine]") {
  using namespace kvtest;
  KvFixture fx({{512, 256, 256}}, {{{0, 256}}}, 1, 2048);  // a host block per job: no overlap
  HostBackendConfig bc;
  bc.threads = 2;
  TransferEngine engine(*fx.layout, fx.host, std::make_unique<HostBackend>(bc));
  constexpr int kJobs = 2000;
  std::vector<JobId> got;
  std::atomic<bool> producing{true};
  std::thread poller([&] {
    while (producing || static_cast<int>(got.size()) < kJobs) {
      for (const FinishedTransfer& f : engine.get_finished()) {
        CHECK(f.ok);
        got.push_back(f.job);
      }
      std::this_thread::yield();
    }
  });
  for (JobId j = 0; j < kJobs; ++j) {
    TransferJob job;
    job.id = j;
    job.kind = JobKind::store;
    const auto b = static_cast<GpuBlockId>(1 + j % 511);
    job.gpu = GpuSpec{{b}, {1}, {0}};
    job.keys = {Key{BlockHash::from_hex("ab"), 0}};
    job.host_block_ids = {static_cast<HostBlockId>(j)};
    engine.submit_store(job);
    if (j % 100 == 99) engine.wait(std::vector<JobId>{j - 50});  // a flush, meanwhile
  }
  producing = false;
  poller.join();
  REQUIRE(got.size() == static_cast<std::size_t>(kJobs));
  for (int j = 0; j < kJobs; ++j) CHECK(got[static_cast<std::size_t>(j)] == j);
}
