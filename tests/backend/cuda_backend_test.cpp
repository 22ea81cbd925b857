// The CUDA backend's tests. Each body takes a DeviceRuntime: the [sim] cases run it on the
// simulated device (every build, with random delays; the simulator also reports races, use of
// destroyed handles and faults), the [gpu] cases on a real GPU when one is visible.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "backend/device_rig.hpp"
#include "kvoffload/cuda_backend.hpp"
#include "kvoffload/device.hpp"
#include "kvoffload/error.hpp"
#include "kvoffload/testing/sim_device.hpp"
#include "kvoffload/transfer_engine.hpp"

using namespace kvoffload;
using Catch::Matchers::ContainsSubstring;
using kvtest::DeviceRig;

namespace {

std::shared_ptr<SimDevice> make_sim(std::uint64_t seed, int devices = 1, int delay_us = 30) {
  SimConfig c;
  c.seed = seed;
  c.devices = devices;
  c.max_delay_us = delay_us;
  return std::make_shared<SimDevice>(c);
}

void require_clean(const std::shared_ptr<DeviceRuntime>& rt) {
  if (auto* sim = dynamic_cast<SimDevice*>(rt.get())) {
    REQUIRE(sim->device_synchronize() == dev::ok);  // everything queued has run and been checked
    const auto v = sim->violations();
    for (const auto& line : v) UNSCOPED_INFO(line);
    REQUIRE(v.empty());
  }
}

/// Every mode, f 1/4/16: stores of random jobs land as the planner says; then loads of them
/// into fresh blocks run concurrently with a second round of stores, and both are checked.
void round_trip(const std::shared_ptr<DeviceRuntime>& rt, CopyMode mode, std::int64_t f,
                std::int64_t page) {
  const std::int64_t blocks = 108 * f + 2;  // 18 jobs of up to 6f GPU blocks
  const std::int64_t host_blocks = 96;      // 12 stores of up to 8 host blocks
  DeviceRig rig(rt, f, page, blocks, host_blocks);
  std::mt19937 rng(static_cast<unsigned>(f) * 31 + static_cast<unsigned>(mode));
  std::vector<GpuBlockId> gpu(static_cast<std::size_t>(blocks - 1));
  std::iota(gpu.begin(), gpu.end(), 1);
  std::shuffle(gpu.begin(), gpu.end(), rng);
  std::vector<HostBlockId> host(static_cast<std::size_t>(host_blocks));
  std::iota(host.begin(), host.end(), 0);
  std::shuffle(host.begin(), host.end(), rng);

  CudaBackendConfig c;
  c.mode = mode;
  c.store_small_piece_bytes = c.load_small_piece_bytes = 1 << 20;  // auto: the kernel modes
  c.staged_min_pieces = 4;
  c.host_base = rig.region.base;
  c.host_bytes = rig.pool_bytes;
  TransferEngine engine(*rig.layout, rig.region, std::make_unique<CudaBackend>(c, rt));
  std::vector<TransferJob> stores, loads, more;
  for (JobId j = 0; j < 6; ++j) stores.push_back(DeviceRig::random_job(3 * j, f, rng, gpu, host));
  for (const TransferJob& s : stores) {
    TransferJob l = s;
    l.id = s.id + 1;
    l.kind = JobKind::load;
    for (auto& id : l.gpu.block_ids) {
      id = gpu.back();
      gpu.pop_back();
    }
    loads.push_back(l);
  }
  for (JobId j = 0; j < 6; ++j) more.push_back(DeviceRig::random_job(3 * j + 2, f, rng, gpu, host));
  const auto before = rig.pool();
  std::vector<JobId> all;
  for (const TransferJob& s : stores) {
    engine.submit_store(s);
    all.push_back(s.id);
  }
  engine.wait(all);
  auto done = engine.get_finished();
  REQUIRE(done.size() == stores.size());
  for (const auto& d : done) CHECK(d.ok);
  CHECK(kvtest::same_bytes(rig.pool(), rig.expected_pool(stores, before)));
  // Loads of those blocks and new stores, in flight together on both stream sets.
  all.clear();
  for (std::size_t j = 0; j < loads.size(); ++j) {
    engine.submit_load(loads[j]);
    engine.submit_store(more[j]);
    all.push_back(loads[j].id);
    all.push_back(more[j].id);
  }
  engine.wait(all);
  done = engine.get_finished();
  REQUIRE(done.size() == loads.size() + more.size());
  for (const auto& d : done) CHECK(d.ok);
  std::vector<TransferJob> stored = stores;
  stored.insert(stored.end(), more.begin(), more.end());
  CHECK(kvtest::same_bytes(rig.pool(), rig.expected_pool(stored, before)));
  std::vector<std::vector<std::uint8_t>> now;
  for (std::size_t t = 0; t < 4; ++t) now.push_back(rig.read(t));
  const auto P = static_cast<std::size_t>(page);
  for (std::size_t j = 0; j < loads.size(); ++j) {
    std::size_t at = 0;
    for (std::size_t g = 0; g < 2; ++g) {
      for (std::int64_t p = 0; p < loads[j].gpu.group_sizes[g]; ++p, ++at) {
        for (std::size_t k = 0; k < 2; ++k) {
          const std::size_t t = 2 * g + k;
          const auto to = static_cast<std::size_t>(loads[j].gpu.block_ids[at]) * P;
          const auto from = static_cast<std::size_t>(stores[j].gpu.block_ids[at]) * P;
          INFO("load job " << loads[j].id << " group " << g << " block " << p << " tensor " << t);
          REQUIRE(std::memcmp(now[t].data() + to, rig.mirror[t].data() + from, P) == 0);
        }
      }
    }
  }
  require_clean(rt);
}

/// A plan the driver refuses at the call (a range past the end of a device allocation) fails
/// its job, and only its job.
void refused_copy_fails_its_job(const std::shared_ptr<DeviceRuntime>& rt, CopyMode mode) {
  CudaBackendConfig c;
  c.mode = mode;
  CudaBackend backend(c, rt);
  void* d = nullptr;
  void* h = nullptr;
  REQUIRE(rt->malloc_device(&d, 1 << 20) == dev::ok);
  REQUIRE(rt->malloc_host(&h, 1 << 20) == dev::ok);
  const auto dv = reinterpret_cast<std::uintptr_t>(d);
  const auto hv = reinterpret_cast<std::uintptr_t>(h);
  CopyPlan bad;
  bad.job = 1;
  bad.kind = JobKind::store;
  bad.descriptors = {{dv + (1 << 20) - 4096, hv, 8192}};  // 4 KiB past the end
  bad.total_bytes = 8192;
  CopyPlan good = bad;
  good.job = 2;
  good.descriptors = {{dv, hv, 4096}};
  good.total_bytes = 4096;
  backend.submit(bad);
  backend.wait(backend.submit(good));
  std::vector<BackendResult> done;
  backend.poll(done);
  REQUIRE(done.size() == 2);
  CHECK_FALSE(done[0].ok);
  CHECK_THAT(done[0].error, ContainsSubstring("job 1"));
  CHECK(done[1].ok);
  (void)rt->free_device(d);
  (void)rt->free_host(h);
  require_clean(rt);
}

struct TableCase {
  TransferJob job;
  std::vector<std::int32_t> table;
  std::vector<std::int64_t> offsets;
};

/// Group 0: four blocks from sub-block 0; group 1 (a window): its offloaded block's first two
/// sub-blocks are null, so two real ids starting at sub-block 2.
TableCase window_case() {
  TableCase t;
  t.job.id = 77;
  t.job.gpu = {{5, 6, 7, 8, 20, 21}, {4, 2}, {0, 2}};
  t.job.keys = {Key{BlockHash::from_hex("01"), 0}, Key{BlockHash::from_hex("02"), 1}};
  t.job.host_block_ids = {3, 9};
  t.table = {5, 6, 7, 8, 0, 0, 20, 21};
  t.offsets = {0, 4, 8};
  return t;
}

/// The device-table path: the good job copies what the planner would; a job whose group sizes
/// disagree with the table, and one with an id past the tensors, fail and copy nothing.
void device_table(const std::shared_ptr<DeviceRuntime>& rt) {
  const std::int64_t f = 4;
  DeviceRig rig(rt, f, 4096, 64, 16);
  CudaBackendConfig c;
  c.host_base = rig.region.base;
  c.host_bytes = rig.pool_bytes;
  CudaBackend backend(c, rt);
  REQUIRE(backend.kernel_available());
  const TableCase good = window_case();
  std::vector<std::int32_t> tables = good.table;
  tables.insert(tables.end(), {5, 6, 7, 8, 0, 0, 64, 21});  // 64: past the 64-block tensors
  void* d_table = nullptr;
  REQUIRE(rt->malloc_device(&d_table, tables.size() * 4) == dev::ok);
  {
    StreamHandle s = 0;
    REQUIRE(rt->stream_create(0, &s) == dev::ok);
    REQUIRE(rt->memcpy_async(d_table, tables.data(), tables.size() * 4, s) == dev::ok);
    REQUIRE(rt->stream_synchronize(s) == dev::ok);
    REQUIRE(rt->stream_destroy(s) == dev::ok);
  }
  const auto* table = static_cast<const std::int32_t*>(d_table);
  const auto before = rig.pool();
  const Ticket t1 = backend.submit_device_table(good.job, JobKind::store, *rig.layout, rig.region,
                                                table, good.offsets);
  // Group sizes that disagree with the table (it has 4 and 2 real ids), other host blocks.
  TransferJob wrong = good.job;
  wrong.id = 78;
  wrong.gpu.group_sizes = {4, 3};
  wrong.gpu.block_indices = {0, 1};
  wrong.host_block_ids = {4, 10};
  backend.submit_device_table(wrong, JobKind::store, *rig.layout, rig.region, table, good.offsets);
  // Right counts, but id 64 is past the tensors' 64 blocks.
  TransferJob far = good.job;
  far.id = 79;
  far.host_block_ids = {5, 11};
  const Ticket t3 = backend.submit_device_table(far, JobKind::store, *rig.layout, rig.region,
                                                table + 8, good.offsets);
  backend.wait(t1);
  backend.wait(t3);
  std::vector<BackendResult> done;
  for (int i = 0; i < 2000 && done.size() < 3; ++i) {
    backend.poll(done);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(done.size() == 3);
  CHECK(done[0].ok);
  CHECK_FALSE(done[1].ok);
  CHECK_THAT(done[1].error, ContainsSubstring("job 78"));
  CHECK_FALSE(done[2].ok);
  CHECK_THAT(done[2].error, ContainsSubstring("job 79"));
  // The pool: the good job's blocks as the planner says, nothing else touched.
  CHECK(kvtest::same_bytes(rig.pool(), rig.expected_pool({good.job}, before)));
  // A load of the good job's blocks into the blocks the table names, on the device.
  (void)rt->free_device(d_table);
  require_clean(rt);
}

void compaction_matches_reference(const std::shared_ptr<DeviceRuntime>& rt) {
  std::mt19937 rng(3);
  DeviceCompactor compactor(1 << 16, 4, rt);
  StreamHandle s = 0;
  REQUIRE(rt->stream_create(0, &s) == dev::ok);
  for (const std::int64_t n : {1, 1000, 1 << 16}) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
    for (auto& id : ids) id = rng() % 3 == 0 ? 0 : static_cast<std::int32_t>(1 + rng() % 1000);
    const std::vector<std::int64_t> offsets{0, n / 3, n / 2, n};
    std::vector<std::int64_t> expected(3, 0);
    std::vector<std::int32_t> want;
    for (std::size_t g = 0; g < 3; ++g) {
      for (std::int64_t i = offsets[g]; i < offsets[g + 1]; ++i) {
        if (ids[static_cast<std::size_t>(i)] != 0) {
          ++expected[g];
          want.push_back(ids[static_cast<std::size_t>(i)]);
        }
      }
    }
    void* buf = nullptr;
    const std::size_t N = ids.size();
    REQUIRE(rt->malloc_device(&buf, 8 * N + 256) == dev::ok);
    auto* d_ids = static_cast<std::int32_t*>(buf);
    auto* d_out = d_ids + N;
    auto* d_small =
        reinterpret_cast<std::int64_t*>(static_cast<char*>(buf) + (8 * N + 15) / 16 * 16);
    std::int64_t* d_offsets = d_small;
    std::int64_t* d_expected = d_small + 4;
    std::int64_t* d_count = d_small + 7;
    std::int64_t* d_groups = d_small + 8;
    auto* d_mismatch = reinterpret_cast<int*>(d_small + 11);
    REQUIRE(rt->memcpy_async(d_ids, ids.data(), N * 4, s) == dev::ok);
    REQUIRE(rt->memcpy_async(d_offsets, offsets.data(), 32, s) == dev::ok);
    REQUIRE(rt->memcpy_async(d_expected, expected.data(), 24, s) == dev::ok);
    compactor.compact(d_ids, n, d_offsets, 3, d_expected, d_out, d_count, d_groups, d_mismatch, s);
    std::int64_t count = 0;
    int mismatch = -1;
    REQUIRE(rt->memcpy_async(&count, d_count, 8, s) == dev::ok);
    REQUIRE(rt->memcpy_async(&mismatch, d_mismatch, 4, s) == dev::ok);
    REQUIRE(rt->stream_synchronize(s) == dev::ok);
    std::vector<std::int32_t> got(static_cast<std::size_t>(count));
    REQUIRE(rt->memcpy_async(got.data(), d_out, got.size() * 4, s) == dev::ok);
    REQUIRE(rt->stream_synchronize(s) == dev::ok);
    CHECK(got == want);
    CHECK(mismatch == 0);
    ++expected[1];  // a wrong expectation is caught on the device
    REQUIRE(rt->memcpy_async(d_expected, expected.data(), 24, s) == dev::ok);
    compactor.compact(d_ids, n, d_offsets, 3, d_expected, d_out, d_count, d_groups, d_mismatch, s);
    REQUIRE(rt->memcpy_async(&mismatch, d_mismatch, 4, s) == dev::ok);
    REQUIRE(rt->stream_synchronize(s) == dev::ok);
    CHECK(mismatch == 1);
    (void)rt->free_device(buf);
  }
  REQUIRE(rt->stream_destroy(s) == dev::ok);
  require_clean(rt);
}

/// Two compactions in flight at once on two streams, one compactor: each call's CUB state in
/// the shared temporary storage must not be overwritten by the other's. A good table must
/// still compact exactly (mismatch 0) and a bad one must still be caught (mismatch 1).
void compaction_on_two_streams(const std::shared_ptr<DeviceRuntime>& rt) {
  const std::int64_t n = 1 << 16;
  DeviceCompactor compactor(n, 1, rt);
  struct Side {
    StreamHandle stream = 0;
    void* buf = nullptr;
    std::vector<std::int32_t> ids, want;
    std::int64_t expected = 0;
  };
  std::mt19937 rng(5);
  Side sides[2];
  const std::size_t N = static_cast<std::size_t>(n);
  for (int k = 0; k < 2; ++k) {
    Side& side = sides[k];
    REQUIRE(rt->stream_create(0, &side.stream) == dev::ok);
    side.ids.resize(N);
    for (auto& id : side.ids) id = rng() % 4 == 0 ? 0 : static_cast<std::int32_t>(1 + rng() % 999);
    for (const std::int32_t id : side.ids) {
      if (id != 0) side.want.push_back(id);
    }
    // Side 1 expects one id too many: the device must say mismatch.
    side.expected = static_cast<std::int64_t>(side.want.size()) + k;
    REQUIRE(rt->malloc_device(&side.buf, 8 * N + 256) == dev::ok);
    auto* small = reinterpret_cast<std::int64_t*>(static_cast<char*>(side.buf) + 8 * N);
    const std::int64_t head[3] = {0, n, side.expected};  // offsets, then expected
    REQUIRE(rt->memcpy_async(side.buf, side.ids.data(), 4 * N, side.stream) == dev::ok);
    REQUIRE(rt->memcpy_async(small, head, sizeof head, side.stream) == dev::ok);
    REQUIRE(rt->stream_synchronize(side.stream) == dev::ok);
  }
  for (int round = 0; round < 8; ++round) {
    for (Side& side : sides) {  // no host synchronization between the two
      auto* ids = static_cast<std::int32_t*>(side.buf);
      auto* small = reinterpret_cast<std::int64_t*>(static_cast<char*>(side.buf) + 8 * N);
      compactor.compact(ids, n, small, 1, small + 2, ids + N, small + 3, small + 4,
                        reinterpret_cast<int*>(small + 5), side.stream);
    }
    for (int k = 0; k < 2; ++k) {
      Side& side = sides[k];
      auto* ids = static_cast<std::int32_t*>(side.buf);
      auto* small = reinterpret_cast<std::int64_t*>(static_cast<char*>(side.buf) + 8 * N);
      std::int64_t count = 0;
      int mismatch = -1;
      std::vector<std::int32_t> got(N);
      REQUIRE(rt->memcpy_async(&count, small + 3, 8, side.stream) == dev::ok);
      REQUIRE(rt->memcpy_async(&mismatch, small + 5, 4, side.stream) == dev::ok);
      REQUIRE(rt->memcpy_async(got.data(), ids + N, 4 * N, side.stream) == dev::ok);
      REQUIRE(rt->stream_synchronize(side.stream) == dev::ok);
      INFO("round " << round << " stream " << k);
      CHECK(mismatch == k);
      REQUIRE(count == static_cast<std::int64_t>(side.want.size()));
      got.resize(static_cast<std::size_t>(count));
      CHECK(got == side.want);
    }
  }
  for (Side& side : sides) {
    REQUIRE(rt->free_device(side.buf) == dev::ok);
    REQUIRE(rt->stream_destroy(side.stream) == dev::ok);
  }
  require_clean(rt);
}

/// A backend on the last device, driven from a thread that never chose a device (a C API
/// caller's, a multi-GPU engine's): it must leave no primary context on device 0 (on a GPU,
/// hundreds of MiB of device 0's memory per process, seen in nvidia-smi --query-compute-apps).
void no_context_on_device_0(const std::shared_ptr<DeviceRuntime>& rt, CopyMode mode) {
  const int last = rt->device_count() - 1;
  REQUIRE(last >= 1);
  REQUIRE(rt->set_device(last) == dev::ok);  // this thread: the last device only
  bool before = true;
  REQUIRE(rt->primary_context_active(0, &before) == dev::ok);
  // On a GPU only a process that has not touched device 0 yet can tell (the bundle runs each
  // [gpu] case in its own process); a fresh simulated device always can.
  if (dynamic_cast<SimDevice*>(rt.get()) != nullptr) REQUIRE_FALSE(before);
  if (before) SKIP("device 0 already has a context in this process");
  DeviceRig rig(rt, 1, 4096, 16, 16);
  bool ok = false;
  std::string error;
  std::thread fresh([&] {
    try {
      CudaBackendConfig c;
      c.device = last;
      c.mode = mode;
      c.host_base = rig.region.base;
      c.host_bytes = rig.pool_bytes;
      CudaBackend backend(c, rt);
      backend.set_compute_stream(0);
      CopyPlan plan;
      plan.job = 1;
      plan.kind = JobKind::store;
      plan.descriptors = {{reinterpret_cast<std::uintptr_t>(rig.device[0]), rig.region.base, 4096}};
      plan.total_bytes = 4096;
      backend.wait(backend.submit(plan));
      std::vector<BackendResult> done;
      backend.poll(done);
      ok = done.size() == 1 && done[0].ok;
      backend.shutdown(true);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  fresh.join();
  CHECK(error.empty());
  CHECK(ok);
  bool after = true;
  REQUIRE(rt->primary_context_active(0, &after) == dev::ok);
  CHECK_FALSE(after);
  bool mine = false;
  REQUIRE(rt->primary_context_active(last, &mine) == dev::ok);
  CHECK(mine);
  require_clean(rt);
}

const char* mode_name(CopyMode m) {
  return to_string(m).data();
}

}  // namespace

// ---- on the simulated device (every build) --------------------------------------------------

TEST_CASE("sim: every copy mode round-trips random jobs byte-exactly", "[sim][cuda_backend]") {
  const CopyMode mode = GENERATE(CopyMode::automatic, CopyMode::batch, CopyMode::memcpy,
                                 CopyMode::kernel, CopyMode::staged);
  const std::int64_t f = GENERATE(1, 4, 16);
  INFO("mode " << mode_name(mode) << " f " << f);
  round_trip(make_sim(static_cast<std::uint64_t>(f) * 7 + static_cast<std::uint64_t>(mode)), mode,
             f, 256);
}

TEST_CASE("sim: a copy refused at the call fails its job and nothing else", "[sim][cuda_backend]") {
  const CopyMode mode = GENERATE(CopyMode::batch, CopyMode::memcpy);
  refused_copy_fails_its_job(make_sim(5), mode);
}

TEST_CASE("sim: the device-table path copies like the planner and never copies a failed check",
          "[sim][cuda_backend][compaction]") {
  device_table(make_sim(6));
}

TEST_CASE("sim: the compaction equals the host filter", "[sim][compaction]") {
  compaction_matches_reference(make_sim(7, 1, 5));
}

TEST_CASE("sim: a backend on device 1 used from a thread with no context creates none on 0",
          "[sim][cuda_backend][devices]") {
  const CopyMode mode = GENERATE(CopyMode::kernel, CopyMode::batch);
  no_context_on_device_0(make_sim(9, 2, 10), mode);
}

TEST_CASE("sim: one compactor on two streams at once keeps each call's results",
          "[sim][compaction]") {
  compaction_on_two_streams(make_sim(8, 1, 5));
}

// ---- on a real GPU ([gpu]: skipped without one) -----------------------------------------------

TEST_CASE("gpu: every copy mode round-trips random jobs byte-exactly", "[gpu][cuda_backend]") {
  if (!CudaBackend::available()) SKIP("no CUDA device");
  const CopyMode mode = GENERATE(CopyMode::automatic, CopyMode::batch, CopyMode::memcpy,
                                 CopyMode::kernel, CopyMode::staged);
  const std::int64_t f = GENERATE(1, 4, 16);
  INFO("mode " << mode_name(mode) << " f " << f);
  round_trip(cuda_runtime(), mode, f, 4096);
}

TEST_CASE("gpu: a copy refused at the call fails its job and nothing else", "[gpu][cuda_backend]") {
  if (!CudaBackend::available()) SKIP("no CUDA device");
  refused_copy_fails_its_job(cuda_runtime(), CopyMode::memcpy);
}

// Whether cuMemcpyBatchAsync checks ranges at the call (as the simulator assumes) is only
// known on a GPU: if it does not, this job faults later instead of failing alone.
TEST_CASE("gpu: an out-of-range batch copy is refused at the call", "[gpu][cuda_backend]") {
  if (!CudaBackend::available()) SKIP("no CUDA device");
  if (!cuda_runtime()->batch_available()) SKIP("no cuMemcpyBatchAsync in this driver");
  refused_copy_fails_its_job(cuda_runtime(), CopyMode::batch);
}

TEST_CASE("gpu: the device-table path copies like the planner and never copies a failed check",
          "[gpu][cuda_backend][compaction]") {
  if (!CudaBackend::available()) SKIP("no CUDA device");
  device_table(cuda_runtime());
}

TEST_CASE("gpu: the compaction equals the host filter", "[gpu][compaction]") {
  if (!CudaBackend::available()) SKIP("no CUDA device");
  compaction_matches_reference(cuda_runtime());
}

TEST_CASE("gpu: a backend on the last device used from a fresh thread makes no context on 0",
          "[gpu][cuda_backend][devices]") {
  if (!CudaBackend::available()) SKIP("no CUDA device");
  if (cuda_device_count() < 2) SKIP("one GPU: the context cost on device 0 needs two");
  no_context_on_device_0(cuda_runtime(), CopyMode::automatic);
}

TEST_CASE("gpu: one compactor on two streams at once keeps each call's results",
          "[gpu][compaction]") {
  if (!CudaBackend::available()) SKIP("no CUDA device");
  compaction_on_two_streams(cuda_runtime());
}
