// Issue 30: loads ahead of stores, and back-pressure when stores cannot keep up: the copy task
// queue's order, the transfer engine's bound on store bytes held, and the scheduler skipping
// stores while its workers report pressure.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "kvoffload/backend.hpp"
#include "kvoffload/host_backend.hpp"
#include "kvoffload/transfer_engine.hpp"
#include "support/kv_fixture.hpp"
#include "support/scheduler_fixture.hpp"
#include "transfer/copy_task_queue.hpp"

using namespace kvoffload;
using namespace kvtest;

namespace {

/// A one-page store (or load) of GPU block `gpu` to (from) host block `host`.
TransferJob page_job(JobId id, JobKind kind, GpuBlockId gpu, HostBlockId host) {
  TransferJob job;
  job.id = id;
  job.kind = kind;
  job.keys = {Key{BlockHash::from_hex("0b"), 0}};
  job.host_block_ids = {host};
  job.gpu = {{gpu}, {1}, {0}};
  return job;
}

/// A backend that holds every plan until release() (or a wait), then runs them: what is copying
/// is whatever the test has not released. Single-threaded, like the tests that use it.
class HeldBackend final : public Backend {
 public:
  Ticket submit(CopyPlan plan) override {
    plans_.emplace_back(next_, std::move(plan));
    return next_++;
  }
  void poll(std::vector<BackendResult>& finished) override {
    if (!released_) return;
    for (auto& [ticket, plan] : plans_) {
      KvFixture::apply(plan);
      finished.push_back({ticket, plan.job, plan.kind, true, {}, plan.total_bytes, 0});
    }
    plans_.clear();
  }
  void wait(Ticket /*ticket*/) override { released_ = true; }
  void shutdown(bool /*drain*/) override { plans_.clear(); }
  void release() { released_ = true; }
  void hold() { released_ = false; }
  [[nodiscard]] std::size_t held() const { return plans_.size(); }

 private:
  std::vector<std::pair<Ticket, CopyPlan>> plans_;
  Ticket next_ = 1;
  bool released_ = false;
};

}  // namespace

TEST_CASE("The copy task queue hands out every load before any store, each in order",
          "[engine][pressure]") {
  detail::CopyTaskQueue<int> q;
  q.push(JobKind::store, 1);
  q.push(JobKind::store, 2);
  q.push(JobKind::load, 10);
  q.push(JobKind::store, 3);
  q.push(JobKind::load, 11);
  std::vector<int> order;
  while (auto t = q.pop()) order.push_back(*t);
  CHECK(order == std::vector<int>{10, 11, 1, 2, 3});
  CHECK(q.empty());
  q.push(JobKind::store, 4);
  q.push(JobKind::load, 12);
  order.clear();
  q.drain([&](int t) { order.push_back(t); });
  CHECK(order == std::vector<int>{12, 4});
  CHECK(q.empty());
}

TEST_CASE("Stores past max_store_bytes_in_flight are shed, never copied; loads always run",
          "[engine][pressure]") {
  KvFixture fx({{16, 64, 64}}, {{{0, 64}}}, 1, 8);
  TransferEngineConfig c;
  c.max_store_bytes_in_flight = 3 * 64;
  auto held = std::make_unique<HeldBackend>();
  HeldBackend& backend = *held;
  TransferEngine engine(*fx.layout, fx.host, std::move(held), c);
  for (GpuBlockId b = 1; b <= 9; ++b) fx.write_page(0, b, 64, 100 + b);
  std::fill(fx.host_memory.begin(), fx.host_memory.end(), 0x5a);  // before any store
  const std::int64_t block = fx.layout->pool_block_bytes();       // a host block's stride
  const auto host_page = [&](HostBlockId h) {
    return std::vector<std::uint8_t>(fx.host_memory.begin() + h * block,
                                     fx.host_memory.begin() + h * block + 64);
  };
  const auto written = [&](HostBlockId h, std::uint64_t seed) {
    const std::vector<std::uint8_t> got = host_page(h);
    for (std::int64_t i = 0; i < 64; ++i) {
      if (got[static_cast<std::size_t>(i)] != pattern(seed, i)) return false;
    }
    return true;
  };

  engine.submit_store(page_job(1, JobKind::store, 1, 1));
  CHECK_FALSE(engine.store_pressure());  // 64 of 192 copying
  engine.submit_store(page_job(2, JobKind::store, 2, 2));
  CHECK(engine.store_pressure());  // 128: half the bound reached
  engine.submit_store(page_job(3, JobKind::store, 3, 3));
  CHECK(engine.store_bytes_in_flight() == 192);
  engine.submit_store(page_job(4, JobKind::store, 4, 4));  // 256 > 192: shed
  CHECK(engine.store_bytes_in_flight() == 192);
  CHECK(backend.held() == 3);  // the shed store never reached the backend
  // A load is not bounded: the backend takes it although the stores are over the bound.
  engine.submit_load(page_job(9, JobKind::load, 9, 7));
  CHECK(backend.held() == 4);
  std::vector<FinishedTransfer> done = engine.get_finished();
  REQUIRE(done.size() == 1);  // the shed store, at once
  CHECK(done[0].job == 4);
  CHECK_FALSE(done[0].ok);
  CHECK_THAT(done[0].error, Catch::Matchers::ContainsSubstring("job 4: skipped: store "
                                                               "back-pressure"));
  CHECK(engine.stats().stores_shed == 1);

  backend.release();
  done = engine.get_finished();
  CHECK(done.size() == 4);
  CHECK(std::all_of(done.begin(), done.end(), [](const FinishedTransfer& f) { return f.ok; }));
  CHECK(engine.store_bytes_in_flight() == 0);
  CHECK_FALSE(engine.store_pressure());
  for (HostBlockId h = 1; h <= 3; ++h) CHECK(written(h, 100 + h));
  CHECK(host_page(4) == std::vector<std::uint8_t>(64, 0x5a));  // the shed store wrote nothing

  // Nothing copying: a store larger than the bound alone is taken (else it could never run).
  backend.hold();
  TransferJob big = page_job(5, JobKind::store, 5, 5);
  big.gpu = {{5, 6, 7, 8}, {4}, {0}};
  big.keys.resize(4, big.keys[0]);
  big.host_block_ids = {0, 5, 6, 7};
  engine.submit_store(big);
  CHECK(engine.store_bytes_in_flight() == 256);
  CHECK(backend.held() == 1);
  backend.release();
  done = engine.get_finished();
  REQUIRE(done.size() == 1);
  CHECK(done[0].ok);
}

TEST_CASE("Deferred stores count against the bound only once they start copying",
          "[engine][pressure]") {
  // An engine deferring a step's stores to the next step's start holds them between steps:
  // that is no backlog, so no pressure; at start_step each is judged as it starts.
  KvFixture fx({{16, 64, 64}}, {{{0, 64}}}, 1, 8);
  TransferEngineConfig c;
  c.defer_stores = true;
  c.max_store_bytes_in_flight = 3 * 64;
  auto held = std::make_unique<HeldBackend>();
  HeldBackend& backend = *held;
  TransferEngine engine(*fx.layout, fx.host, std::move(held), c);
  for (JobId id = 1; id <= 4; ++id) {
    engine.submit_store(
        page_job(id, JobKind::store, static_cast<GpuBlockId>(id), static_cast<HostBlockId>(id)));
  }
  CHECK(engine.store_bytes_in_flight() == 0);
  CHECK_FALSE(engine.store_pressure());
  engine.start_step();
  CHECK(engine.store_bytes_in_flight() == 192);
  CHECK(backend.held() == 3);
  std::vector<FinishedTransfer> done = engine.get_finished();
  REQUIRE(done.size() == 1);
  CHECK(done[0].job == 4);
  CHECK_FALSE(done[0].ok);
  backend.release();
  CHECK(engine.get_finished().size() == 3);
  CHECK_FALSE(engine.store_pressure());
}

TEST_CASE("Without a bound stores are never shed and pressure never turns on",
          "[engine][pressure]") {
  KvFixture fx({{16, 64, 64}}, {{{0, 64}}}, 1, 8);
  TransferEngineConfig c;
  c.defer_stores = true;
  TransferEngine engine(*fx.layout, fx.host, std::make_unique<HostBackend>(), c);
  for (JobId id = 1; id <= 6; ++id) {
    engine.submit_store(
        page_job(id, JobKind::store, static_cast<GpuBlockId>(id), static_cast<HostBlockId>(id)));
  }
  CHECK_FALSE(engine.store_pressure());
  engine.start_step();
  engine.wait(std::vector<JobId>{1, 2, 3, 4, 5, 6});
  const auto done = engine.get_finished();
  CHECK(done.size() == 6);
  CHECK(std::all_of(done.begin(), done.end(), [](const FinishedTransfer& f) { return f.ok; }));
  CHECK(engine.stats().stores_shed == 0);
}

TEST_CASE("Under store pressure a step stores nothing, counts the skipped blocks and moves on",
          "[scheduler][pressure]") {
  Harness h(make_config({full(16)}, 1, 16));
  const auto hashes = chain_hashes("pressure", 6);
  REQUIRE(h.lookup("a", hashes, 96) == 0);
  h.alloc_none("a");
  h.s.set_store_pressure(true);
  CHECK(h.s.store_pressure());
  // Blocks 0-3 computed under pressure: no job, four skips, nothing waits.
  StepResult step = h.step("a", 0, 64, {ids(1, 4)});
  CHECK(step.store_jobs.empty());
  CHECK(step.flush.empty());
  CHECK(h.s.cache_stats().pressure_skips == 4);
  // Pressure off: only the blocks computed from now on are stored (4 and 5).
  h.s.set_store_pressure(false);
  step = h.step("a", 64, 32, {ids(5, 2)});
  REQUIRE(step.store_jobs.size() == 1);
  CHECK(step.store_jobs[0].keys.size() == 2);
  CHECK(step.store_jobs[0].keys[0].hash == hashes[4]);
  CHECK(step.store_jobs[0].gpu.block_ids == ids(5, 2));
  h.complete(step.store_jobs[0].id);
  CHECK(h.s.cache_stats().pressure_skips == 4);
  // The skipped prefix is a miss for the next request: nothing was stored there.
  CHECK(h.lookup("b", hashes, 96) == 0);
}
