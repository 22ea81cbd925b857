// The CUDA copy kernels' bodies and the automatic mode choice, run on the CPU.

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include <catch2/catch_test_macros.hpp>

#include "kvoffload/copy_planner.hpp"
#include "kvoffload/cuda_backend.hpp"
#include "kvoffload/detail/copy_body.hpp"
#include "support/kv_fixture.hpp"

using namespace kvoffload;
using kvoffload::detail::DevicePiece;

namespace {

std::uint64_t addr(std::vector<std::uint8_t>& v, std::size_t off) {
  return reinterpret_cast<std::uint64_t>(v.data() + off);
}

/// Runs copy_pieces as a grid of `warps` warps of `lanes` lanes would, one lane at a time.
void run_grid(const std::vector<DevicePiece>& pieces, unsigned warps, unsigned lanes) {
  for (unsigned w = 0; w < warps; ++w) {
    for (unsigned l = 0; l < lanes; ++l) {
      detail::copy_pieces(pieces.data(), pieces.size(), w, warps, l, lanes);
    }
  }
}

}  // namespace

TEST_CASE("Kernel body: lanes together copy every byte once, aligned or not", "[kernel_body]") {
  std::mt19937 rng(7);
  for (int round = 0; round < 50; ++round) {
    std::vector<std::uint8_t> src(1 << 16), dst(1 << 16, 0xee);
    std::iota(src.begin(), src.end(), static_cast<std::uint8_t>(round));
    // Pieces at random (possibly unaligned) offsets and sizes, not overlapping on dst.
    std::vector<DevicePiece> pieces;
    std::size_t at = 0;
    while (at < dst.size() - 2048) {
      const std::size_t skip = rng() % 64, len = 1 + rng() % 1500;
      const std::size_t from = rng() % (src.size() - len);
      pieces.push_back({addr(src, from), addr(dst, at + skip), len});
      at += skip + len;
    }
    const auto before = dst;
    run_grid(pieces, static_cast<unsigned>(1 + rng() % 9), 32);
    std::vector<std::uint8_t> expect = before;
    for (const DevicePiece& p : pieces) {
      std::memcpy(reinterpret_cast<void*>(addr(expect, p.dst - addr(dst, 0))),
                  reinterpret_cast<const void*>(p.src), p.bytes);
    }
    REQUIRE(dst == expect);
  }
}

TEST_CASE("Kernel body: every 16-byte word is aligned on both sides", "[kernel_body]") {
  std::mt19937 rng(16);
  for (int round = 0; round < 20000; ++round) {
    const DevicePiece p{4096 + rng() % 64, (1U << 20) + rng() % 64, rng() % 200};
    const detail::PieceSplit split = detail::split_piece(p);
    INFO("src " << p.src << " dst " << p.dst << " bytes " << p.bytes);
    REQUIRE(split.head + 16 * split.words <= p.bytes);
    if (split.words > 0) {
      REQUIRE((p.src + split.head) % 16 == 0);
      REQUIRE((p.dst + split.head) % 16 == 0);
    }
    // Equally aligned pieces use the vector path for all but their ends.
    if ((p.src - p.dst) % 16 == 0) REQUIRE(p.bytes - split.head - 16 * split.words < 16);
  }
}

TEST_CASE("Kernel body: 16-byte words when everything is aligned", "[kernel_body]") {
  alignas(16) std::uint8_t src[256], dst[256] = {};
  for (int i = 0; i < 256; ++i) src[i] = static_cast<std::uint8_t>(i);
  const DevicePiece p{reinterpret_cast<std::uint64_t>(src), reinterpret_cast<std::uint64_t>(dst),
                      256};
  // With 16 lanes each lane copies exactly one 16-byte word per pass: lane 3 alone copies
  // bytes 48..63 and 304.. (out of range), nothing else.
  detail::copy_piece(p, 3, 16);
  for (int i = 0; i < 256; ++i) CHECK(dst[i] == ((i >= 48 && i < 64) ? i : 0));
}

TEST_CASE("Kernel body: warp indices past 32 bits pick no piece of a small job", "[kernel_body]") {
  // A grid of more than 2^32 warps: warp 2^32 of 2^32 + 1 handles only piece 2^32 (none here).
  // In 32 bits it would be warp 0 of 1, which copies every piece (and a warp count of 2^32
  // would be 0: a loop that never ends).
  std::uint8_t src[64], dst[64] = {};
  for (int i = 0; i < 64; ++i) src[i] = static_cast<std::uint8_t>(i + 1);
  const std::vector<DevicePiece> pieces{
      {reinterpret_cast<std::uint64_t>(src), reinterpret_cast<std::uint64_t>(dst), 64}};
  const std::uint64_t big = std::uint64_t{1} << 32;
  for (unsigned l = 0; l < 32; ++l) detail::copy_pieces(pieces.data(), 1, big, big + 1, l, 32);
  CHECK(std::all_of(dst, dst + 64, [](std::uint8_t b) { return b == 0; }));
  for (unsigned l = 0; l < 32; ++l) detail::copy_pieces(pieces.data(), 1, 0, big + 1, l, 32);
  CHECK(std::equal(dst, dst + 64, src));
}

TEST_CASE("The compaction keeps every id but the null block", "[kernel_body]") {
  CHECK(detail::NotNullBlock{}(5));
  CHECK_FALSE(detail::NotNullBlock{}(0));
}

TEST_CASE("The automatic copy mode follows piece size, count and direction", "[copy_mode]") {
  CudaBackendConfig c;
  c.store_small_piece_bytes = c.load_small_piece_bytes = 64 << 10;
  c.staged_min_pieces = 4;
  c.staging_bytes = 1 << 20;
  auto plan = [](JobKind dir, std::size_t n, std::uint64_t piece) {
    CopyPlan p;
    p.kind = dir;
    p.descriptors.assign(n, {1, 2, piece});
    p.total_bytes = n * piece;
    return p;
  };
  CHECK(choose_copy_mode(plan(JobKind::store, 8, 1 << 20), c, true, true) == CopyMode::batch);
  CHECK(choose_copy_mode(plan(JobKind::store, 8, 1 << 20), c, false, true) == CopyMode::memcpy);
  CHECK(choose_copy_mode(plan(JobKind::store, 8, 8 << 10), c, true, true) == CopyMode::staged);
  // Staged both ways (issue 49: loads scatter out of staging filled by one DMA per host run).
  CHECK(choose_copy_mode(plan(JobKind::load, 8, 8 << 10), c, true, true) == CopyMode::staged);
  CHECK(choose_copy_mode(plan(JobKind::store, 2, 8 << 10), c, true, true) == CopyMode::kernel);
  // Too big for the staging buffer: the kernel does it in place.
  CHECK(choose_copy_mode(plan(JobKind::store, 200, 8 << 10), c, true, true) == CopyMode::kernel);
  // Without mapped host memory, no kernel modes.
  CHECK(choose_copy_mode(plan(JobKind::load, 8, 8 << 10), c, true, false) == CopyMode::batch);
  // By default automatic never stages (slower than the kernel on an H200 at every size).
  CHECK(choose_copy_mode(plan(JobKind::store, 1000, 8 << 10), CudaBackendConfig{}, true, true) ==
        CopyMode::kernel);
  c.mode = CopyMode::staged;
  CHECK(choose_copy_mode(plan(JobKind::load, 8, 8 << 10), c, true, true) == CopyMode::staged);
  // Each run at a 16-byte boundary: a job whose pieces fill staging exactly does not fit.
  CHECK(choose_copy_mode(plan(JobKind::store, 128, 8 << 10), c, true, true) == CopyMode::kernel);
  CHECK(choose_copy_mode(plan(JobKind::store, 127, 8 << 10), c, true, true) == CopyMode::staged);
  CHECK(parse_copy_mode("staged", "mode") == CopyMode::staged);
  CHECK_THROWS(parse_copy_mode("dma", "mode"));
}

// calibrate's decision on the two-way cost model of the simulator (SimConfig::links 2), computed
// here exactly: 512 KiB moved per job, the kernel at 0.5 GB/s (1.049 ms), DMAs at 1 GB/s plus
// 40 us each (0.524 ms + n * 40 us for n pieces), staged a free gather plus one DMA (0.564 ms).
// The kernel beats batch while n * 40 us > 0.524 ms, n > 13.1: at 32 KiB (n = 16, batch 1.164
// ms) it still wins, at 64 KiB (n = 8, 0.844 ms) batch does: threshold 2 x 32 KiB = 64 KiB.
// Staged beats both everywhere.
TEST_CASE("calibrate's choice follows the measurements", "[copy_mode][calibrate]") {
  const double bytes = 512.0 * 1024;
  std::vector<CalibrationSample> samples;
  for (const JobKind dir : {JobKind::store, JobKind::load}) {
    for (std::uint64_t piece = 4096; piece <= (256 << 10); piece *= 2) {
      const double n = bytes / static_cast<double>(piece);
      samples.push_back({dir, piece, bytes / 0.5e9, bytes / 1e9 + 40e-6, bytes / 1e9 + n * 40e-6});
    }
  }
  CudaBackendConfig c = choose_calibration(CudaBackendConfig{}, samples);
  CHECK(c.store_small_piece_bytes == 256 << 10 << 1);  // staged wins at every size measured
  CHECK(c.staged_min_pieces == 1);
  for (auto& m : samples) m.staged_s = -1;  // a device that cannot stage: kernel vs batch
  c = choose_calibration(CudaBackendConfig{}, samples);
  CHECK(c.store_small_piece_bytes == 64 << 10);
  CHECK(c.load_small_piece_bytes == 64 << 10);
  CHECK(c.staged_min_pieces == 0);
  // Batch wins everywhere: the threshold is the smallest size measured (nothing goes small).
  for (auto& m : samples) m.batch_s = 0;
  c = choose_calibration(CudaBackendConfig{}, samples);
  CHECK(c.store_small_piece_bytes == 4096);
  // Loads not measured: their threshold is left as it was.
  samples.erase(std::remove_if(samples.begin(), samples.end(),
                               [](const CalibrationSample& m) { return m.dir == JobKind::load; }),
                samples.end());
  CudaBackendConfig given;
  given.load_small_piece_bytes = 12345;
  CHECK(choose_calibration(given, samples).load_small_piece_bytes == 12345);
}

TEST_CASE("Device-table pieces (piece_for) copy exactly what the planner copies", "[kernel_body]") {
  std::mt19937 rng(21);
  for (int round = 0; round < 40; ++round) {
    const std::int64_t f = 1 + static_cast<std::int64_t>(rng() % 6);
    // Two groups: one of two tensors, one of one (padded) tensor.
    // One fixture, run twice from the same starting bytes: planner, then piece_for.
    kvtest::KvFixture b({{128, 64, 64}, {128, 64, 64}, {128, 96, 128}},
                        {{{0, 64}, {1, 64}}, {{2, 80}}}, f, 64);
    for (std::size_t t = 0; t < 3; ++t) {
      for (std::int64_t blk = 0; blk < 128; ++blk) {
        b.write_page(t, blk, b.layout->tensors()[t].page_bytes,
                     t * 1000 + static_cast<std::uint64_t>(blk));
      }
    }
    const std::vector<std::uint8_t> host_start = b.host_memory;
    TransferJob job;
    job.id = round;
    std::vector<GpuBlockId> pool_ids;
    for (GpuBlockId id = 1; id < 128; ++id) pool_ids.push_back(id);
    std::shuffle(pool_ids.begin(), pool_ids.end(), rng);
    HostBlockId next_host = 0;
    for (std::uint32_t g = 0; g < 2; ++g) {
      const std::int64_t size = static_cast<std::int64_t>(rng() % static_cast<unsigned>(3 * f + 1));
      const std::int64_t index =
          size == 0 ? 0 : static_cast<std::int64_t>(rng() % static_cast<unsigned>(2 * f));
      job.gpu.group_sizes.push_back(size);
      job.gpu.block_indices.push_back(index);
      for (std::int64_t p = 0; p < size; ++p) {
        job.gpu.block_ids.push_back(pool_ids.back());
        pool_ids.pop_back();
      }
      for (std::int64_t h = 0; h < (size + index % f + f - 1) / f; ++h) {
        job.keys.push_back(Key{BlockHash::from_hex("aa"), g});
        job.host_block_ids.push_back(next_host++);
      }
    }
    CopyPlan plan;
    CopyPlanner(*b.layout, b.host).plan(job, JobKind::store, plan);
    kvtest::KvFixture::apply(plan);
    const std::vector<std::uint8_t> by_planner = b.host_memory;
    std::memcpy(b.host_memory.data(), host_start.data(), host_start.size());

    detail::DeviceJobLayout L{};
    L.groups = 2;
    L.block_size_factor = f;
    L.host_base = b.host.base;
    L.host_stride = static_cast<std::uint64_t>(b.host.block_stride_bytes);
    L.store = true;
    std::int64_t first = 0;
    for (int g = 0; g < 2; ++g) {
      L.block_index[g] = job.gpu.block_indices[static_cast<std::size_t>(g)];
      L.first_host[g] = first;
      L.host_count[g] =
          (job.gpu.group_sizes[static_cast<std::size_t>(g)] + L.block_index[g] % f + f - 1) / f;
      L.expected[g] = job.gpu.group_sizes[static_cast<std::size_t>(g)];
      L.max_id[g] = 127;
      first += L.host_count[g];
      const auto& tensors = b.layout->group(static_cast<std::size_t>(g));
      L.tensors[g] = static_cast<int>(tensors.size());
      L.max_tensors = std::max(L.max_tensors, L.tensors[g]);
      for (std::size_t k = 0; k < tensors.size(); ++k) {
        const KvTensor& t = b.layout->tensors()[static_cast<std::size_t>(tensors[k].tensor)];
        L.tensor[g][k] = {
            t.base, static_cast<std::uint64_t>(t.block_stride_bytes),
            static_cast<std::uint64_t>(tensors[k].page_bytes),
            static_cast<std::uint64_t>(b.layout->host_offset(static_cast<std::size_t>(g), k, 0))};
      }
    }
    for (std::size_t i = 0; i < job.gpu.block_ids.size(); ++i) {
      for (int k = 0; k < L.max_tensors; ++k) {
        const DevicePiece p =
            detail::piece_for(L, job.gpu.block_ids.data(), job.gpu.group_sizes.data(),
                              job.host_block_ids.data(), i, k);
        if (p.bytes != 0)
          std::memcpy(reinterpret_cast<void*>(p.dst), reinterpret_cast<const void*>(p.src),
                      p.bytes);
      }
    }
    INFO("round " << round << " f " << f);
    CHECK(b.host_memory == by_planner);
    CHECK((b.host_memory != host_start || job.gpu.block_ids.empty()));
  }
}

TEST_CASE("build_piece emits no bytes for a failed check, past the count or past the tensors",
          "[kernel_body]") {
  detail::DeviceJobLayout L{};
  L.groups = 2;
  L.max_tensors = 1;
  L.block_size_factor = 2;
  L.host_base = 1 << 20;
  L.host_stride = 4096;
  L.store = true;
  L.tensors[0] = L.tensors[1] = 1;
  L.first_host[1] = 1;
  L.host_count[0] = L.host_count[1] = 1;
  L.expected[0] = L.expected[1] = 2;
  L.max_id[0] = L.max_id[1] = 9;
  L.tensor[0][0] = {1 << 24, 512, 512, 0};
  L.tensor[1][0] = {1 << 25, 512, 512, 0};
  const std::int32_t host_ids[] = {3, 4};
  std::int32_t ids[] = {1, 2, 3, 4};
  std::int64_t counts[] = {2, 2};
  std::int64_t count = 4;
  int mismatch = 0;
  auto piece = [&](std::uint64_t x) {
    return detail::build_piece(L, ids, &count, counts, host_ids, &mismatch, x);
  };
  CHECK(piece(0).bytes == 512);
  CHECK(piece(0).src == (1U << 24) + 512);
  CHECK(piece(0).dst == (1U << 20) + 3 * 4096);
  CHECK(piece(3).dst == (1U << 20) + 4 * 4096 + 512);
  CHECK(piece(4).bytes == 0);  // past the count
  mismatch = 1;
  for (std::uint64_t x = 0; x < 4; ++x) CHECK(piece(x).bytes == 0);
  mismatch = 0;
  ids[1] = 10;  // past the group's tensors
  CHECK(piece(1).bytes == 0);
  ids[1] = 2;
  counts[0] = 3;  // a wrong table: group 0 claims 3 ids, more than the job's 2
  count = 5;
  CHECK(piece(2).bytes == 0);  // the third id of group 0 is clamped away
  // ... by the group's expected size alone, even where its host blocks would reach further
  // (the third id would land in host_ids[1], group 1's block).
  L.host_count[0] = 2;
  CHECK(piece(2).bytes == 0);
}

TEST_CASE("Kernel body: equally misaligned pieces copy as head, 16-byte body and tail",
          "[kernel_body]") {
  // Source and destination both 5 bytes past a 16-byte boundary: 11 head bytes, then words,
  // then a tail; every lane count must copy exactly the piece and nothing around it.
  for (const unsigned lanes : {1U, 3U, 32U}) {
    for (const std::uint64_t len : {1ULL, 10ULL, 11ULL, 27ULL, 1000ULL, 4096ULL}) {
      alignas(16) std::uint8_t src[4200], dst[4200];
      for (std::size_t i = 0; i < sizeof src; ++i) src[i] = static_cast<std::uint8_t>(i * 13 + 1);
      std::memset(dst, 0xee, sizeof dst);
      const DevicePiece p{reinterpret_cast<std::uint64_t>(src + 5),
                          reinterpret_cast<std::uint64_t>(dst + 21), len};
      for (unsigned l = 0; l < lanes; ++l) detail::copy_piece(p, l, lanes);
      INFO("lanes " << lanes << " len " << len);
      for (std::size_t i = 0; i < sizeof dst; ++i) {
        const bool inside = i >= 21 && i < 21 + len;
        REQUIRE(dst[i] == (inside ? src[i - 16] : 0xee));
      }
    }
  }
}
