#include "kvoffload/tiers/disk_slots.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>

// Header-only XXH3 (Debian's libxxhash-dev): nothing to load at run time.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/expects.hpp"
#include "common/logging.hpp"

namespace kvoffload {
namespace {

static_assert(std::endian::native == std::endian::little, "the slot format is little-endian");

constexpr std::uint64_t kHeaderBytes = 4096;
constexpr std::uint64_t kAlign = 4096;
constexpr char kMagic[8] = {'K', 'V', 'O', 'F', 'S', 'L', 'T', '1'};
// Version 3 added the weights' epoch; version 2 added valid_from (SEMANTICS 6.8). Slots of
// older versions are refused as invalid: version 1 predates the written-sub-block rule, and
// neither says which weights wrote it.
constexpr std::uint32_t kVersion = 3;

// Field offsets in the header. valid_from is the block's first written sub-block; only whole
// blocks go below host memory, so a slot whose valid_from is not 0 is invalid. epoch is the
// weights' epoch (TierJob::epoch) the block was written under.
constexpr std::size_t kOffVersion = 8, kOffKeySize = 12, kOffKey = 16, kOffGroup = 48,
                      kOffValidFrom = 52, kOffDigest = 56, kOffLength = 64, kOffPayloadSum = 72,
                      kOffEpoch = 80, kOffHeaderSum = 88, kHeaderFields = 96;

template <class T>
void put(std::uint8_t* p, std::size_t at, T v) {
  std::memcpy(p + at, &v, sizeof v);
}
template <class T>
T get(const std::uint8_t* p, std::size_t at) {
  T v;
  std::memcpy(&v, p + at, sizeof v);
  return v;
}

std::uint64_t round_up(std::uint64_t n, std::uint64_t a) {
  return (n + a - 1) / a * a;
}

/// A slot-sized, 4 KiB-aligned buffer per thread (O_DIRECT needs the alignment), grown as
/// needed and kept for the thread's life.
std::uint8_t* slot_buffer(std::uint64_t bytes) {
  struct Buffer {
    std::uint8_t* p = nullptr;
    std::uint64_t size = 0;
    ~Buffer() { std::free(p); }
  };
  thread_local Buffer buffer;
  if (buffer.size < bytes) {
    std::free(buffer.p);
    buffer.p = static_cast<std::uint8_t*>(std::aligned_alloc(4096, bytes));
    if (buffer.p == nullptr) throw std::bad_alloc();
    buffer.size = bytes;
  }
  return buffer.p;
}

std::string hex16(std::uint64_t v) {
  return fmt::format("{:016x}", v);
}

/// pread/pwrite all of `n` bytes; false on an error or end of file (errno kept, 0 at EOF).
bool full_pread(int fd, std::uint8_t* p, std::size_t n, off_t at) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, at);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      if (got == 0) errno = 0;
      return false;
    }
    p += got;
    n -= static_cast<std::size_t>(got);
    at += got;
  }
  return true;
}

bool full_pwrite(int fd, const std::uint8_t* p, std::size_t n, off_t at) {
  while (n > 0) {
    const ssize_t put_n = ::pwrite(fd, p, n, at);
    if (put_n < 0 && errno == EINTR) continue;
    if (put_n <= 0) return false;
    p += put_n;
    n -= static_cast<std::size_t>(put_n);
    at += put_n;
  }
  return true;
}

enum class HeaderState { empty, invalid, other_epoch, valid };

/// Decodes a header; `key` is set when valid. A well-formed header of another epoch is
/// other_epoch: a block of other weights, never found.
HeaderState decode(const std::uint8_t* h, std::uint64_t digest, std::uint64_t epoch,
                   std::uint64_t payload_bytes, Key& key) {
  bool zero = true;
  for (std::size_t i = 0; i < kHeaderFields && zero; ++i) zero = h[i] == 0;
  if (zero) return HeaderState::empty;
  if (std::memcmp(h, kMagic, sizeof kMagic) != 0) return HeaderState::invalid;
  if (get<std::uint64_t>(h, kOffHeaderSum) != XXH3_64bits(h, kOffHeaderSum))
    return HeaderState::invalid;
  const auto size = get<std::uint32_t>(h, kOffKeySize);
  if (get<std::uint32_t>(h, kOffVersion) != kVersion || size < 1 || size > BlockHash::max_size ||
      get<std::uint32_t>(h, kOffValidFrom) != 0 || get<std::uint64_t>(h, kOffDigest) != digest ||
      get<std::uint64_t>(h, kOffLength) != payload_bytes) {
    return HeaderState::invalid;
  }
  if (get<std::uint64_t>(h, kOffEpoch) != epoch) return HeaderState::other_epoch;
  key = Key{BlockHash::from_bytes(std::span(h + kOffKey, size)), get<std::uint32_t>(h, kOffGroup)};
  return HeaderState::valid;
}

}  // namespace

std::uint64_t disk_checksum(std::span<const std::uint8_t> bytes) noexcept {
  return XXH3_64bits(bytes.data(), bytes.size());
}

DiskSlots::DiskSlots(const DiskSlotsConfig& config) : config_(config) {
  KVOFFLOAD_EXPECTS(!config.directory.empty(), "disk tier: directory is empty");
  KVOFFLOAD_EXPECTS(config.payload_bytes > 0, "disk tier: payload_bytes must be positive");
  KVOFFLOAD_EXPECTS(config.slots_per_file > 0, "disk tier: slots_per_file must be positive");
  slot_bytes_ = kHeaderBytes + round_up(config.payload_bytes, kAlign);
  KVOFFLOAD_EXPECTS(config.capacity_bytes >= slot_bytes_,
                    "disk tier: capacity_bytes {} is less than one slot ({} bytes)",
                    config.capacity_bytes, slot_bytes_);
  num_slots_ = static_cast<std::int64_t>(config.capacity_bytes / slot_bytes_);
  layout_dir_ = (std::filesystem::path(config.directory) / hex16(config.layout_digest)).string();
  std::error_code ec;
  std::filesystem::create_directories(layout_dir_, ec);
  if (ec) {
    throw io_error(fmt::format("disk tier: cannot create {}: {}", layout_dir_, ec.message()));
  }
  const auto per_file = static_cast<std::int64_t>(config.slots_per_file);
  const std::int64_t files = (num_slots_ + per_file - 1) / per_file;
  for (std::int64_t f = 0; f < files; ++f) {
    const std::string path = fmt::format("{}/slab-{}.kvo", layout_dir_, f);
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      const int err = errno;
      for (std::size_t i = 0; i < fds_.size(); ++i) {
        if (direct_fds_[i] != fds_[i]) ::close(direct_fds_[i]);
        ::close(fds_[i]);
      }
      throw io_error(fmt::format("disk tier: cannot open {}: {}", path, std::strerror(err)));
    }
    fds_.push_back(fd);
    int direct_fd = -1;
    if (config.direct_io) {
      direct_fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_DIRECT);
      if (direct_fd < 0 && f == 0) {
        detail::logger().info("disk tier: {} does not support O_DIRECT ({}): buffered I/O",
                              layout_dir_, std::strerror(errno));
      }
    }
    direct_fds_.push_back(direct_fd >= 0 ? direct_fd : fd);
    if (f == 0) direct_ = direct_fd >= 0;
    // Sparse: space is taken as slots are written, so a full disk fails a write (ENOSPC,
    // counted), never the open. A file someone truncated grows back with empty slots.
    const std::int64_t slots = std::min(per_file, num_slots_ - f * per_file);
    const auto want = static_cast<off_t>(static_cast<std::uint64_t>(slots) * slot_bytes_);
    struct stat st {};
    if (::fstat(fd, &st) == 0 && st.st_size < want && ::ftruncate(fd, want) != 0) {
      detail::logger().warn("disk tier: cannot size {}: {}", path, std::strerror(errno));
    }
  }
  scan();
}

DiskSlots::~DiskSlots() {
  for (std::size_t i = 0; i < fds_.size(); ++i) {
    if (direct_fds_[i] != fds_[i]) ::close(direct_fds_[i]);
    ::close(fds_[i]);
  }
}

DiskSlotsStats DiskSlots::stats() const noexcept {
  return DiskSlotsStats{writes_.load(), write_errors_.load(), reads_.load(), read_misses_.load()};
}

std::pair<int, std::uint64_t> DiskSlots::locate(std::int64_t slot) const {
  KVOFFLOAD_EXPECTS(slot >= 0 && slot < num_slots_, "disk tier: slot {} is outside 0..{}", slot,
                    num_slots_ - 1);
  const auto per_file = static_cast<std::int64_t>(config_.slots_per_file);
  return {direct_fds_[static_cast<std::size_t>(slot / per_file)],
          static_cast<std::uint64_t>(slot % per_file) * slot_bytes_};
}

void DiskSlots::scan() {
  const auto start = std::chrono::steady_clock::now();
  scanned_.assign(static_cast<std::size_t>(num_slots_), std::nullopt);
  std::uint8_t* const buffer = slot_buffer(slot_bytes_);
  const auto per_file = static_cast<std::int64_t>(config_.slots_per_file);
  for (std::int64_t s = 0; s < num_slots_; ++s) {
    const int fd = fds_[static_cast<std::size_t>(s / per_file)];
    const std::uint64_t at = static_cast<std::uint64_t>(s % per_file) * slot_bytes_;
    const std::size_t n = config_.verify_payloads_on_scan ? slot_bytes_ : kHeaderBytes;
    Key key;
    if (!full_pread(fd, buffer, n, static_cast<off_t>(at))) {
      ++scan_.empty;  // past the end of a truncated file
      continue;
    }
    switch (decode(buffer, config_.layout_digest, config_.epoch, config_.payload_bytes, key)) {
      case HeaderState::empty: ++scan_.empty; break;
      case HeaderState::invalid: ++scan_.invalid; break;
      case HeaderState::other_epoch: ++scan_.other_epoch; break;
      case HeaderState::valid:
        if (config_.verify_payloads_on_scan &&
            XXH3_64bits(buffer + kHeaderBytes, config_.payload_bytes) !=
                get<std::uint64_t>(buffer, kOffPayloadSum)) {
          ++scan_.invalid;
          break;
        }
        scanned_[static_cast<std::size_t>(s)] = key;
        ++scan_.valid;
        break;
    }
  }
  scan_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  detail::logger().info(
      "disk tier: {} holds {} valid, {} invalid, {} other weights' and {} empty slots "
      "(scanned in {:.3f} s); slot I/O {}",
      layout_dir_, scan_.valid, scan_.invalid, scan_.other_epoch, scan_.empty, scan_.seconds,
      direct_ ? "O_DIRECT" : "buffered");
}

void DiskSlots::clear() {
  const auto per_file = static_cast<std::int64_t>(config_.slots_per_file);
  for (std::size_t f = 0; f < fds_.size(); ++f) {
    const std::int64_t slots =
        std::min(per_file, num_slots_ - static_cast<std::int64_t>(f) * per_file);
    const auto size = static_cast<off_t>(static_cast<std::uint64_t>(slots) * slot_bytes_);
    if (::ftruncate(fds_[f], 0) != 0 || ::ftruncate(fds_[f], size) != 0) {
      throw io_error(fmt::format("disk tier: cannot empty {}/slab-{}.kvo: {}", layout_dir_, f,
                                 std::strerror(errno)));
    }
  }
  scanned_.assign(scanned_.size(), std::nullopt);
  detail::logger().info("disk tier: {} emptied ({} slots)", layout_dir_, num_slots_);
}

SlotIo DiskSlots::prepare_write(std::int64_t slot, const Key& key, std::uint64_t epoch,
                                std::span<const std::uint8_t> payload, std::uint8_t* h) {
  KVOFFLOAD_EXPECTS(payload.size() == config_.payload_bytes,
                    "disk tier: a payload of {} bytes, slots hold {}", payload.size(),
                    config_.payload_bytes);
  const auto [fd, at] = locate(slot);
  std::memset(h, 0, kHeaderBytes);
  std::memcpy(h, kMagic, sizeof kMagic);
  put<std::uint32_t>(h, kOffVersion, kVersion);
  put<std::uint32_t>(h, kOffKeySize, static_cast<std::uint32_t>(key.hash.size()));
  std::memcpy(h + kOffKey, key.hash.data(), key.hash.size());
  put<std::uint32_t>(h, kOffGroup, key.group);
  put<std::uint32_t>(h, kOffValidFrom, 0);  // whole blocks only (the scheduler's rule)
  put<std::uint64_t>(h, kOffDigest, config_.layout_digest);
  put<std::uint64_t>(h, kOffLength, config_.payload_bytes);
  put<std::uint64_t>(h, kOffPayloadSum, XXH3_64bits(payload.data(), payload.size()));
  put<std::uint64_t>(h, kOffEpoch, epoch);
  put<std::uint64_t>(h, kOffHeaderSum, XXH3_64bits(h, kOffHeaderSum));
  std::memcpy(h + kHeaderBytes, payload.data(), payload.size());
  std::memset(h + kHeaderBytes + payload.size(), 0, slot_bytes_ - kHeaderBytes - payload.size());
  ++writes_;
  return SlotIo{fd, at, slot_bytes_};
}

void DiskSlots::write_failed(std::int64_t slot, int err) {
  ++write_errors_;
  detail::logger().warn("disk tier: writing slot {} of {} failed: {}", slot, layout_dir_,
                        std::strerror(err));
  // A partly written slot must not read back as valid: drop its header if we can.
  (void)erase(slot);
}

SlotIo DiskSlots::prepare_read(std::int64_t slot) {
  const auto [fd, at] = locate(slot);
  ++reads_;
  return SlotIo{fd, at, slot_bytes_};
}

bool DiskSlots::finish_read(const std::uint8_t* buffer, bool read_ok, const Key& key,
                            std::uint64_t epoch, std::span<std::uint8_t> out) {
  KVOFFLOAD_EXPECTS(out.size() == config_.payload_bytes,
                    "disk tier: a buffer of {} bytes, slots hold {}", out.size(),
                    config_.payload_bytes);
  Key found;
  const bool ok = read_ok &&
                  decode(buffer, config_.layout_digest, epoch, config_.payload_bytes, found) ==
                      HeaderState::valid &&
                  found == key &&
                  XXH3_64bits(buffer + kHeaderBytes, config_.payload_bytes) ==
                      get<std::uint64_t>(buffer, kOffPayloadSum);
  if (!ok) {
    ++read_misses_;
    return false;
  }
  std::memcpy(out.data(), buffer + kHeaderBytes, out.size());
  return true;
}

bool DiskSlots::write(std::int64_t slot, const Key& key, std::uint64_t epoch,
                      std::span<const std::uint8_t> payload) {
  std::uint8_t* const buffer = slot_buffer(slot_bytes_);
  const SlotIo io = prepare_write(slot, key, epoch, payload, buffer);
  if (!full_pwrite(io.fd, buffer, io.bytes, static_cast<off_t>(io.offset))) {
    write_failed(slot, errno == 0 ? EIO : errno);
    return false;
  }
  return true;
}

bool DiskSlots::read(std::int64_t slot, const Key& key, std::uint64_t epoch,
                     std::span<std::uint8_t> out) {
  KVOFFLOAD_EXPECTS(out.size() == config_.payload_bytes,
                    "disk tier: a buffer of {} bytes, slots hold {}", out.size(),
                    config_.payload_bytes);
  const SlotIo io = prepare_read(slot);
  std::uint8_t* const buffer = slot_buffer(slot_bytes_);
  const bool read_ok = full_pread(io.fd, buffer, io.bytes, static_cast<off_t>(io.offset));
  return finish_read(buffer, read_ok, key, epoch, out);
}

bool DiskSlots::erase(std::int64_t slot) {
  const auto [fd, at] = locate(slot);
  std::uint8_t* const buffer = slot_buffer(slot_bytes_);
  std::memset(buffer, 0, kHeaderBytes);
  return full_pwrite(fd, buffer, kHeaderBytes, static_cast<off_t>(at));
}

}  // namespace kvoffload
