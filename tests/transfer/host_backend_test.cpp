#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "kvoffload/host_backend.hpp"

using namespace kvoffload;

namespace {

CopyPlan plan_of(JobId job, JobKind dir, std::vector<CopyDescriptor> d) {
  CopyPlan p;
  p.job = job;
  p.kind = dir;
  p.descriptors = std::move(d);
  for (const auto& x : p.descriptors) p.total_bytes += x.bytes;
  return p;
}

std::uintptr_t addr(std::vector<std::uint8_t>& v, std::size_t off = 0) {
  return reinterpret_cast<std::uintptr_t>(v.data() + off);
}

}  // namespace

TEST_CASE("HostBackend copies every byte, splitting large descriptors over threads",
          "[host_backend]") {
  HostBackendConfig c;
  c.threads = 3;
  c.task_bytes = 64 << 10;
  HostBackend backend(c);
  std::vector<std::uint8_t> src(3 << 20), dst(3 << 20, 0);
  std::iota(src.begin(), src.end(), std::uint8_t{7});
  // One 2 MiB descriptor (split into 32 tasks) and many 4 KiB ones.
  std::vector<CopyDescriptor> d{{addr(src), addr(dst), 2 << 20}};
  for (std::size_t off = 2 << 20; off < src.size(); off += 4096) {
    d.push_back({addr(src, off), addr(dst, off), 4096});
  }
  const Ticket t = backend.submit(plan_of(1, JobKind::store, d));
  backend.wait(t);
  std::vector<BackendResult> done;
  backend.poll(done);
  REQUIRE(done.size() == 1);
  CHECK(done[0].ok);
  CHECK(done[0].ticket == t);
  CHECK(done[0].bytes == src.size());
  CHECK(std::memcmp(src.data(), dst.data(), src.size()) == 0);
}

TEST_CASE("HostBackend reports each direction in submission order", "[host_backend]") {
  HostBackendConfig c;
  c.threads = 2;
  HostBackend backend(c);
  std::vector<std::uint8_t> a(1 << 22, 1);
  std::vector<std::vector<std::uint8_t>> b(20);  // a destination per job: no two jobs race
  std::vector<Ticket> stores, loads;
  for (JobId j = 0; j < 20; ++j) {
    const JobKind dir = j % 3 == 0 ? JobKind::load : JobKind::store;
    // Big and small jobs mixed, so later small ones often finish first.
    const std::uint64_t bytes = j % 2 == 0 ? (1 << 22) : 4096;
    auto& dst = b[static_cast<std::size_t>(j)];
    dst.resize(bytes);
    const Ticket t = backend.submit(plan_of(j, dir, {{addr(a), addr(dst), bytes}}));
    (dir == JobKind::load ? loads : stores).push_back(t);
  }
  for (const Ticket t : stores) backend.wait(t);
  for (const Ticket t : loads) backend.wait(t);
  std::vector<BackendResult> done;
  backend.poll(done);
  REQUIRE(done.size() == 20);
  std::vector<Ticket> got_stores, got_loads;
  for (const auto& r : done) {
    CHECK(r.ok);
    (r.kind == JobKind::load ? got_loads : got_stores).push_back(r.ticket);
  }
  CHECK(got_stores == stores);
  CHECK(got_loads == loads);
}

TEST_CASE("HostBackend fails plans with null or overlapping descriptors", "[host_backend]") {
  HostBackend backend;
  std::vector<std::uint8_t> a(4096);
  std::vector<BackendResult> done;
  backend.wait(backend.submit(plan_of(1, JobKind::load, {{0, addr(a), 16}})));
  backend.wait(backend.submit(plan_of(2, JobKind::load, {{addr(a), addr(a, 8), 16}})));
  backend.poll(done);
  REQUIRE(done.size() == 2);
  CHECK_FALSE(done[0].ok);
  CHECK_THAT(done[0].error, Catch::Matchers::ContainsSubstring("job 1"));
  CHECK_FALSE(done[1].ok);
  CHECK_THAT(done[1].error, Catch::Matchers::ContainsSubstring("overlapping"));
}

TEST_CASE("HostBackend shutdown drains or cancels; later submits fail", "[host_backend]") {
  std::vector<std::uint8_t> a(64 << 20, 3), b(64 << 20);
  SECTION("drain") {
    HostBackend backend;
    for (JobId j = 0; j < 4; ++j) {
      backend.submit(plan_of(j, JobKind::store, {{addr(a), addr(b), a.size()}}));
    }
    backend.shutdown(true);
    std::vector<BackendResult> done;
    backend.poll(done);
    REQUIRE(done.size() == 4);
    for (const auto& r : done) CHECK(r.ok);
  }
  SECTION("cancel") {
    HostBackendConfig c;
    c.threads = 1;
    HostBackend backend(c);
    for (JobId j = 0; j < 8; ++j) {
      backend.submit(plan_of(j, JobKind::store, {{addr(a), addr(b), a.size()}}));
    }
    backend.shutdown(false);
    std::vector<BackendResult> done;
    backend.poll(done);
    REQUIRE(done.size() == 8);
    CHECK_FALSE(done.back().ok);  // the last one cannot have run on one thread in time
    CHECK_THAT(done.back().error, Catch::Matchers::ContainsSubstring("cancelled"));
    const Ticket late = backend.submit(plan_of(9, JobKind::store, {{addr(a), addr(b), 16}}));
    backend.wait(late);
    done.clear();
    backend.poll(done);
    REQUIRE(done.size() == 1);
    CHECK_FALSE(done[0].ok);
  }
}

TEST_CASE("HostBackend runs a load submitted behind queued stores before them",
          "[host_backend][pressure]") {
  // One copy thread, eight 8 MiB stores queued, then a small load: loads first, the load is
  // done while most stores still wait; in submission order (loads_first = false, or a single
  // queue) it would finish after all eight.
  HostBackendConfig c;
  c.threads = 1;
  c.task_bytes = 8 << 20;
  HostBackend backend(c);
  constexpr std::size_t kStore = 8 << 20;
  std::vector<std::uint8_t> src(kStore, 1), dst(8 * kStore, 0), lsrc(4096, 3), ldst(4096, 0);
  for (JobId j = 1; j <= 8; ++j) {
    (void)backend.submit(
        plan_of(j, JobKind::store, {{addr(src), addr(dst, (j - 1) * kStore), kStore}}));
  }
  const Ticket load = backend.submit(plan_of(100, JobKind::load, {{addr(lsrc), addr(ldst), 4096}}));
  backend.wait(load);
  std::vector<BackendResult> done;
  backend.poll(done);
  const auto stores = std::count_if(
      done.begin(), done.end(), [](const BackendResult& r) { return r.kind == JobKind::store; });
  CHECK(std::any_of(done.begin(), done.end(), [](const BackendResult& r) { return r.job == 100; }));
  CHECK(stores < 8);
  CHECK(ldst == lsrc);
  backend.shutdown(/*drain=*/true);
}

TEST_CASE("HostBackend copies pieces of any size and alignment byte for byte", "[host_backend]") {
  // Pieces from 4 KiB take the streaming-store path: unaligned heads, odd tails, slices of a
  // large descriptor, and small pieces next to them; nothing outside a piece is touched.
  HostBackendConfig c;
  c.threads = 2;
  c.task_bytes = 64 << 10;
  HostBackend backend(c);
  std::vector<std::uint8_t> src(3 << 20), dst(3 << 20, 0xee);
  std::iota(src.begin(), src.end(), std::uint8_t{11});
  struct Piece {
    std::size_t src, dst, bytes;
  };
  const std::vector<Piece> pieces{{3, 5, 4096 + 37},         {9000, 20001, 4095},
                                  {16384, 40000, 4096},      {70001, 80003, 65536 + 15},
                                  {200000, 300007, 1 << 20}, {1500001, 1600000, 63},
                                  {2000000, 2100001, 150000}};
  std::vector<CopyDescriptor> d;
  for (const Piece& p : pieces) d.push_back({addr(src, p.src), addr(dst, p.dst), p.bytes});
  const Ticket t = backend.submit(plan_of(1, JobKind::store, d));
  backend.wait(t);
  std::vector<BackendResult> done;
  backend.poll(done);
  REQUIRE(done.size() == 1);
  CHECK(done[0].ok);
  std::vector<std::uint8_t> want(dst.size(), 0xee);
  for (const Piece& p : pieces) std::memcpy(want.data() + p.dst, src.data() + p.src, p.bytes);
  CHECK(dst == want);
}
