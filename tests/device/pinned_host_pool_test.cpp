#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <set>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "kvoffload/byte_size.hpp"
#include "kvoffload/device.hpp"
#include "kvoffload/error.hpp"
#include "kvoffload/pinned_host_pool.hpp"
#include "kvoffload/testing/sim_device.hpp"

using namespace kvoffload;
using Catch::Matchers::ContainsSubstring;

namespace {

PoolConfig small(std::int64_t blocks, std::int64_t block_bytes) {
  PoolConfig c;
  c.host_blocks = blocks;
  c.block_bytes = block_bytes;
  c.pinning = Pinning::off;
  return c;
}

// Registration goes through the device runtime (issue 27, join 5): the same checks run on the
// simulated device in every build and on the CUDA runtime on a GPU runner.
void registers_in_block_aligned_chunks(const std::shared_ptr<DeviceRuntime>& runtime) {
  PoolConfig c = small(100, 3 << 20);
  c.pinning = Pinning::require;
  c.runtime = runtime;
  c.device = 0;
  c.register_chunk_bytes = 64 << 20;  // 21 blocks of 3 MiB per registration
  PinnedHostPool pool(c);
  CHECK(pool.report().pinned);
  CHECK(pool.report().registrations == 5);
  if (auto* sim = dynamic_cast<SimDevice*>(runtime.get())) CHECK(sim->live_registrations() == 5);
  // Every byte is pinned and mapped, across the chunks' seams too.
  REQUIRE(runtime->push_device(0) == dev::ok);
  bool mapped = false;
  CHECK(runtime->host_mapped(pool.data(), pool.size_bytes(), &mapped) == dev::ok);
  CHECK(mapped);
  CHECK(runtime->host_mapped(pool.block(20), 2 * pool.block_bytes(), &mapped) == dev::ok);
  CHECK(mapped);
  CHECK(pool.blocks_per_registration() == 21);
  // A copy call across the seam between two registrations (blocks 20 and 21) is refused, as
  // an H200 refused it (cudaErrorInvalidValue), although both are pinned and adjacent: so the
  // planner never merges across it (HostRegion::blocks_per_registration). Each side copies.
  void* device = nullptr;
  const std::size_t b = pool.block_bytes();
  REQUIRE(runtime->malloc_device(&device, 2 * b) == dev::ok);
  CHECK(runtime->memcpy_async(device, pool.block(20), 2 * b, 0) != dev::ok);
  (void)runtime->get_last_error();
  CHECK(runtime->memcpy_async(device, pool.block(20), b, 0) == dev::ok);
  CHECK(runtime->memcpy_async(static_cast<char*>(device) + b, pool.block(21), b, 0) == dev::ok);
  CHECK(runtime->stream_synchronize(0) == dev::ok);
  CHECK(runtime->free_device(device) == dev::ok);
  CHECK(runtime->pop_device() == dev::ok);
}

void unwinds_a_failed_registration(const std::shared_ptr<DeviceRuntime>& runtime) {
  PoolConfig c = small(8, 1 << 20);
  c.pinning = Pinning::require;
  c.runtime = runtime;
  c.register_chunk_bytes = 2 << 20;  // 4 registrations; the second fails
  ::setenv("KVOFFLOAD_FAULT_REGISTER_CHUNK", "1", 1);
  CHECK_THROWS_AS(PinnedHostPool(c), cuda_error);
  CHECK_THROWS_WITH(PinnedHostPool(c), ContainsSubstring("cudaHostRegister"));
  c.allow_unpinned = true;
  {
    PinnedHostPool pool(c);
    CHECK_FALSE(pool.report().pinned);
    CHECK(pool.report().registrations == 0);  // the first chunk was unregistered again
  }
  ::unsetenv("KVOFFLOAD_FAULT_REGISTER_CHUNK");
  c.allow_unpinned = false;
  CHECK(PinnedHostPool(c).report().pinned);
}

}  // namespace

TEST_CASE("Pool blocks are distinct, aligned, inside the region and hold their bytes", "[pool]") {
  for (const HugePages huge : {HugePages::off, HugePages::prefer}) {
    PoolConfig c = small(96, 3 * 4096 + 256);
    c.huge_pages = huge;
    c.prefault_threads = 3;
    PinnedHostPool pool(c);
    REQUIRE(pool.num_blocks() == 96);
    if (huge == HugePages::off) CHECK(pool.report().fault_threads == 3);
    if (pool.report().huge_pages) {
      CHECK(reinterpret_cast<std::uintptr_t>(pool.data()) % (2 << 20) == 0);
    }
    std::set<std::byte*> seen;
    for (HostBlockId id = 0; id < pool.num_blocks(); ++id) {
      std::byte* b = pool.block(id);
      CHECK(reinterpret_cast<std::uintptr_t>(b) % 256 == 0);
      CHECK(b >= pool.data());
      CHECK(b + pool.block_bytes() <= pool.data() + pool.size_bytes());
      CHECK(seen.insert(b).second);
      for (std::size_t i = 0; i < pool.block_bytes(); ++i) {
        b[i] = static_cast<std::byte>((static_cast<std::size_t>(id) * 131 + i) & 0xff);
      }
    }
    for (HostBlockId id = 0; id < pool.num_blocks(); ++id) {
      const std::byte* b = pool.block(id);
      bool same = true;
      for (std::size_t i = 0; i < pool.block_bytes(); ++i) {
        same =
            same && b[i] == static_cast<std::byte>((static_cast<std::size_t>(id) * 131 + i) & 0xff);
      }
      CHECK(same);
    }
  }
}

TEST_CASE("Rows split each block among tensor-parallel workers", "[pool]") {
  PoolConfig c = small(4, 4 * 1024);
  c.num_rows = 4;
  PinnedHostPool pool(c);
  CHECK(pool.row_bytes() == 1024);
  CHECK(pool.row(2, 3) == pool.block(2) + 3 * 1024);
  CHECK(pool.row(3, 0) == pool.block(3));
}

TEST_CASE("A pool sized by bytes holds the whole blocks that fit", "[pool]") {
  PoolConfig c = small(0, 1 << 20);
  c.host_bytes = parse_bytes("10MiB", "host_bytes") + 12345;
  PinnedHostPool pool(c);
  CHECK(pool.num_blocks() == 10);
}

TEST_CASE("A pool over 4 GiB allocates and is usable at both ends", "[pool][large]") {
  PoolConfig c = small(0, 2 << 20);
  c.host_bytes = parse_bytes("4GiB", "host_bytes") + (64 << 20);
  PinnedHostPool pool(c);
  REQUIRE(pool.num_blocks() == 2080);
  CHECK(pool.size_bytes() > (std::size_t{4} << 30));
  const auto last = static_cast<HostBlockId>(pool.num_blocks() - 1);
  std::memset(pool.block(last), 0x5a, pool.block_bytes());
  CHECK(static_cast<unsigned char>(pool.block(last)[pool.block_bytes() - 1]) == 0x5a);
  CHECK(static_cast<unsigned char>(pool.block(0)[0]) == 0);
}

TEST_CASE("Without a CUDA device the pool is plain memory; requiring pinning fails", "[pool]") {
  if (cuda_device_count() > 0) SKIP("a CUDA device is present: see the [gpu] pool test");
  PoolConfig c = small(4, 4096);
  c.pinning = Pinning::automatic;
  CHECK_FALSE(PinnedHostPool(c).report().pinned);
  c.pinning = Pinning::require;
  CHECK_THROWS_AS(PinnedHostPool(c), unsupported);
  CHECK_THROWS_WITH(PinnedHostPool(c), ContainsSubstring("pinning"));
  // A failed registration with allow_unpinned falls back to plain memory that still works.
  c.allow_unpinned = true;
  PinnedHostPool pool(c);
  CHECK_FALSE(pool.report().pinned);
  std::memset(pool.block(3), 0x5a, pool.block_bytes());
  CHECK(static_cast<unsigned char>(pool.block(3)[pool.block_bytes() - 1]) == 0x5a);
}

TEST_CASE("A pool is registered through the simulated device in block-aligned chunks",
          "[pool][sim]") {
  auto sim = std::make_shared<SimDevice>();
  registers_in_block_aligned_chunks(sim);
  CHECK(sim->live_registrations() == 0);  // every chunk unregistered by the destructor
  CHECK(sim->violations().empty());
}

TEST_CASE("A [gpu] pool is registered with CUDA in block-aligned chunks", "[gpu][pool]") {
  if (cuda_device_count() == 0) SKIP("no CUDA device");
  registers_in_block_aligned_chunks(cuda_runtime());
}

TEST_CASE("A registration that fails partway on the simulated device unwinds, or falls back",
          "[pool][faults][sim]") {
  auto sim = std::make_shared<SimDevice>();
  unwinds_a_failed_registration(sim);
  CHECK(sim->live_registrations() == 0);
  // The device's own refusal, not the test hook: the third registration fails.
  PoolConfig c = small(8, 1 << 20);
  c.pinning = Pinning::require;
  c.runtime = sim;
  c.register_chunk_bytes = 2 << 20;
  sim->inject_failure("host_register", dev::memory_allocation, 2);
  CHECK_THROWS_WITH(PinnedHostPool(c), ContainsSubstring("at offset 4.00 MiB"));
  CHECK(sim->live_registrations() == 0);
  // The error path itself failing (formatting the message runs out of memory) still leaves
  // nothing registered.
  sim->inject_failure("host_register", dev::memory_allocation, 1);
  sim->inject_throw_in_describe();
  CHECK_THROWS_AS(PinnedHostPool(c), std::bad_alloc);
  CHECK(sim->live_registrations() == 0);
  CHECK(sim->violations().empty());
}

TEST_CASE("A [gpu] registration that fails partway unwinds, or falls back when allowed",
          "[gpu][pool][faults]") {
  if (cuda_device_count() == 0) SKIP("no CUDA device");
  unwinds_a_failed_registration(cuda_runtime());
}

TEST_CASE("Bad pool configurations name the field", "[pool]") {
  auto rejects = [](PoolConfig c, const std::string& field) {
    CHECK_THROWS_AS(PinnedHostPool(c), invalid_argument);
    CHECK_THROWS_WITH(PinnedHostPool(c), ContainsSubstring(field));
  };
  PoolConfig budget = small(0, 1 << 20);
  budget.host_bytes = 1000;
  rejects(budget, "host_bytes");
  rejects(small(0, 4096), "host_blocks");  // neither a count nor a budget
  rejects(small(-3, 4096), "host_blocks");
  rejects(small(4, 4096 + 100), "block_bytes");  // not a multiple of 256
  rejects(small(4, 0), "block_bytes");
  PoolConfig rows = small(4, 1024);
  rows.num_rows = 3;
  rejects(rows, "rows");
  PoolConfig align = small(4, 4096);
  align.alignment = 100;
  rejects(align, "alignment");
  PoolConfig both = small(4, 4096);
  both.host_bytes = 1 << 20;
  rejects(both, "host_bytes");
}
