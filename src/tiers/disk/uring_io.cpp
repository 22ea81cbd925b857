#include "tiers/disk/uring_io.hpp"

#include <liburing.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace kvoffload::detail {
namespace {

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

void UringIo::queue(unsigned i, bool write, const SlotIo& io) {
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  // Never null: at most `depth` operations are in flight, one per buffer, and the ring has
  // `depth` entries.
  ops_[i] = Op{write, io};
  busy_[i] = true;
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
}

bool UringIo::submit(int& err) {
  for (;;) {
    const int rc = io_uring_submit(ring_.get());
    if (rc >= 0) return true;
    if (rc == -EINTR || rc == -EAGAIN) continue;
    err = -rc;
    return false;
  }
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
    return;
  }
  unsigned head = 0, seen = 0;
  io_uring_for_each_cqe(ring_.get(), head, cqe) {
    const auto i = static_cast<unsigned>(io_uring_cqe_get_data64(cqe));
    std::int64_t res = cqe->res;
    const Op& op = ops_[i];
    if (res >= 0 && static_cast<std::uint64_t>(res) < op.io.bytes) {
      res = finish_short(op.write, op.io, buffers_[i], static_cast<std::uint64_t>(res));
    }
    busy_[i] = false;
    out.emplace_back(i, res);
    ++seen;
  }
  io_uring_cq_advance(ring_.get(), seen);
}

}  // namespace kvoffload::detail
