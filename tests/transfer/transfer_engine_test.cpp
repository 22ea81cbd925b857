// The worker side end to end on the CPU: TransferEngine + HostBackend over random layouts.

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "kvoffload/error.hpp"
#include "kvoffload/host_backend.hpp"
#include "kvoffload/transfer_engine.hpp"
#include "support/kv_fixture.hpp"

using namespace kvoffload;
using namespace kvtest;

namespace {

std::unique_ptr<Backend> host_backend(int threads = 2) {
  HostBackendConfig c;
  c.threads = threads;
  c.task_bytes = 16 << 10;
  return std::make_unique<HostBackend>(c);
}

std::vector<FinishedTransfer> finish(TransferEngine& engine, const std::vector<JobId>& jobs) {
  engine.wait(jobs);
  return engine.get_finished();
}

/// A random job over `fx`'s layout: per group a random size and start, distinct GPU ids from
/// `gpu_pool` and distinct host ids.
TransferJob random_job(std::mt19937_64& rng, const KvFixture& fx, JobId id,
                       std::vector<GpuBlockId>& gpu_pool, std::vector<HostBlockId>& host_pool) {
  const std::int64_t f = fx.layout->block_size_factor();
  TransferJob job;
  job.id = id;
  for (std::size_t g = 0; g < fx.layout->num_groups(); ++g) {
    const std::int64_t size = std::uniform_int_distribution<std::int64_t>(0, 2 * f + 1)(rng);
    const std::int64_t index =
        size == 0 ? 0 : std::uniform_int_distribution<std::int64_t>(0, 3 * f)(rng);
    const std::int64_t hosts = (size + index % f + f - 1) / f;
    job.gpu.group_sizes.push_back(size);
    job.gpu.block_indices.push_back(index);
    for (std::int64_t p = 0; p < size; ++p) {
      job.gpu.block_ids.push_back(gpu_pool.back());
      gpu_pool.pop_back();
    }
    for (std::int64_t h = 0; h < hosts; ++h) {
      job.keys.push_back(Key{BlockHash::from_hex("cd"), static_cast<std::uint32_t>(g)});
      job.host_block_ids.push_back(host_pool.back());
      host_pool.pop_back();
    }
  }
  return job;
}

/// A backend whose `fail_at`-th submit (from 1) throws before queueing anything.
class ThrowingBackend final : public Backend {
 public:
  ThrowingBackend(std::unique_ptr<Backend> inner, int fail_at)
      : inner_(std::move(inner)), fail_at_(fail_at) {}
  Ticket submit(CopyPlan plan) override {
    if (++submits_ == fail_at_) throw std::runtime_error("submit refused");
    return inner_->submit(std::move(plan));
  }
  void poll(std::vector<BackendResult>& finished) override { inner_->poll(finished); }
  void wait(Ticket ticket) override { inner_->wait(ticket); }
  void shutdown(bool drain) override { inner_->shutdown(drain); }

 private:
  std::unique_ptr<Backend> inner_;
  int fail_at_;
  int submits_ = 0;
};

}  // namespace

TEST_CASE(
    "Round trip: random layouts and jobs, store then load restores exact bytes and "
    "touches nothing else",
    "[engine][property]") {
  const std::uint64_t seed = std::getenv("KVOFFLOAD_TEST_SEED") != nullptr
                                 ? std::strtoull(std::getenv("KVOFFLOAD_TEST_SEED"), nullptr, 10)
                                 : std::random_device{}();
  std::cout << "round-trip test seed: " << seed << "\n";
  std::mt19937_64 rng(seed);
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  for (int iteration = 0; iteration < 60; ++iteration) {
    INFO("seed " << seed << " iteration " << iteration);
    // Tensors: 1-4, pages of 16..512 bytes, sometimes padded; groups share tensors at random.
    std::vector<TensorSpec> tensors;
    const auto T = static_cast<std::size_t>(pick(1, 4));
    for (std::size_t t = 0; t < T; ++t) {
      const std::int64_t page = 16 * pick(1, 32);
      tensors.push_back({256, page, page + (pick(0, 1) == 1 ? 16 * pick(1, 4) : 0)});
    }
    std::vector<std::vector<GroupTensor>> groups(static_cast<std::size_t>(pick(1, 3)));
    for (auto& g : groups) {
      std::set<std::int32_t> used;
      const auto n = static_cast<std::size_t>(pick(1, static_cast<std::int64_t>(T)));
      while (used.size() < n)
        used.insert(static_cast<std::int32_t>(pick(0, static_cast<std::int64_t>(T) - 1)));
      for (const std::int32_t t : used) {
        const std::int64_t page = tensors[static_cast<std::size_t>(t)].page_bytes;
        g.push_back({t, pick(0, 1) == 1 ? page : 16 * pick(1, page / 16)});
      }
    }
    const std::int64_t f = pick(1, 8);
    KvFixture fx(tensors, groups, f, 64);
    std::vector<GpuBlockId> gpu_pool;
    for (GpuBlockId id = 1; id < 256; ++id) gpu_pool.push_back(id);
    std::shuffle(gpu_pool.begin(), gpu_pool.end(), rng);
    std::vector<HostBlockId> host_pool;
    for (HostBlockId id = 0; id < 64; ++id) host_pool.push_back(id);
    std::shuffle(host_pool.begin(), host_pool.end(), rng);

    TransferJob store = random_job(rng, fx, 1, gpu_pool, host_pool);
    // Sources get patterns; everything else keeps its guard.
    std::size_t at = 0;
    for (std::size_t g = 0; g < fx.layout->num_groups(); ++g) {
      for (std::int64_t p = 0; p < store.gpu.group_sizes[g]; ++p, ++at) {
        for (const GroupTensor& gt : fx.layout->group(g)) {
          fx.write_page(static_cast<std::size_t>(gt.tensor), store.gpu.block_ids[at], gt.page_bytes,
                        static_cast<std::uint64_t>(gt.tensor) * 100000 +
                            static_cast<std::uint64_t>(at) * 100 + g);
        }
      }
    }
    // The load: same host blocks and group shapes, fresh GPU blocks.
    TransferJob load = store;
    load.id = 2;
    load.kind = JobKind::load;
    for (auto& id : load.gpu.block_ids) {
      id = gpu_pool.back();
      gpu_pool.pop_back();
    }
    const std::vector<std::vector<std::uint8_t>> gpu_before = fx.gpu;
    const std::vector<std::uint8_t> host_before = fx.host_memory;

    TransferEngine engine(*fx.layout, fx.host, host_backend(static_cast<int>(pick(1, 3))));
    engine.submit_store(store);
    auto done = finish(engine, {1});
    REQUIRE(done.size() == 1);
    REQUIRE(done[0].ok);
    // The store wrote exactly its host slots: count the changed host bytes.
    std::size_t host_changed = 0;
    for (std::size_t i = 0; i < host_before.size(); ++i)
      host_changed += host_before[i] != fx.host_memory[i];
    std::uint64_t expect_bytes = 0;
    for (std::size_t g = 0; g < fx.layout->num_groups(); ++g) {
      for (const GroupTensor& gt : fx.layout->group(g)) {
        expect_bytes += static_cast<std::uint64_t>(gt.page_bytes * store.gpu.group_sizes[g]);
      }
    }
    CHECK(done[0].bytes == expect_bytes);
    CHECK(host_changed <= expect_bytes);
    CHECK(fx.gpu == gpu_before);  // a store never writes GPU memory

    engine.submit_load(load);
    done = finish(engine, {2});
    REQUIRE(done.size() == 1);
    REQUIRE(done[0].ok);
    // Destination pages equal their sources; every other GPU byte is as before.
    std::vector<std::vector<std::uint8_t>> expected = gpu_before;
    at = 0;
    for (std::size_t g = 0; g < fx.layout->num_groups(); ++g) {
      for (std::int64_t p = 0; p < store.gpu.group_sizes[g]; ++p, ++at) {
        for (const GroupTensor& gt : fx.layout->group(g)) {
          const auto t = static_cast<std::size_t>(gt.tensor);
          const auto stride = fx.layout->tensors()[t].block_stride_bytes;
          std::memcpy(expected[t].data() + load.gpu.block_ids[at] * stride,
                      gpu_before[t].data() + store.gpu.block_ids[at] * stride,
                      static_cast<std::size_t>(gt.page_bytes));
        }
      }
    }
    CHECK(fx.gpu == expected);
  }
}

TEST_CASE("Deferred stores start at the next step, or when flushed", "[engine]") {
  KvFixture fx({{16, 64, 64}}, {{{0, 64}}}, 1, 8);
  TransferEngineConfig c;
  c.defer_stores = true;
  TransferEngine engine(*fx.layout, fx.host, host_backend(), c);
  TransferJob job;
  job.id = 5;
  job.keys = {Key{BlockHash::from_hex("01"), 0}};
  job.host_block_ids = {2};
  job.gpu = {{3}, {1}, {0}};
  fx.write_page(0, 3, 64, 42);
  engine.submit_store(job);
  CHECK(engine.get_finished().empty());  // not started
  engine.start_step();
  auto done = finish(engine, {5});
  REQUIRE(done.size() == 1);
  CHECK(done[0].kind == JobKind::store);
  CHECK(done[0].bytes == 64);

  job.id = 6;
  engine.submit_store(job);
  done = finish(engine, {6});  // the flush starts it
  REQUIRE(done.size() == 1);
  CHECK(done[0].job == 6);
  CHECK(engine.stats().store_jobs == 2);
  CHECK(engine.stats().bytes_stored == 128);
}

TEST_CASE("A deferred store whose start throws is reported failed, the others start once",
          "[engine]") {
  KvFixture fx({{16, 64, 64}}, {{{0, 64}}}, 1, 8);
  TransferEngineConfig c;
  c.defer_stores = true;
  TransferEngine engine(*fx.layout, fx.host, std::make_unique<ThrowingBackend>(host_backend(), 2),
                        c);
  for (JobId id = 1; id <= 3; ++id) {
    TransferJob job;
    job.id = id;
    job.keys = {Key{BlockHash::from_hex("01"), 0}};
    job.host_block_ids = {static_cast<HostBlockId>(id)};
    job.gpu = {{static_cast<GpuBlockId>(id)}, {1}, {0}};
    engine.submit_store(job);
  }
  CHECK_NOTHROW(engine.start_step());  // job 2's start throws inside
  engine.start_step();                 // nothing is started twice
  const std::vector<JobId> ids{1, 2, 3};
  engine.wait(ids);
  std::map<JobId, FinishedTransfer> seen;
  for (auto& f : engine.get_finished()) CHECK(seen.emplace(f.job, f).second);  // once each
  CHECK(engine.get_finished().empty());
  REQUIRE(seen.size() == 3);
  CHECK(seen[1].ok);
  CHECK_FALSE(seen[2].ok);
  CHECK_THAT(seen[2].error, Catch::Matchers::ContainsSubstring("job 2: its store could not start"));
  CHECK(seen[3].ok);
  CHECK(engine.stats().failed_jobs == 1);
}

TEST_CASE("The engine refuses bad jobs before copying anything", "[engine]") {
  KvFixture fx({{16, 64, 64}}, {{{0, 64}}}, 2, 8);
  for (const bool defer : {false, true}) {
    TransferEngineConfig c;
    c.defer_stores = defer;
    TransferEngine engine(*fx.layout, fx.host, host_backend(), c);
    TransferJob job;
    job.id = 9;
    job.keys = {Key{BlockHash::from_hex("01"), 0}};
    job.host_block_ids = {1};
    job.gpu = {{3, 4, 5}, {3}, {0}};  // 3 GPU blocks need 2 host blocks at f = 2
    const auto before = fx.host_memory;
    CHECK_THROWS_WITH(engine.submit_store(job),
                      Catch::Matchers::ContainsSubstring("job 9 group 0"));
    engine.start_step();
    CHECK(finish(engine, {9}).empty());
    CHECK(fx.host_memory == before);
    job.gpu = {{3, 4}, {2}, {0}};
    // A store job given to submit_load is refused by name, before anything is planned.
    CHECK_THROWS_WITH(engine.submit_load(job), Catch::Matchers::ContainsSubstring(
                                                   "job 9 is a store job, given to submit_load"));
    job.kind = JobKind::load;
    CHECK_THROWS_WITH(engine.submit_store(job), Catch::Matchers::ContainsSubstring(
                                                    "job 9 is a load job, given to submit_store"));
    engine.submit_load(job);
    CHECK_THROWS_WITH(engine.submit_load(job), Catch::Matchers::ContainsSubstring("already"));
  }
}
