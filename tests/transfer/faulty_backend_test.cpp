// FaultyBackend itself: it must fail, delay and reorder exactly as configured, so the fault
// injection run tests what it claims to.

#include <algorithm>
#include <cstring>
#include <vector>

#include <catch2/catch_test_macros.hpp>

#include "kvoffload/error.hpp"
#include "kvoffload/host_backend.hpp"
#include "kvoffload/testing/faulty_backend.hpp"

using namespace kvoffload;

namespace {

CopyPlan plan_of(JobId job, JobKind d, std::uint8_t* src, std::uint8_t* dst, int pieces) {
  CopyPlan p;
  p.job = job;
  p.kind = d;
  for (int i = 0; i < pieces; ++i) {
    p.descriptors.push_back({reinterpret_cast<std::uintptr_t>(src + 64 * i),
                             reinterpret_cast<std::uintptr_t>(dst + 64 * i), 64});
    p.total_bytes += 64;
  }
  return p;
}

std::vector<BackendResult> drain(FaultyBackend& b, int polls = 64) {
  std::vector<BackendResult> out;
  for (int i = 0; i < polls; ++i) b.poll(out);
  return out;
}

}  // namespace

TEST_CASE("FaultyBackend fails plans halfway and says so", "[faults]") {
  FaultConfig c;
  c.fail = 1.0;
  FaultyBackend b(std::make_unique<HostBackend>(), c);
  std::vector<std::uint8_t> src(256, 7), dst(256, 0);
  const Ticket t = b.submit(plan_of(3, JobKind::store, src.data(), dst.data(), 4));
  b.wait(t);
  const auto r = drain(b);
  REQUIRE(r.size() == 1);
  CHECK_FALSE(r[0].ok);
  CHECK(r[0].job == 3);
  CHECK(r[0].bytes == 0);
  CHECK(r[0].error.find("injected") != std::string::npos);
  // The first half was copied, the rest not: partial data a failed job must never serve.
  CHECK(std::all_of(dst.begin(), dst.begin() + 128, [](std::uint8_t v) { return v == 7; }));
  CHECK(std::all_of(dst.begin() + 128, dst.end(), [](std::uint8_t v) { return v == 0; }));
  CHECK(b.counts().failed == 1);
}

TEST_CASE("FaultyBackend delays results but keeps each direction in order unless reordering",
          "[faults]") {
  std::vector<std::uint8_t> src(64 * 40, 1), dst(64 * 40, 0);
  for (const bool reorder : {false, true}) {
    FaultConfig c;
    c.seed = 5;
    c.delay = 0.5;
    c.max_delay_polls = 4;
    c.reorder = reorder;
    FaultyBackend b(std::make_unique<HostBackend>(), c);
    std::vector<Ticket> tickets;
    for (int j = 0; j < 40; ++j) {
      tickets.push_back(b.submit(plan_of(j, j % 2 == 0 ? JobKind::store : JobKind::load,
                                         src.data() + 64 * j, dst.data() + 64 * j, 1)));
    }
    for (const Ticket t : tickets) b.wait(t);
    std::vector<BackendResult> first;
    b.poll(first);
    const auto rest = drain(b);
    std::vector<BackendResult> all = first;
    all.insert(all.end(), rest.begin(), rest.end());
    REQUIRE(all.size() == 40);  // nothing lost, nothing twice
    std::vector<JobId> stores, loads;
    for (const auto& r : all) {
      CHECK(r.ok);
      (r.kind == JobKind::store ? stores : loads).push_back(r.job);
    }
    CHECK(b.counts().delayed > 0);
    CHECK(first.size() < 40);  // some were held back
    const bool in_order =
        std::is_sorted(stores.begin(), stores.end()) && std::is_sorted(loads.begin(), loads.end());
    if (!reorder) CHECK(in_order);
    if (reorder) CHECK(b.counts().reordered_batches > 0);
  }
}

TEST_CASE("FaultyBackend refuses impossible settings", "[faults]") {
  FaultConfig c;
  c.fail = 1.5;
  CHECK_THROWS_AS(FaultyBackend(std::make_unique<HostBackend>(), c), invalid_argument);
  CHECK_THROWS_AS(FaultyBackend(nullptr, FaultConfig{}), invalid_argument);
}
