#pragma once

// The disk tier's storage (issue 16, first part): preallocated slab files of fixed-size slots,
// each holding one host block row behind a self-describing header, so that a new process
// rebuilds the index by scanning headers (restart-safe) and a torn or corrupted slot is a miss,
// never wrong data.
//
// Slot layout (all integers little-endian):
//   [0, 4096)           header: magic "KVOFSLT1", format version, key (hash bytes, size,
//                       group), valid_from (0: whole blocks only, SEMANTICS 6.8),
//                       layout digest, payload length, XXH3-64 of the payload, the
//                       weights' epoch, XXH3-64 of the header fields before it; zero padding
//   [4096, slot_bytes)  payload, padded to a multiple of 4096 (O_DIRECT-ready)
// Files: <directory>/<layout digest, 16 hex digits>/slab-<n>.kvo, `slots_per_file` slots each,
// and <layout digest>/kvoffload.lock.
//
// Opening (issue 28):
// - One owner per layout directory: an exclusive flock on its kvoffload.lock, held for the
//   object's life (O_CLOEXEC). A second DiskSlots on the same directory, in this process or
//   another, throws io_error naming the directory: two writers would overwrite each other's
//   slots. Give each engine its own path, and each tensor-parallel worker its own tp_rank.
// - Private files: directories the tier creates are 0700, slab and lock files 0600 (wider
//   existing files are narrowed); every file is opened with O_NOFOLLOW, and a root or layout
//   directory that is a symbolic link is refused (io_error naming it).
// - The capacity is the bound on disk: files past the slots capacity_bytes holds now are
//   removed, and a longer last file is cut to its slots (a tier whose capacity shrank).
// - A root belongs to one engine: the other layout directories under it are stale (an older
//   model, dtype, factor or layout of this engine) and are removed, except the layouts in
//   keep_layouts (this engine's other tensor-parallel ranks) and any whose lock another
//   DiskSlots holds (in use). Only a directory named by 16 hex digits that holds nothing but
//   slab-<n>.kvo files and its lock file is removed; anything else is left alone. Each
//   removal is logged.
//
// Thread-safety: write, read and erase of different slots may run concurrently (the disk
// tier's I/O threads); the same slot must not be used by two calls at once (the scheduler's
// tier index never hands out a slot that is being written or read).

#include <atomic>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvoffload/export.hpp"
#include "kvoffload/types.hpp"

namespace kvoffload {

struct DiskSlotsConfig {
  std::string directory;            ///< the tier's root directory (created if missing)
  std::uint64_t layout_digest = 0;  ///< of everything that makes bytes incompatible
  /// The weights' epoch (weights_epoch of the scheduler's weights): the scan restores only
  /// slots written under it; the others are blocks of other weights, never found.
  std::uint64_t epoch = 0;
  std::uint64_t payload_bytes = 0;   ///< bytes of one host block row, > 0
  std::uint64_t capacity_bytes = 0;  ///< bound on the slab files' total size, >= one slot
  std::uint64_t slots_per_file = 1024;
  /// Scan also reads every payload and checks its checksum (slow on large tiers): then the
  /// index holds exactly the slots whose write completed. Without it, a write torn between
  /// header and payload is found at read time (a miss, counted) instead.
  bool verify_payloads_on_scan = false;
  /// Slot reads and writes bypass the page cache (O_DIRECT) where the file system allows it;
  /// elsewhere (tmpfs, some overlay file systems) they fall back to buffered I/O, logged.
  bool direct_io = false;
  /// Layout digests under the same directory that are not stale and never removed at open:
  /// this engine's other tensor-parallel ranks (DiskTier fills it).
  std::vector<std::uint64_t> keep_layouts;
};

/// Why a slot read did or did not give the block. Only `corrupt` is a reason to erase the slot.
enum class SlotRead {
  ok,         ///< the payload was copied out
  io_error,   ///< the read itself failed (an I/O error, a short read): the slot is kept
  corrupt,    ///< a torn or corrupt header, or the key's payload fails its checksum
  not_found,  ///< empty, or a well-formed slot of another key or weights' epoch
};

/// Where one slot operation goes: the file, the offset and the byte count (a whole slot for
/// reads and writes), for an I/O engine that submits it itself (io_uring).
struct SlotIo {
  int fd = -1;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};

/// What the scan at open found.
struct DiskScanReport {
  std::int64_t valid = 0;        ///< slots with a good header (and payload, when verified)
  std::int64_t invalid = 0;      ///< slots with a header that is torn, corrupt or of another layout
  std::int64_t other_epoch = 0;  ///< well-formed slots of other weights (another epoch)
  std::int64_t empty = 0;        ///< slots never written or erased
  double seconds = 0;
};

struct DiskSlotsStats {
  std::uint64_t writes = 0;
  std::uint64_t write_errors = 0;  ///< I/O errors, ENOSPC included
  std::uint64_t reads = 0;
  std::uint64_t read_misses = 0;   ///< every read that gave no block (the three below)
  std::uint64_t read_errors = 0;   ///< of them, reads that failed (I/O error, short read)
  std::uint64_t read_corrupt = 0;  ///< of them, a torn or corrupt header or payload
};

class KVOFFLOAD_EXPORT DiskSlots {
 public:
  /// Creates or opens the slab files (locking the layout directory, removing stale layout
  /// directories and files past the capacity: see the top of this file) and scans their
  /// headers. Throws invalid_argument naming the field for a bad config, and io_error naming
  /// the path when a directory or file cannot be created or opened, is a symbolic link, or
  /// another DiskSlots (in this process or another) uses the layout directory.
  explicit DiskSlots(const DiskSlotsConfig& config);
  ~DiskSlots();
  DiskSlots(const DiskSlots&) = delete;
  DiskSlots& operator=(const DiskSlots&) = delete;

  [[nodiscard]] std::int64_t num_slots() const noexcept { return num_slots_; }
  [[nodiscard]] std::uint64_t slot_bytes() const noexcept { return slot_bytes_; }
  /// The directory of this layout's files (locked by this object while it lives).
  [[nodiscard]] const std::string& layout_directory() const noexcept { return layout_dir_; }

  /// Writes `payload` (exactly payload_bytes) with `key`'s header, under the weights' epoch
  /// `epoch`, into `slot`, header and payload in one write. Returns false (counted, logged)
  /// on an I/O error such as ENOSPC.
  bool write(std::int64_t slot, const Key& key, std::uint64_t epoch,
             std::span<const std::uint8_t> payload);
  /// Reads `slot` into `out` (payload_bytes) if its header is valid, holds `key` under
  /// `epoch`, and the payload's checksum matches (SlotRead::ok); otherwise says why (a miss,
  /// counted; an I/O error is logged) and `out` must not be used. Erases nothing: the caller
  /// erases a slot read as corrupt.
  SlotRead read(std::int64_t slot, const Key& key, std::uint64_t epoch,
                std::span<std::uint8_t> out);
  /// Marks `slot` empty (its header zeroed), e.g. when the tier evicts it.
  bool erase(std::int64_t slot);
  /// Empties every slot (each file cut to nothing and grown back, sparse). I/O in flight
  /// meanwhile may land after (the disk tier erases such writes). Throws kvoffload::error
  /// naming the file if one cannot be cut. scanned() is left to forget_scanned().
  void clear();
  /// Forgets what the start-up scan found (scanned() all empty).
  void forget_scanned() { scanned_.assign(scanned_.size(), std::nullopt); }
  /// Frees what the start-up scan found (scanned() empty, its memory given back).
  void release_scanned() noexcept { std::vector<std::optional<Key>>().swap(scanned_); }

  // write() and read() in parts, for an engine that does the I/O itself. `buffer` holds a
  // slot (slot_bytes()), 4 KiB-aligned.
  /// Encodes header and payload into `buffer`; the caller writes it to the returned place.
  SlotIo prepare_write(std::int64_t slot, const Key& key, std::uint64_t epoch,
                       std::span<const std::uint8_t> payload, std::uint8_t* buffer);
  /// A write that failed with `err` (an errno): counted, logged, the slot's header dropped.
  void write_failed(std::int64_t slot, int err);
  /// Where to read `slot` from (a whole slot, into a buffer).
  SlotIo prepare_read(std::int64_t slot);
  /// Checks a slot read into `buffer` (header valid, holds `key` under `epoch`, payload
  /// checksum) and copies the payload to `out` (SlotRead::ok); otherwise says why (a miss,
  /// counted). `read_ok` false: the read itself failed, `buffer` is not looked at and the
  /// answer is SlotRead::io_error (the caller logs the reason).
  SlotRead finish_read(const std::uint8_t* buffer, bool read_ok, const Key& key,
                       std::uint64_t epoch, std::span<std::uint8_t> out);

  /// The key the scan at open found in each slot (nullopt: empty or invalid).
  [[nodiscard]] const std::vector<std::optional<Key>>& scanned() const noexcept { return scanned_; }
  [[nodiscard]] const DiskScanReport& scan_report() const noexcept { return scan_; }
  [[nodiscard]] DiskSlotsStats stats() const noexcept;
  /// Whether slot I/O uses O_DIRECT (direct_io asked for and supported).
  [[nodiscard]] bool direct() const noexcept { return direct_; }

 private:
  void open_files(int dir_fd);
  void remove_stale_layouts(const std::string& root);
  void close_all() noexcept;
  void scan();
  /// Scans slots [first, last) into scanned_, counting into `counts` (one scan thread's part).
  void scan_slots(std::int64_t first, std::int64_t last, DiskScanReport& counts);
  /// Header reads in flight during the scan at open (threads; fewer for small tiers).
  static constexpr std::int64_t kScanThreads = 16;
  [[nodiscard]] std::pair<int, std::uint64_t> locate(std::int64_t slot) const;

  DiskSlotsConfig config_;
  std::string layout_dir_;
  std::uint64_t slot_bytes_ = 0;
  std::int64_t num_slots_ = 0;
  std::vector<int> fds_;         // buffered: the scan
  std::vector<int> direct_fds_;  // slot I/O: O_DIRECT, or the buffered fds again
  int lock_fd_ = -1;             // <layout_dir_>/kvoffload.lock, flock(LOCK_EX) while alive
  bool direct_ = false;
  std::vector<std::optional<Key>> scanned_;
  DiskScanReport scan_;
  std::atomic<std::uint64_t> writes_{0}, write_errors_{0}, reads_{0}, read_misses_{0},
      read_errors_{0}, read_corrupt_{0};
};

/// XXH3-64 of `bytes` (the disk tier's checksum), exposed for tests and tools.
KVOFFLOAD_EXPORT std::uint64_t disk_checksum(std::span<const std::uint8_t> bytes) noexcept;

}  // namespace kvoffload
