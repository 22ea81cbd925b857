#pragma once

// Internal: the disk tier's io_uring engine. One ring, `depth` slot-sized 4 KiB-aligned
// buffers registered with it when the kernel and RLIMIT_MEMLOCK allow (fixed-buffer reads and
// writes), whole-slot reads and writes submitted in batches. Used by one thread.
//
// Submission (issue 28): the kernel may take fewer operations than were queued, or none
// (EAGAIN, EBUSY: short of resources; other errors: the ring is unusable). Only what it took
// is in flight and will complete; the rest stay queued for the next submit(), or are given up
// with cancel_queued(), which turns them into no-ops (their buffers are free at once: if the
// kernel takes them later it runs nothing, and wait() drops their completions). Nobody waits
// for a completion that cannot come.

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvoffload/tiers/disk_slots.hpp"

struct io_uring;
struct io_uring_sqe;

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

  /// Queues a whole-slot write from (or read into) buffer `i`; submit() hands it to the
  /// kernel. False if the submission ring has no room (the caller keeps queued() plus
  /// in_flight() within depth() / 2, so only cancelled no-ops the kernel has not taken yet
  /// can fill it).
  [[nodiscard]] bool queue(unsigned i, bool write, const SlotIo& io);
  /// Hands the queued operations to the kernel, retrying a bounded number of times (EINTR,
  /// and EAGAIN or EBUSY while nothing is in flight, with a short pause). Returns how many it
  /// took (the first queued: they are in flight now). `err` is 0 when none is left queued,
  /// else why not: EAGAIN or EBUSY with operations in flight (wait() for completions, then
  /// submit again), or anything else (give up: cancel_queued()).
  unsigned submit(int& err);
  /// Operations queued and not taken by the kernel.
  [[nodiscard]] unsigned queued() const noexcept { return static_cast<unsigned>(queued_.size()); }
  /// Operations the kernel took that have not completed.
  [[nodiscard]] unsigned in_flight() const noexcept { return in_flight_; }
  /// Gives up every queued operation: each becomes a no-op (run or not, it touches nothing and
  /// its completion is dropped) and its buffer is appended to `out`, free to use again.
  void cancel_queued(std::vector<unsigned>& out);
  /// Waits for at least one completion and appends every available one as (buffer, bytes or
  /// -errno); completions of cancelled operations are dropped (`out` may stay empty). A short
  /// transfer is finished here with plain pread/pwrite. Call only with operations in flight.
  void wait(std::vector<std::pair<unsigned, std::int64_t>>& out);

  /// Test seam: the next `count` submissions fail with -`err` before the kernel sees them.
  void fail_submits_for_test(int count, int err) noexcept;

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
    io_uring_sqe* sqe = nullptr;  // while queued: its entry, rewritten by cancel_queued()
  };
  std::vector<Op> ops_;          // per buffer: the operation queued or in flight
  std::vector<bool> busy_;       // per buffer: an operation is in flight (the kernel took it)
  std::deque<unsigned> queued_;  // buffers of queued operations, in submission order
  unsigned in_flight_ = 0;
  unsigned cancelled_ = 0;  // cancelled no-ops the kernel has not taken yet (ahead of queued_)
  std::atomic<int> fail_submits_{0};
  std::atomic<int> fail_errno_{0};
};

}  // namespace kvoffload::detail
