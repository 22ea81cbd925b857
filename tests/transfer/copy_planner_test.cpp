#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "kvoffload/error.hpp"
#include "support/kv_fixture.hpp"

using namespace kvoffload;
using namespace kvtest;
using Catch::Matchers::ContainsSubstring;

namespace {

struct GroupPart {
  std::int64_t block_index;
  std::vector<GpuBlockId> ids;
  std::vector<HostBlockId> host;
};

TransferJob make_job(JobId id, const std::vector<GroupPart>& parts) {
  TransferJob job;
  job.id = id;
  for (std::size_t g = 0; g < parts.size(); ++g) {
    job.gpu.group_sizes.push_back(static_cast<std::int64_t>(parts[g].ids.size()));
    job.gpu.block_indices.push_back(parts[g].block_index);
    job.gpu.block_ids.insert(job.gpu.block_ids.end(), parts[g].ids.begin(), parts[g].ids.end());
    for (const HostBlockId h : parts[g].host) {
      job.keys.push_back(Key{BlockHash::from_hex("ab"), static_cast<std::uint32_t>(g)});
      job.host_block_ids.push_back(h);
    }
  }
  return job;
}

/// Host address of sub-block `sub` of tensor k of group g in host block h.
std::uint8_t* host_page(const KvFixture& fx, std::size_t g, std::size_t k, HostBlockId h,
                        std::int64_t sub) {
  return reinterpret_cast<std::uint8_t*>(fx.host.base) + h * fx.host.block_stride_bytes +
         fx.layout->host_offset(g, k, sub);
}

bool host_page_is(const KvFixture& fx, std::size_t g, std::size_t k, HostBlockId h,
                  std::int64_t sub, std::int64_t bytes, std::uint64_t seed) {
  const std::uint8_t* p = host_page(fx, g, k, h, sub);
  for (std::int64_t i = 0; i < bytes; ++i) {
    if (p[i] != pattern(seed, i)) return false;
  }
  return true;
}

bool host_page_untouched(const KvFixture& fx, std::size_t g, std::size_t k, HostBlockId h,
                         std::int64_t sub, std::int64_t bytes) {
  const std::uint8_t* p = host_page(fx, g, k, h, sub);
  for (std::int64_t i = 0; i < bytes; ++i) {
    if (p[i] != KvFixture::guard(reinterpret_cast<std::uintptr_t>(p + i))) return false;
  }
  return true;
}

std::uint64_t seed_of(std::size_t tensor, std::int64_t block) {
  return tensor * 1000 + static_cast<std::uint64_t>(block);
}

/// Stores `job` and checks every GPU block p of group g landed in host block
/// (skip + p) / f, sub-block (skip + p) % f.
void check_store(KvFixture& fx, const TransferJob& job) {
  const std::int64_t f = fx.layout->block_size_factor();
  for (std::size_t t = 0; t < fx.gpu.size(); ++t) {
    for (std::int64_t b = 0; b < fx.layout->tensors()[t].num_blocks; ++b) {
      fx.write_page(t, b, fx.layout->tensors()[t].page_bytes, seed_of(t, b));
    }
  }
  CopyPlanner planner(*fx.layout, fx.host);
  CopyPlan plan;
  planner.plan(job, JobKind::store, plan);
  KvFixture::apply(plan);
  std::size_t at = 0, key = 0;
  for (std::size_t g = 0; g < fx.layout->num_groups(); ++g) {
    const std::int64_t skip = job.gpu.block_indices[g] % f;
    for (std::int64_t p = 0; p < job.gpu.group_sizes[g]; ++p) {
      const HostBlockId h = job.host_block_ids[key + static_cast<std::size_t>((skip + p) / f)];
      for (std::size_t k = 0; k < fx.layout->group(g).size(); ++k) {
        const GroupTensor& gt = fx.layout->group(g)[k];
        INFO("group " << g << " GPU block " << p << " tensor " << k);
        CHECK(host_page_is(fx, g, k, h, (skip + p) % f, gt.page_bytes,
                           seed_of(static_cast<std::size_t>(gt.tensor),
                                   job.gpu.block_ids[at + static_cast<std::size_t>(p)])));
      }
    }
    at += static_cast<std::size_t>(job.gpu.group_sizes[g]);
    key += static_cast<std::size_t>((job.gpu.group_sizes[g] + skip + f - 1) / f);
  }
}

}  // namespace

TEST_CASE("Planner: an aligned group fills whole host blocks and merges runs", "[planner]") {
  KvFixture fx({{32, 64, 64}}, {{{0, 64}}}, 4, 8);
  const auto job = make_job(1, {{0, {1, 2, 3, 4, 5, 6, 7, 8}, {3, 5}}});
  check_store(fx, job);
  CopyPlan plan;
  CopyPlanner(*fx.layout, fx.host).plan(job, JobKind::store, plan);
  CHECK(plan.descriptors.size() == 2);  // pages 1-4 -> block 3, pages 5-8 -> block 5
  CHECK(plan.total_bytes == 8 * 64);
}

TEST_CASE("Planner: an unaligned group skips block_indices % f sub-blocks", "[planner]") {
  KvFixture fx({{32, 64, 64}}, {{{0, 64}}}, 4, 8);
  const auto job = make_job(2, {{2, {1, 2, 3, 4, 5, 6}, {3, 5}}});
  check_store(fx, job);
  CHECK(host_page_untouched(fx, 0, 0, 3, 0, 64));
  CHECK(host_page_untouched(fx, 0, 0, 3, 1, 64));
}

TEST_CASE("Planner: a group unaligned at both ends", "[planner]") {
  // vLLM's multi-group worker test: starts at sub-block 2, ends at sub-block 2 of the next.
  KvFixture fx({{32, 64, 64}, {32, 32, 32}}, {{{0, 64}}, {{1, 32}}}, 4, 8);
  const auto job = make_job(3, {{0, {1, 2, 3, 4}, {0}}, {6, {9, 10, 11, 12, 13}, {1, 2}}});
  check_store(fx, job);
  CHECK(host_page_untouched(fx, 1, 0, 1, 0, 32));
  CHECK(host_page_untouched(fx, 1, 0, 1, 1, 32));
  CHECK(host_page_untouched(fx, 1, 0, 2, 3, 32));
}

TEST_CASE("Planner: an empty group copies nothing", "[planner]") {
  KvFixture fx({{32, 64, 64}, {32, 64, 64}}, {{{0, 64}}, {{1, 64}}}, 2, 8);
  const auto job = make_job(4, {{0, {}, {}}, {0, {3, 4}, {6}}});
  check_store(fx, job);
  CopyPlan plan;
  CopyPlanner(*fx.layout, fx.host).plan(job, JobKind::store, plan);
  CHECK(plan.total_bytes == 2 * 64);
}

TEST_CASE("Planner: factors 1 and 16", "[planner]") {
  SECTION("f = 1") {
    KvFixture fx({{32, 128, 128}}, {{{0, 128}}}, 1, 8);
    check_store(fx, make_job(5, {{0, {4, 2, 9}, {7, 0, 3}}}));
  }
  SECTION("f = 16, 8 of 16 sub-blocks null in the window group") {
    KvFixture fx({{64, 64, 64}, {64, 64, 64}}, {{{0, 64}}, {{1, 64}}}, 16, 8);
    std::vector<GpuBlockId> window(8), full(32);
    for (int i = 0; i < 8; ++i) window[static_cast<std::size_t>(i)] = 40 + i;
    for (int i = 0; i < 32; ++i) full[static_cast<std::size_t>(i)] = 1 + i;
    check_store(fx, make_job(6, {{24, window, {2}}, {0, full, {4, 5}}}));
  }
}

TEST_CASE("Planner: groups may share a tensor", "[planner]") {
  KvFixture fx({{32, 64, 64}}, {{{0, 64}}, {{0, 64}}}, 2, 8);
  check_store(fx, make_job(7, {{0, {1, 2}, {0}}, {1, {7, 8, 9}, {1, 2}}}));
}

TEST_CASE("Planner: per-layer and cross-layer layouts move the same bytes", "[planner]") {
  // Two layers of K and V: four tensors of 128-byte pages, or one tensor of 512-byte pages.
  KvFixture per_layer({{16, 128, 128}, {16, 128, 128}, {16, 128, 128}, {16, 128, 128}},
                      {{{0, 128}, {1, 128}, {2, 128}, {3, 128}}}, 2, 4);
  KvFixture cross({{16, 512, 512}}, {{{0, 512}}}, 2, 4);
  CHECK(per_layer.layout->host_block_bytes(0) == cross.layout->host_block_bytes(0));
  const auto job = make_job(8, {{0, {3, 4, 5, 6}, {1, 2}}});
  check_store(per_layer, job);
  check_store(cross, job);
  CopyPlan a, b;
  CopyPlanner(*per_layer.layout, per_layer.host).plan(job, JobKind::store, a);
  CopyPlanner(*cross.layout, cross.host).plan(job, JobKind::store, b);
  CHECK(a.total_bytes == b.total_bytes);
  CHECK(a.descriptors.size() == 8);  // per tensor, per host block
  // Cross-layer: GPU pages 3..6 are one run, and so are host blocks 1 and 2 (adjacent).
  CHECK(b.descriptors.size() == 1);
}

TEST_CASE("Planner: coalescing merges exactly the contiguous runs", "[planner]") {
  SECTION("consecutive ids merge, a gap splits") {
    KvFixture fx({{32, 64, 64}}, {{{0, 64}}}, 4, 8);
    const auto job = make_job(9, {{0, {1, 2, 3, 7}, {0}}});
    check_store(fx, job);
    CopyPlan plan;
    CopyPlanner(*fx.layout, fx.host).plan(job, JobKind::store, plan);
    REQUIRE(plan.descriptors.size() == 2);
    CHECK(plan.descriptors[0].bytes == 3 * 64);  // largest first
    CHECK(plan.descriptors[1].bytes == 64);
  }
  SECTION("padded pages never merge on the GPU side") {
    KvFixture fx({{32, 96, 96}}, {{{0, 64}}}, 4, 8);
    const auto job = make_job(10, {{0, {1, 2, 3, 4}, {0}}});
    check_store(fx, job);
    CopyPlan plan;
    CopyPlanner(*fx.layout, fx.host).plan(job, JobKind::load, plan);
    CHECK(plan.descriptors.size() == 4);
    CHECK(plan.total_bytes == 4 * 64);  // the padding is not copied
  }
  SECTION("a run never crosses the seam between two host registrations") {
    // Factor 1, one tensor: consecutive GPU ids into consecutive host blocks are one run in
    // memory. With 3 blocks per registration, host blocks 1..7 lie in registrations 0, 1, 2.
    KvFixture fx({{32, 256, 256}}, {{{0, 256}}}, 1, 12);  // 256: pages fill host blocks
    const auto job = make_job(11, {{0, {4, 5, 6, 7, 8, 9, 10}, {1, 2, 3, 4, 5, 6, 7}}});
    check_store(fx, job);
    CopyPlan plan;
    CopyPlanner(*fx.layout, fx.host).plan(job, JobKind::store, plan);
    CHECK(plan.descriptors.size() == 1);  // one registration: one run
    fx.host.blocks_per_registration = 3;
    CopyPlanner(*fx.layout, fx.host).plan(job, JobKind::load, plan);
    REQUIRE(plan.descriptors.size() == 3);  // [1, 2], [3, 4, 5], [6, 7]
    CHECK(plan.descriptors[0].bytes == 3 * 256);
    CHECK(plan.descriptors[0].src == fx.host.base + 3 * 256);
    CHECK(plan.descriptors[1].bytes == 2 * 256);
    CHECK(plan.descriptors[2].bytes == 2 * 256);
    CHECK(plan.total_bytes == 7 * 256);
    for (const CopyDescriptor& d : plan.descriptors) {
      const auto first = static_cast<std::int64_t>((d.src - fx.host.base) / 256);
      const auto last = static_cast<std::int64_t>((d.src + d.bytes - 1 - fx.host.base) / 256);
      CHECK(first / 3 == last / 3);
    }
  }
}

TEST_CASE("Planner refuses jobs that break the invariants, naming job and group", "[planner]") {
  KvFixture fx({{32, 64, 64}, {32, 64, 64}}, {{{0, 64}}, {{1, 64}}}, 3, 8);
  CopyPlanner planner(*fx.layout, fx.host);
  CopyPlan plan;
  SECTION("the pre-fix counting: f per offloaded block although two sub-blocks are null") {
    auto job = make_job(11, {{0, {1, 2, 3, 4, 5, 6}, {0, 1}}, {2, {13, 14, 15, 16}, {2, 3}}});
    job.gpu.group_sizes[1] = 6;  // what vLLM emitted
    job.gpu.block_indices[1] = 0;
    CHECK_THROWS_AS(planner.plan(job, JobKind::store, plan), invalid_argument);
    CHECK_THROWS_WITH(planner.plan(job, JobKind::store, plan), ContainsSubstring("job 11"));
  }
  SECTION("a GPU block outside the cache") {
    const auto job = make_job(12, {{0, {1, 2, 32}, {0}}, {0, {}, {}}});
    CHECK_THROWS_WITH(planner.plan(job, JobKind::load, plan),
                      ContainsSubstring("job 12 group 0: GPU block 32"));
  }
  SECTION("a host block outside the pool") {
    const auto job = make_job(13, {{0, {}, {}}, {0, {1, 2, 3}, {8}}});
    CHECK_THROWS_WITH(planner.plan(job, JobKind::load, plan),
                      ContainsSubstring("job 13 group 1: host block 8"));
  }
  SECTION("the null block") {
    const auto job = make_job(14, {{0, {0, 1, 2}, {0}}, {0, {}, {}}});
    CHECK_THROWS_WITH(planner.plan(job, JobKind::store, plan), ContainsSubstring("null block"));
  }
}

// Issue 49, item 9: two copies into one block leave whichever lands last. Reading one twice
// is harmless (a request whose prompt repeats a block's hash loads one host block twice).
TEST_CASE("Planner refuses a job that writes one block twice", "[planner]") {
  CopyPlan plan;
  SECTION("a load writing one GPU block twice; a store reading it twice is fine") {
    KvFixture fx({{32, 64, 64}, {32, 64, 64}}, {{{0, 64}}, {{1, 64}}}, 3, 8);
    const CopyPlanner planner(*fx.layout, fx.host);
    const auto job = make_job(21, {{0, {1, 2, 3, 4, 2}, {0, 1}}, {0, {}, {}}});
    CHECK_THROWS_WITH(planner.plan(job, JobKind::load, plan),
                      ContainsSubstring("job 21: GPU block 2 is loaded twice"));
    CHECK_NOTHROW(planner.plan(job, JobKind::store, plan));
  }
  SECTION("one id in two groups: refused only when the groups share a tensor") {
    KvFixture apart({{32, 64, 64}, {32, 64, 64}}, {{{0, 64}}, {{1, 64}}}, 1, 8);
    const CopyPlanner separate(*apart.layout, apart.host);
    const auto job = make_job(22, {{0, {5}, {0}}, {0, {5}, {1}}});
    CHECK_NOTHROW(separate.plan(job, JobKind::load, plan));
    KvFixture shared({{32, 64, 64}}, {{{0, 64}}, {{0, 64}}}, 1, 8);
    const CopyPlanner sharing(*shared.layout, shared.host);
    CHECK_THROWS_WITH(sharing.plan(job, JobKind::load, plan),
                      ContainsSubstring("job 22: GPU block 5 is loaded twice"));
  }
  SECTION("a store writing one host block twice; a load reading it twice is fine") {
    KvFixture fx({{32, 64, 64}, {32, 64, 64}}, {{{0, 64}}, {{1, 64}}}, 1, 8);
    const CopyPlanner planner(*fx.layout, fx.host);
    const auto job = make_job(23, {{0, {1}, {3}}, {0, {2}, {3}}});
    CHECK_THROWS_WITH(planner.plan(job, JobKind::store, plan),
                      ContainsSubstring("job 23: host block 3 is stored twice"));
    CHECK_NOTHROW(planner.plan(job, JobKind::load, plan));
  }
}

TEST_CASE("Layouts reject bad tensors and groups", "[planner][layout]") {
  std::vector<std::uint8_t> mem(4096);
  const auto base = reinterpret_cast<std::uintptr_t>(mem.data());
  auto rejects = [](auto make, const std::string& what) {
    CHECK_THROWS_AS(make(), invalid_argument);
    CHECK_THROWS_WITH(make(), ContainsSubstring(what));
  };
  rejects([&] { return KvLayout({{base, 4, 64, 32}}, {{{0, 64}}}, 1); }, "tensor 0");
  rejects([&] { return KvLayout({{0, 4, 64, 64}}, {{{0, 64}}}, 1); }, "null base");
  rejects([&] { return KvLayout({{base, 4, 64, 64}}, {{{1, 64}}}, 1); }, "group 0 tensor 0");
  rejects([&] { return KvLayout({{base, 4, 64, 64}}, {{{0, 65}}}, 1); }, "page_bytes 65");
  rejects([&] { return KvLayout({{base, 4, 64, 64}}, {{}}, 1); }, "group 0 has no tensors");
  rejects([&] { return KvLayout({{base, 4, 64, 64}}, {{{0, 64}}}, 0); }, "block_size_factor");
}
