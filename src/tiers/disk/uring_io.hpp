#pragma once

// Internal: the disk tier's io_uring engine. One ring, `depth` slot-sized 4 KiB-aligned
// buffers registered with it when the kernel and RLIMIT_MEMLOCK allow (fixed-buffer reads and
// writes), whole-slot reads and writes submitted in batches. Used by one thread.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvoffload/tiers/disk_slots.hpp"

struct io_uring;

namespace kvoffload::detail {

class UringIo {
 public:
  /// The engine, or nullptr with `why` saying why io_uring cannot be used here (an old kernel,
  /// a container that forbids it).
  static std::unique_ptr<UringIo> create(unsigned depth, std::uint64_t buffer_bytes,
                                         std::string& why);
  ~UringIo();
  UringIo(const UringIo&) = delete;
  UringIo& operator=(const UringIo&) = delete;

  [[nodiscard]] unsigned depth() const noexcept { return depth_; }
  [[nodiscard]] bool registered() const noexcept { return registered_; }
  [[nodiscard]] std::uint8_t* buffer(unsigned i) const noexcept { return buffers_[i]; }

  /// Queues a whole-slot write from (or read into) buffer `i`; submit() sends the batch.
  void queue(unsigned i, bool write, const SlotIo& io);
  /// Submits the queued operations; false (errno-style code in `err`) if the kernel refused.
  bool submit(int& err);
  /// Waits for at least one completion and appends every available one as (buffer, bytes or
  /// -errno). A short transfer is finished here with plain pread/pwrite.
  void wait(std::vector<std::pair<unsigned, std::int64_t>>& out);

 private:
  UringIo() = default;
  std::unique_ptr<io_uring> ring_;
  unsigned depth_ = 0;
  std::uint64_t buffer_bytes_ = 0;
  bool registered_ = false;
  std::vector<std::uint8_t*> buffers_;
  struct Op {
    bool write = false;
    SlotIo io;
  };
  std::vector<Op> ops_;     // per buffer: the operation in flight
  std::vector<bool> busy_;  // per buffer: an operation is in flight
};

}  // namespace kvoffload::detail
