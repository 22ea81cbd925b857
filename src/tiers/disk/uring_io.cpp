#include "tiers/disk/uring_io.hpp"

#include <liburing.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace kvoffload::detail {
namespace {

/// The user data of a cancelled operation's no-op: never a buffer index.
constexpr std::uint64_t kCancelled = ~std::uint64_t{0};
/// Failed submission attempts before submit() gives up (a pause between the EAGAIN ones).
constexpr int kSubmitAttempts = 8;

/// Finishes a short transfer: the bytes from `done` on, with pread/pwrite. Returns the total
/// or -errno.
std::int64_t finish_short(bool write, const SlotIo& io, std::uint8_t* buffer, std::uint64_t done) {
  while (done < io.bytes) {
    const auto at = static_cast<off_t>(io.offset + done);
    const ssize_t n = write ? ::pwrite(io.fd, buffer + done, io.bytes - done, at)
                            : ::pread(io.fd, buffer + done, io.bytes - done, at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    if (n == 0) return static_cast<std::int64_t>(done);  // end of file: a short read
    done += static_cast<std::uint64_t>(n);
  }
  return static_cast<std::int64_t>(done);
}

}  // namespace

std::unique_ptr<UringIo> UringIo::create(unsigned depth, std::uint64_t buffer_bytes,
                                         std::string& why) {
  std::unique_ptr<UringIo> u(new UringIo());
  u->ring_ = std::make_unique<io_uring>();
  const int rc = io_uring_queue_init(depth, u->ring_.get(), 0);
  if (rc < 0) {
    why = std::string("io_uring_queue_init: ") + std::strerror(-rc);
    u->ring_.reset();
    return nullptr;
  }
  u->depth_ = depth;
  u->buffer_bytes_ = buffer_bytes;
  u->ops_.resize(depth);
  u->busy_.assign(depth, false);
  std::vector<iovec> iov(depth);
  for (unsigned i = 0; i < depth; ++i) {
    void* p = std::aligned_alloc(4096, buffer_bytes);
    if (p == nullptr) {
      why = "cannot allocate the I/O buffers";
      return nullptr;  // the destructor frees what was allocated
    }
    // Touched now, so the first I/O through each buffer does not pay its page faults.
    std::memset(p, 0, buffer_bytes);
    u->buffers_.push_back(static_cast<std::uint8_t*>(p));
    iov[i] = iovec{p, buffer_bytes};
  }
  // Registered (pinned) buffers spare the kernel a page walk per I/O; RLIMIT_MEMLOCK may
  // refuse them, and then plain reads and writes do.
  u->registered_ = io_uring_register_buffers(u->ring_.get(), iov.data(), depth) == 0;
  return u;
}

UringIo::~UringIo() {
  if (ring_ != nullptr) io_uring_queue_exit(ring_.get());
  for (std::uint8_t* p : buffers_) std::free(p);
}

bool UringIo::queue(unsigned i, bool write, const SlotIo& io) {
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  if (sqe == nullptr && cancelled_ > 0) {
    // The ring is full of cancelled no-ops the kernel has not taken: hand them over first.
    int err = 0;
    (void)submit(err);
    sqe = io_uring_get_sqe(ring_.get());
  }
  if (sqe == nullptr) return false;
  ops_[i] = Op{write, io, sqe};
  const auto n = static_cast<unsigned>(io.bytes);
  const auto at = static_cast<__u64>(io.offset);
  if (registered_) {
    if (write) {
      io_uring_prep_write_fixed(sqe, io.fd, buffers_[i], n, at, static_cast<int>(i));
    } else {
      io_uring_prep_read_fixed(sqe, io.fd, buffers_[i], n, at, static_cast<int>(i));
    }
  } else if (write) {
    io_uring_prep_write(sqe, io.fd, buffers_[i], n, at);
  } else {
    io_uring_prep_read(sqe, io.fd, buffers_[i], n, at);
  }
  io_uring_sqe_set_data64(sqe, i);
  queued_.push_back(i);
  return true;
}

unsigned UringIo::submit(int& err) {
  err = 0;
  unsigned taken = 0;
  int failures = 0;
  while (!queued_.empty() || cancelled_ > 0) {
    int rc = 0;
    int injected = fail_submits_.load();
    while (injected > 0 && !fail_submits_.compare_exchange_weak(injected, injected - 1)) {
    }
    if (injected > 0) {
      rc = -fail_errno_.load();
    } else {
      rc = io_uring_submit(ring_.get());
    }
    if (rc > 0) {
      // The kernel takes entries in order: first the cancelled no-ops still in the ring,
      // then the queued operations.
      auto n = static_cast<unsigned>(rc);
      const unsigned nops = std::min(n, cancelled_);
      cancelled_ -= nops;
      n = std::min(n - nops, static_cast<unsigned>(queued_.size()));
      for (unsigned k = 0; k < n; ++k) {
        const unsigned i = queued_.front();
        queued_.pop_front();
        ops_[i].sqe = nullptr;
        busy_[i] = true;
      }
      in_flight_ += n;
      taken += n;
      continue;
    }
    const int e = rc == 0 ? EAGAIN : -rc;  // took nothing, said nothing: as if short of room
    if (e != EINTR && e != EAGAIN && e != EBUSY) {
      err = e;  // the ring refuses: the caller gives the rest up
      break;
    }
    if (++failures >= kSubmitAttempts) {
      err = e == EINTR ? EAGAIN : e;
      break;
    }
    if (e == EINTR) continue;
    // Short of resources: completions free them. With operations in flight the caller waits
    // for those and submits again; with none, a short pause.
    if (in_flight_ > 0) {
      err = e;
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100) * (1 << failures));
  }
  return taken;
}

void UringIo::cancel_queued(std::vector<unsigned>& out) {
  // The kernel has not read these entries: rewritten as no-ops, whatever it does with them
  // later touches no buffer, and wait() drops their completions.
  for (const unsigned i : queued_) {
    io_uring_prep_nop(ops_[i].sqe);
    io_uring_sqe_set_data64(ops_[i].sqe, kCancelled);
    ops_[i].sqe = nullptr;
    out.push_back(i);
  }
  cancelled_ += static_cast<unsigned>(queued_.size());
  queued_.clear();
}

void UringIo::fail_submits_for_test(int count, int err) noexcept {
  fail_errno_.store(err);
  fail_submits_.store(count);
}

void UringIo::wait(std::vector<std::pair<unsigned, std::int64_t>>& out) {
  io_uring_cqe* cqe = nullptr;
  int rc = 0;
  do {
    rc = io_uring_wait_cqe(ring_.get(), &cqe);
  } while (rc == -EINTR);
  if (rc < 0) {
    // The ring itself failed: every operation in flight is lost.
    for (unsigned i = 0; i < depth_; ++i) {
      if (busy_[i]) {
        busy_[i] = false;
        out.emplace_back(i, rc);
      }
    }
    in_flight_ = 0;
    return;
  }
  unsigned head = 0, seen = 0;
  io_uring_for_each_cqe(ring_.get(), head, cqe) {
    ++seen;
    const std::uint64_t data = io_uring_cqe_get_data64(cqe);
    if (data == kCancelled || data >= depth_ || !busy_[data]) continue;  // a cancelled no-op
    const auto i = static_cast<unsigned>(data);
    std::int64_t res = cqe->res;
    const Op& op = ops_[i];
    if (res >= 0 && static_cast<std::uint64_t>(res) < op.io.bytes) {
      res = finish_short(op.write, op.io, buffers_[i], static_cast<std::uint64_t>(res));
    }
    busy_[i] = false;
    --in_flight_;
    out.emplace_back(i, res);
  }
  io_uring_cq_advance(ring_.get(), seen);
}

}  // namespace kvoffload::detail
