#include "kvoffload/tiers/disk_slots.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <optional>
#include <thread>
#include <utility>

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

namespace {

constexpr char kLockName[] = "kvoffload.lock";

/// A file descriptor closed when it goes out of scope.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

std::string errno_text(int err) {
  if (err == ELOOP) return "it is a symbolic link (refused)";
  if (err == EPERM) {
    return "it belongs to another user (refused: its slots could be planted; remove it)";
  }
  return std::strerror(err);
}

/// Throws io_error unless the directory `fd` (at `path`) belongs to this process's user and
/// no one else may write in it: otherwise another local user could plant slab files (with
/// checksums recomputed) or swap a layout directory, and a hit would serve their bytes.
void check_private_directory(int fd, const std::string& path, std::string_view what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    throw io_error(
        fmt::format("disk tier: cannot stat {} {}: {}", what, path, std::strerror(errno)));
  }
  if (st.st_uid != ::geteuid()) {
    throw io_error(fmt::format(
        "disk tier: {} {} belongs to uid {}, not to this process's user (uid {}): another user "
        "could plant slots in it; give the tier a directory of its own (created 0700 if missing)",
        what, path, st.st_uid, ::geteuid()));
  }
  if ((st.st_mode & 022) != 0) {
    throw io_error(fmt::format(
        "disk tier: {} {} is writable by others (mode {:04o}): another user could plant slots "
        "in it; make it 0700 or give the tier a private directory",
        what, path, st.st_mode & 07777));
  }
}

/// `path` without trailing slashes (so that lstat looks at a link itself, not its target).
std::string strip_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

/// Throws io_error unless `path` is a directory that is not a symbolic link.
void check_directory(const std::string& path, std::string_view what) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    throw io_error(
        fmt::format("disk tier: cannot use {} {}: {}", what, path, std::strerror(errno)));
  }
  if (S_ISLNK(st.st_mode)) {
    throw io_error(
        fmt::format("disk tier: {} {} is a symbolic link; refused (the tier's files could be "
                    "redirected): give the tier the real directory",
                    what, path));
  }
  if (!S_ISDIR(st.st_mode)) {
    throw io_error(fmt::format("disk tier: {} {} is not a directory", what, path));
  }
}

/// Creates `path` and its missing parents, each 0700.
void make_directories(const std::string& path) {
  struct stat st {};
  if (path.empty() || ::lstat(path.c_str(), &st) == 0) return;
  const std::size_t slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0) make_directories(path.substr(0, slash));
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    throw io_error(fmt::format("disk tier: cannot create {}: {}", path, std::strerror(errno)));
  }
}

/// Opens (creating, 0600) the regular file `name` in `dir_fd`, never through a symbolic
/// link, and narrows a wider mode to 0600. -1 with errno set on failure (EINVAL: not a
/// regular file).
int open_private_file(int dir_fd, const char* name, int flags) {
  Fd fd(::openat(dir_fd, name, flags | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (fd.fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) return -1;
  if (!S_ISREG(st.st_mode)) {
    errno = EINVAL;
    return -1;
  }
  if (st.st_uid != ::geteuid()) {  // planted by another user: never read, never written
    errno = EPERM;
    return -1;
  }
  if ((st.st_mode & 0777) != 0600 && ::fchmod(fd.fd, 0600) != 0) return -1;
  return fd.release();
}

/// The n of a file named "slab-<n>.kvo", else nullopt.
std::optional<std::uint64_t> slab_index(std::string_view name) {
  constexpr std::string_view prefix = "slab-", suffix = ".kvo";
  if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) ||
      !name.ends_with(suffix)) {
    return std::nullopt;
  }
  const std::string_view digits =
      name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  std::uint64_t n = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return n;
}

/// A layout directory's name: exactly 16 lowercase hex digits.
bool is_layout_name(std::string_view name) {
  return name.size() == 16 && std::all_of(name.begin(), name.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

/// The names in the directory `dir_fd` (not . and ..); false if it cannot be listed.
bool list_directory(int dir_fd, std::vector<std::string>& names) {
  const int fd = ::dup(dir_fd);
  if (fd < 0) return false;
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    ::close(fd);
    return false;
  }
  ::rewinddir(d);
  while (const dirent* e = ::readdir(d)) {
    const std::string_view n = e->d_name;
    if (n != "." && n != "..") names.emplace_back(n);
  }
  ::closedir(d);
  return true;
}

}  // namespace

DiskSlots::DiskSlots(const DiskSlotsConfig& config) : config_(config) {
  KVOFFLOAD_EXPECTS(!config.directory.empty(), "disk tier: directory is empty");
  KVOFFLOAD_EXPECTS(config.payload_bytes > 0, "disk tier: payload_bytes must be positive");
  KVOFFLOAD_EXPECTS(config.slots_per_file > 0, "disk tier: slots_per_file must be positive");
  slot_bytes_ = kHeaderBytes + round_up(config.payload_bytes, kAlign);
  KVOFFLOAD_EXPECTS(config.capacity_bytes >= slot_bytes_,
                    "disk tier: capacity_bytes {} is less than one slot ({} bytes)",
                    config.capacity_bytes, slot_bytes_);
  num_slots_ = static_cast<std::int64_t>(config.capacity_bytes / slot_bytes_);
  const std::string root = strip_slashes(config.directory);
  layout_dir_ = fmt::format("{}/{}", root == "/" ? "" : root, hex16(config.layout_digest));
  try {
    // The root: created 0700 if missing (an existing one keeps its mode), never a link,
    // this user's, and writable by no one else.
    make_directories(root);
    check_directory(root, "directory");
    {
      const Fd root_fd(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (root_fd.fd < 0) {
        throw io_error(fmt::format("disk tier: cannot open {}: {}", root, errno_text(errno)));
      }
      check_private_directory(root_fd.fd, root, "directory");
    }
    // This layout's directory: 0700, never a link, locked by this object while it lives.
    if (::mkdir(layout_dir_.c_str(), 0700) != 0 && errno != EEXIST) {
      throw io_error(
          fmt::format("disk tier: cannot create {}: {}", layout_dir_, std::strerror(errno)));
    }
    check_directory(layout_dir_, "layout directory");
    const Fd dir_fd(::open(layout_dir_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (dir_fd.fd < 0) {
      throw io_error(fmt::format("disk tier: cannot open {}: {}", layout_dir_, errno_text(errno)));
    }
    struct stat st {};
    if (::fstat(dir_fd.fd, &st) == 0 && st.st_uid == ::geteuid() && (st.st_mode & 0777) != 0700) {
      (void)::fchmod(dir_fd.fd, 0700);  // ours: narrowed like the files
    }
    check_private_directory(dir_fd.fd, layout_dir_, "layout directory");
    lock_fd_ = open_private_file(dir_fd.fd, kLockName, O_RDWR);
    if (lock_fd_ < 0) {
      throw io_error(fmt::format("disk tier: cannot open {}/{}: {}", layout_dir_, kLockName,
                                 errno_text(errno)));
    }
    if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) {
        throw io_error(fmt::format(
            "disk tier: {} is in use by another process or DiskTier (it holds {}); two "
            "writers would overwrite each other's slots: give each engine its own path, and "
            "each tensor-parallel worker its own tp_rank",
            layout_dir_, kLockName));
      }
      throw io_error(fmt::format("disk tier: cannot lock {}/{}: {}", layout_dir_, kLockName,
                                 std::strerror(err)));
    }
    (void)::futimens(lock_fd_, nullptr);  // last used now (what the stale collector logs)
    remove_stale_layouts(root);
    open_files(dir_fd.fd);
    scan();
  } catch (...) {
    close_all();
    throw;
  }
}

void DiskSlots::open_files(int dir_fd) {
  const auto per_file = static_cast<std::int64_t>(config_.slots_per_file);
  const std::int64_t files = (num_slots_ + per_file - 1) / per_file;
  for (std::int64_t f = 0; f < files; ++f) {
    const std::string name = fmt::format("slab-{}.kvo", f);
    const std::string path = fmt::format("{}/{}", layout_dir_, name);
    const int fd = open_private_file(dir_fd, name.c_str(), O_RDWR);
    if (fd < 0) {
      throw io_error(fmt::format("disk tier: cannot open {}: {}", path, errno_text(errno)));
    }
    fds_.push_back(fd);
    int direct_fd = -1;
    if (config_.direct_io) {
      direct_fd = ::openat(dir_fd, name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_DIRECT);
      if (direct_fd < 0 && f == 0) {
        detail::logger().info("disk tier: {} does not support O_DIRECT ({}): buffered I/O",
                              layout_dir_, std::strerror(errno));
      }
    }
    direct_fds_.push_back(direct_fd >= 0 ? direct_fd : fd);
    if (f == 0) direct_ = direct_fd >= 0;
    // Sparse: space is taken as slots are written, so a full disk fails a write (ENOSPC,
    // counted), never the open. A file someone truncated grows back with empty slots; a
    // longer one (the capacity shrank) is cut to its slots, so the tier holds no more than
    // capacity_bytes.
    const std::int64_t slots = std::min(per_file, num_slots_ - f * per_file);
    const auto want = static_cast<off_t>(static_cast<std::uint64_t>(slots) * slot_bytes_);
    struct stat st {};
    if (::fstat(fd, &st) == 0 && st.st_size != want) {
      if (::ftruncate(fd, want) != 0) {
        if (st.st_size > want) {
          throw io_error(fmt::format("disk tier: cannot cut {} to its {} slots: {}", path, slots,
                                     std::strerror(errno)));
        }
        detail::logger().warn("disk tier: cannot size {}: {}", path, std::strerror(errno));
      } else if (st.st_size > want) {
        detail::logger().info("disk tier: {} cut from {} to {} bytes (capacity_bytes {})", path,
                              st.st_size, want, config_.capacity_bytes);
      }
    }
  }
  // Files past the capacity (it shrank since they were made) are removed.
  std::vector<std::string> names;
  if (!list_directory(dir_fd, names)) return;
  for (const std::string& name : names) {
    const std::optional<std::uint64_t> n = slab_index(name);
    if (!n || *n < static_cast<std::uint64_t>(files)) continue;
    if (::unlinkat(dir_fd, name.c_str(), 0) == 0) {
      detail::logger().info("disk tier: removed {}/{}: past capacity_bytes {} ({} slots)",
                            layout_dir_, name, config_.capacity_bytes, num_slots_);
    } else {
      throw io_error(fmt::format("disk tier: cannot remove {}/{} (past capacity_bytes {}): {}",
                                 layout_dir_, name, config_.capacity_bytes, std::strerror(errno)));
    }
  }
}

void DiskSlots::remove_stale_layouts(const std::string& root) {
  const Fd root_fd(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  std::vector<std::string> names;
  if (root_fd.fd < 0 || !list_directory(root_fd.fd, names)) {
    detail::logger().warn("disk tier: cannot list {} for stale layouts: {}", root,
                          std::strerror(errno));
    return;
  }
  const std::string own = hex16(config_.layout_digest);
  for (const std::string& name : names) {
    if (!is_layout_name(name) || name == own) continue;
    if (std::any_of(config_.keep_layouts.begin(), config_.keep_layouts.end(),
                    [&](std::uint64_t d) { return hex16(d) == name; })) {
      continue;
    }
    const std::string path = fmt::format("{}/{}", root == "/" ? "" : root, name);
    const Fd dir_fd(
        ::openat(root_fd.fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (dir_fd.fd < 0) continue;  // a link, a file, gone: not ours to remove
    // Only a directory of nothing but slab files and its lock (regular files, no links), and
    // only while no live DiskSlots holds that lock; checked again once locked.
    std::vector<std::string> files;
    std::uint64_t bytes = 0;
    const auto only_ours = [&] {
      files.clear();
      bytes = 0;
      if (!list_directory(dir_fd.fd, files)) return false;
      return std::all_of(files.begin(), files.end(), [&](const std::string& f) {
        struct stat st {};
        if (f != kLockName && !slab_index(f).has_value()) return false;
        if (::fstatat(dir_fd.fd, f.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
          return false;
        bytes += static_cast<std::uint64_t>(st.st_blocks) * 512;
        return true;
      });
    };
    if (!only_ours()) {
      detail::logger().info(
          "disk tier: {} is named like a layout directory but holds other files: kept", path);
      continue;
    }
    const Fd lock(::openat(dir_fd.fd, kLockName, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (lock.fd < 0) continue;
    if (::flock(lock.fd, LOCK_EX | LOCK_NB) != 0) {
      detail::logger().info("disk tier: {} (another layout) is in use: kept", path);
      continue;
    }
    if (!only_ours()) continue;
    bool removed = true;
    for (const std::string& f : files) {
      if (f != kLockName) removed = ::unlinkat(dir_fd.fd, f.c_str(), 0) == 0 && removed;
    }
    removed = removed && ::unlinkat(dir_fd.fd, kLockName, 0) == 0 &&
              ::unlinkat(root_fd.fd, name.c_str(), AT_REMOVEDIR) == 0;
    if (removed) {
      detail::logger().info(
          "disk tier: removed stale layout directory {} ({} bytes on disk): another layout, "
          "not in use (the root {} belongs to one engine)",
          path, bytes, root);
    } else {
      detail::logger().warn("disk tier: cannot remove stale layout directory {}: {}", path,
                            std::strerror(errno));
    }
  }
}

void DiskSlots::close_all() noexcept {
  for (std::size_t i = 0; i < fds_.size(); ++i) {
    if (direct_fds_[i] != fds_[i]) ::close(direct_fds_[i]);
    ::close(fds_[i]);
  }
  fds_.clear();
  direct_fds_.clear();
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the lock
  lock_fd_ = -1;
}

DiskSlots::~DiskSlots() {
  close_all();
}

DiskSlotsStats DiskSlots::stats() const noexcept {
  return DiskSlotsStats{writes_.load(),      write_errors_.load(), reads_.load(),
                        read_misses_.load(), read_errors_.load(),  read_corrupt_.load()};
}

std::pair<int, std::uint64_t> DiskSlots::locate(std::int64_t slot) const {
  KVOFFLOAD_EXPECTS(slot >= 0 && slot < num_slots_, "disk tier: slot {} is outside 0..{}", slot,
                    num_slots_ - 1);
  const auto per_file = static_cast<std::int64_t>(config_.slots_per_file);
  return {direct_fds_[static_cast<std::size_t>(slot / per_file)],
          static_cast<std::uint64_t>(slot % per_file) * slot_bytes_};
}

void DiskSlots::scan_slots(std::int64_t first, std::int64_t last, DiskScanReport& counts) {
  std::uint8_t* const buffer = slot_buffer(slot_bytes_);  // this thread's
  const auto per_file = static_cast<std::int64_t>(config_.slots_per_file);
  const std::size_t n = config_.verify_payloads_on_scan ? slot_bytes_ : kHeaderBytes;
  for (std::int64_t s = first; s < last; ++s) {
    const int fd = fds_[static_cast<std::size_t>(s / per_file)];
    const std::uint64_t at = static_cast<std::uint64_t>(s % per_file) * slot_bytes_;
    Key key;
    if (!full_pread(fd, buffer, n, static_cast<off_t>(at))) {
      ++counts.empty;  // past the end of a truncated file
      continue;
    }
    switch (decode(buffer, config_.layout_digest, config_.epoch, config_.payload_bytes, key)) {
      case HeaderState::empty: ++counts.empty; break;
      case HeaderState::invalid: ++counts.invalid; break;
      case HeaderState::other_epoch: ++counts.other_epoch; break;
      case HeaderState::valid:
        if (config_.verify_payloads_on_scan &&
            XXH3_64bits(buffer + kHeaderBytes, config_.payload_bytes) !=
                get<std::uint64_t>(buffer, kOffPayloadSum)) {
          ++counts.invalid;
          break;
        }
        scanned_[static_cast<std::size_t>(s)] = key;
        ++counts.valid;
        break;
    }
  }
}

void DiskSlots::scan() {
  // A restart reads one header per slot (4 KiB): at 1M slots 4 GiB. One pread at a time left
  // the device at queue depth 1 (issue 51: about 100 MB/s on a virtual disk); several threads
  // over contiguous ranges keep that many reads in flight. Each writes only its own slots'
  // entries and counts on its own; the counts are summed after the join.
  const auto start = std::chrono::steady_clock::now();
  scanned_.assign(static_cast<std::size_t>(num_slots_), std::nullopt);
  constexpr std::int64_t kSlotsPerThread = 4096;  // smaller tiers: fewer threads
  const auto threads = static_cast<std::size_t>(std::clamp<std::int64_t>(
      (num_slots_ + kSlotsPerThread - 1) / kSlotsPerThread, 1, kScanThreads));
  std::vector<DiskScanReport> counts(threads);
  std::vector<std::exception_ptr> errors(threads);
  auto scan_range = [this, threads, &counts, &errors](std::size_t t) {
    try {
      const std::int64_t first =
          num_slots_ * static_cast<std::int64_t>(t) / static_cast<std::int64_t>(threads);
      const std::int64_t last =
          num_slots_ * static_cast<std::int64_t>(t + 1) / static_cast<std::int64_t>(threads);
      scan_slots(first, last, counts[t]);
    } catch (...) {
      errors[t] = std::current_exception();
    }
  };
  // Ranges this thread scans: its own, and any whose thread cannot start (out of threads or
  // memory). Reserved first, so recording one cannot throw; jthreads join while unwinding.
  std::vector<std::size_t> here;
  here.reserve(threads);
  here.push_back(0);
  {
    std::vector<std::jthread> workers;
    workers.reserve(threads - 1);
    for (std::size_t t = 1; t < threads; ++t) {
      try {
        workers.emplace_back(scan_range, t);
      } catch (const std::exception&) {
        here.push_back(t);
      }
    }
    for (const std::size_t t : here) scan_range(t);
  }  // joined
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  for (const DiskScanReport& c : counts) {
    scan_.valid += c.valid;
    scan_.invalid += c.invalid;
    scan_.other_epoch += c.other_epoch;
    scan_.empty += c.empty;
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

SlotRead DiskSlots::finish_read(const std::uint8_t* buffer, bool read_ok, const Key& key,
                                std::uint64_t epoch, std::span<std::uint8_t> out) {
  KVOFFLOAD_EXPECTS(out.size() == config_.payload_bytes,
                    "disk tier: a buffer of {} bytes, slots hold {}", out.size(),
                    config_.payload_bytes);
  const auto miss = [&](SlotRead why) {
    ++read_misses_;
    if (why == SlotRead::io_error) ++read_errors_;
    if (why == SlotRead::corrupt) ++read_corrupt_;
    return why;
  };
  if (!read_ok) return miss(SlotRead::io_error);  // transient, or not: the slot is kept
  Key found;
  switch (decode(buffer, config_.layout_digest, epoch, config_.payload_bytes, found)) {
    case HeaderState::empty:
    case HeaderState::other_epoch: return miss(SlotRead::not_found);
    case HeaderState::invalid: return miss(SlotRead::corrupt);
    case HeaderState::valid: break;
  }
  // A well-formed slot of another key is not ours to judge (nor to erase).
  if (!(found == key)) return miss(SlotRead::not_found);
  if (XXH3_64bits(buffer + kHeaderBytes, config_.payload_bytes) !=
      get<std::uint64_t>(buffer, kOffPayloadSum)) {
    return miss(SlotRead::corrupt);
  }
  std::memcpy(out.data(), buffer + kHeaderBytes, out.size());
  return SlotRead::ok;
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

SlotRead DiskSlots::read(std::int64_t slot, const Key& key, std::uint64_t epoch,
                         std::span<std::uint8_t> out) {
  KVOFFLOAD_EXPECTS(out.size() == config_.payload_bytes,
                    "disk tier: a buffer of {} bytes, slots hold {}", out.size(),
                    config_.payload_bytes);
  const SlotIo io = prepare_read(slot);
  std::uint8_t* const buffer = slot_buffer(slot_bytes_);
  const bool read_ok = full_pread(io.fd, buffer, io.bytes, static_cast<off_t>(io.offset));
  if (!read_ok) {
    detail::logger().warn("disk tier: reading slot {} of {} failed: {}; the slot is kept", slot,
                          layout_dir_, errno == 0 ? "a short read" : std::strerror(errno));
  }
  return finish_read(buffer, read_ok, key, epoch, out);
}

bool DiskSlots::erase(std::int64_t slot) {
  const auto [fd, at] = locate(slot);
  std::uint8_t* const buffer = slot_buffer(slot_bytes_);
  std::memset(buffer, 0, kHeaderBytes);
  return full_pwrite(fd, buffer, kHeaderBytes, static_cast<off_t>(at));
}

}  // namespace kvoffload
