#include "kvoffload/pinned_host_pool.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/expects.hpp"
#include "common/logging.hpp"
#include "kvoffload/device.hpp"
#include "kvoffload/device_runtime.hpp"

namespace kvoffload {
namespace {

constexpr std::size_t kHugePage = std::size_t{2} << 20;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::size_t round_up(std::size_t value, std::size_t to) {
  return (value + to - 1) / to * to;
}

}  // namespace

PinnedHostPool::PinnedHostPool(const PoolConfig& config) {
  KVOFFLOAD_EXPECTS(
      config.alignment >= 64 && std::has_single_bit(static_cast<std::uint64_t>(config.alignment)),
      "alignment must be a power of two of at least 64, got {}", config.alignment);
  KVOFFLOAD_EXPECTS(config.block_bytes > 0, "block_bytes must be positive, got {}",
                    config.block_bytes);
  KVOFFLOAD_EXPECTS(config.block_bytes % config.alignment == 0,
                    "block_bytes {} is not a multiple of the alignment {}", config.block_bytes,
                    config.alignment);
  KVOFFLOAD_EXPECTS(config.num_rows >= 1, "num_rows must be at least 1, got {}", config.num_rows);
  KVOFFLOAD_EXPECTS(config.block_bytes % (config.num_rows * config.alignment) == 0,
                    "block_bytes {} does not split into {} rows that are multiples of the "
                    "alignment {}",
                    config.block_bytes, config.num_rows, config.alignment);
  KVOFFLOAD_EXPECTS((config.host_blocks > 0) != (config.host_bytes > 0),
                    "give exactly one of host_blocks ({}) and host_bytes ({})", config.host_blocks,
                    config.host_bytes);
  KVOFFLOAD_EXPECTS(config.prefault_threads >= 0, "prefault_threads must not be negative, got {}",
                    config.prefault_threads);
  block_bytes_ = static_cast<std::size_t>(config.block_bytes);
  num_rows_ = config.num_rows;
  row_bytes_ = block_bytes_ / static_cast<std::size_t>(num_rows_);
  if (config.host_bytes > 0) {
    KVOFFLOAD_EXPECTS(config.host_bytes >= block_bytes_,
                      "host_bytes {} is smaller than one block ({} bytes)", config.host_bytes,
                      block_bytes_);
    num_blocks_ = static_cast<std::int64_t>(config.host_bytes / block_bytes_);
  } else {
    num_blocks_ = config.host_blocks;
  }
  KVOFFLOAD_EXPECTS(num_blocks_ <= (std::int64_t{1} << 31) - 2,
                    "host_blocks {} is too many (at most 2^31 - 2)", num_blocks_);

  map_region(config);
  try {
    const unsigned cores = std::max(1U, std::thread::hardware_concurrency());
    prefault(config.prefault_threads > 0 ? config.prefault_threads : static_cast<int>(cores));
    register_region(config);
  } catch (...) {
    release();
    throw;
  }
  detail::logger().info(
      "host pool: {} blocks of {} ({}), {} pages, faulted by {} threads in {:.2f} s, {}",
      num_blocks_, format_bytes(block_bytes_), format_bytes(size_bytes()),
      report_.huge_pages ? (report_.hugetlb ? "2 MiB hugetlb" : "2 MiB transparent") : "4 KiB",
      report_.fault_threads, report_.fault_seconds,
      report_.pinned ? fmt::format("pinned in {} registrations", report_.registrations)
                     : std::string("not pinned"));
}

PinnedHostPool::~PinnedHostPool() {
  release();
}

void PinnedHostPool::map_region(const PoolConfig& config) {
  const auto start = std::chrono::steady_clock::now();
  const std::size_t bytes = size_bytes();
  if (config.huge_pages != HugePages::off) {
    // hugetlb pages, if the administrator reserved enough of them.
    const std::size_t want = round_up(bytes, kHugePage);
    void* p = mmap(nullptr, want, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | (21 << MAP_HUGE_SHIFT), -1, 0);
    if (p != MAP_FAILED) {
      mapping_ = base_ = static_cast<std::byte*>(p);
      mapping_bytes_ = want;
      report_.huge_pages = report_.hugetlb = true;
    } else {
      KVOFFLOAD_EXPECTS(config.huge_pages != HugePages::require,
                        "huge_pages: 2 MiB hugetlb pages were required but mmap failed ({}); "
                        "reserve them in /proc/sys/vm/nr_hugepages",
                        std::strerror(errno));
    }
  }
  if (base_ == nullptr) {
    // Plain pages; with huge pages wanted, a 2 MiB-aligned start and transparent huge pages.
    const bool thp = config.huge_pages == HugePages::prefer;
    const std::size_t slack = thp ? kHugePage : 0;
    const std::size_t want = round_up(bytes, thp ? kHugePage : 4096) + slack;
    void* p = mmap(nullptr, want, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      throw out_of_memory(
          fmt::format("host pool: cannot map {} ({})", format_bytes(want), std::strerror(errno)));
    }
    mapping_ = static_cast<std::byte*>(p);
    mapping_bytes_ = want;
    base_ = mapping_;
    if (thp) {
      const auto addr = reinterpret_cast<std::uintptr_t>(mapping_);
      base_ = mapping_ + (round_up(addr, kHugePage) - addr);
      report_.huge_pages = madvise(base_, round_up(bytes, kHugePage), MADV_HUGEPAGE) == 0;
    }
  }
  report_.map_seconds = seconds_since(start);
}

void PinnedHostPool::prefault(int threads) {
  // First touch in parallel: the kernel zeroes pages as they are faulted in, which is what
  // makes single-threaded allocation of a large pool slow. Each thread owns a contiguous
  // range, so on NUMA machines its pages land on its node.
  const auto start = std::chrono::steady_clock::now();
  const std::size_t page = report_.huge_pages ? kHugePage : 4096;
  const std::size_t pages = (size_bytes() + page - 1) / page;
  const auto n = static_cast<std::size_t>(std::clamp<std::size_t>(
      static_cast<std::size_t>(threads), 1, std::max<std::size_t>(1, pages)));
  auto touch = [this, page, pages, n](std::size_t t) {
    const std::size_t first = pages * t / n, last = pages * (t + 1) / n;
    for (std::size_t i = first; i < last; ++i) {
      *reinterpret_cast<volatile unsigned char*>(base_ + i * page) = 0;
    }
  };
  std::vector<std::thread> workers;
  workers.reserve(n - 1);
  for (std::size_t t = 1; t < n; ++t) workers.emplace_back(touch, t);
  touch(0);
  for (std::thread& w : workers) w.join();
  report_.fault_threads = static_cast<int>(n);
  report_.fault_seconds = seconds_since(start);
}

namespace {
/// `device`'s primary context pushed for a scope (nothing for -1, the current device).
class DeviceContext {
 public:
  DeviceContext(DeviceRuntime& runtime, int device) : runtime_(runtime), device_(device) {
    if (device >= 0) status_ = runtime_.push_device(device);
  }
  ~DeviceContext() {
    if (device_ >= 0 && status_ == 0) (void)runtime_.pop_device();
  }
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;
  [[nodiscard]] int status() const noexcept { return status_; }

 private:
  DeviceRuntime& runtime_;
  int device_;
  int status_ = 0;
};
}  // namespace

void PinnedHostPool::register_region(const PoolConfig& config) {
  if (config.pinning == Pinning::off) return;
  device_ = config.device;
  std::shared_ptr<DeviceRuntime> runtime = config.runtime;
  if (runtime == nullptr && cuda_device_count() > 0) runtime = cuda_runtime();
  if (runtime == nullptr || runtime->device_count() == 0) {
    if (config.pinning == Pinning::require) {
      const std::string what = fmt::format("pinning: registration was required but {}",
                                           built_with_cuda() || config.runtime != nullptr
                                               ? "no CUDA device is visible"
                                               : "this build has no CUDA support");
      if (!config.allow_unpinned) throw unsupported(what);
      detail::logger().error("{}; continuing with UNPINNED memory (allow_unpinned)", what);
    }
    return;  // plain memory: the HostBackend and every CPU path work on it
  }
  const auto start = std::chrono::steady_clock::now();
  const DeviceContext context(*runtime, config.device);
  if (context.status() != 0) {
    const std::string what = fmt::format("host pool: making device {} current failed: {}",
                                         config.device, runtime->describe(context.status()));
    if (!config.allow_unpinned) throw cuda_error(what);
    detail::logger().error("{}; continuing with UNPINNED memory (allow_unpinned)", what);
    return;
  }
  // Whole blocks per registration: a block never straddles two.
  const std::size_t blocks_per_chunk = std::max<std::size_t>(
      1, static_cast<std::size_t>(config.register_chunk_bytes) / block_bytes_);
  const std::size_t chunk = blocks_per_chunk * block_bytes_;
  // Fault injection for tests on a real GPU: KVOFFLOAD_FAULT_REGISTER_CHUNK=k fails the k-th
  // registration (from 0), after the earlier ones succeeded, to exercise the unwinding below.
  // (A simulated device injects its own: SimDevice::inject_failure("host_register", ...).)
  const char* inject = std::getenv("KVOFFLOAD_FAULT_REGISTER_CHUNK");
  const long fail_chunk = inject != nullptr ? std::strtol(inject, nullptr, 10) : -1L;
  // Who registered what is known before the first registration: whatever throws from here
  // on, release() (the constructor's unwinding, or the destructor) unregisters it.
  registered_.reserve((size_bytes() + chunk - 1) / chunk);
  runtime_ = runtime;
  for (std::size_t offset = 0; offset < size_bytes(); offset += chunk) {
    const std::size_t len = std::min(chunk, size_bytes() - offset);
    const int err = static_cast<long>(registered_.size()) == fail_chunk
                        ? dev::memory_allocation
                        : runtime->host_register(base_ + offset, len);
    if (err == dev::ok) {
      registered_.emplace_back(base_ + offset, len);
      continue;
    }
    // Unwound first: formatting the message may throw.
    for (const auto& [ptr, n] : registered_) (void)runtime->host_unregister(ptr);
    registered_.clear();
    runtime_.reset();
    const std::string what =
        fmt::format("host pool: cudaHostRegister of {} at offset {} failed: {}", format_bytes(len),
                    format_bytes(offset), runtime->describe(err));
    if (!config.allow_unpinned) throw cuda_error(what);
    detail::logger().error(
        "{}; continuing with UNPINNED memory (allow_unpinned): copies will "
        "run at pageable-memory speed",
        what);
    return;
  }
  report_.pinned = true;
  report_.registrations = registered_.size();
  blocks_per_registration_ = static_cast<std::int64_t>(blocks_per_chunk);
  report_.register_seconds = seconds_since(start);
}

void PinnedHostPool::release() noexcept {
  if (!registered_.empty() && runtime_ != nullptr) {
    const DeviceContext context(*runtime_, device_);
    for (const auto& [ptr, n] : registered_) (void)runtime_->host_unregister(ptr);
  }
  registered_.clear();
  runtime_.reset();
  if (mapping_ != nullptr) munmap(mapping_, mapping_bytes_);
  mapping_ = base_ = nullptr;
  mapping_bytes_ = 0;
}

}  // namespace kvoffload
