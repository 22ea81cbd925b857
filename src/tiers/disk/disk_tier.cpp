#include "kvoffload/tiers/disk_tier.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/expects.hpp"
#include "common/logging.hpp"
#include "tiers/disk/uring_io.hpp"
#include "tiers/tier_queue.hpp"

namespace kvoffload {

std::uint64_t disk_layout_digest(const DiskTierConfig& config, std::string_view layout) {
  const std::string text =
      fmt::format("kvoffload disk tier v1\nmodel={}\ndtype={}\ntp={}/{}\nlayout={}\n", config.model,
                  config.dtype, config.tp_rank, config.tp_size, layout);
  return XXH3_64bits(text.data(), text.size());
}

std::vector<std::optional<Key>> merge_rank_scans(
    std::span<const std::vector<std::optional<Key>>> ranks) {
  if (ranks.empty()) return {};
  std::size_t n = ranks[0].size();
  for (const auto& r : ranks) n = std::min(n, r.size());
  std::vector<std::optional<Key>> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::optional<Key>& first = ranks[0][i];
    if (!first) continue;
    const bool everywhere = std::all_of(ranks.begin(), ranks.end(), [&](const auto& r) {
      return r[i].has_value() && *r[i] == *first;
    });
    if (everywhere) out[i] = first;
  }
  return out;
}

namespace {

DiskSlotsConfig slots_config(const DiskTierConfig& c, std::string_view layout,
                             std::uint64_t payload_bytes, std::uint64_t epoch) {
  KVOFFLOAD_EXPECTS(!c.path.empty(), "disk tier: path is empty");
  KVOFFLOAD_EXPECTS(c.io_threads >= 1 && c.io_threads <= 256,
                    "disk tier: io_threads must be 1 to 256, got {}", c.io_threads);
  KVOFFLOAD_EXPECTS(c.tp_size >= 1 && c.tp_rank >= 0 && c.tp_rank < c.tp_size,
                    "disk tier: tp_rank {} is not in 0..tp_size-1 (tp_size {})", c.tp_rank,
                    c.tp_size);
  DiskSlotsConfig s;
  s.directory = c.path;
  s.layout_digest = disk_layout_digest(c, layout);
  // This engine's other ranks share the root: their directories are not stale.
  for (int r = 0; r < c.tp_size; ++r) {
    if (r == c.tp_rank) continue;
    DiskTierConfig rank = c;
    rank.tp_rank = r;
    s.keep_layouts.push_back(disk_layout_digest(rank, layout));
  }
  s.epoch = epoch;
  s.payload_bytes = payload_bytes;
  s.capacity_bytes = c.capacity_bytes;
  s.verify_payloads_on_scan = c.verify_payloads_on_scan;
  s.direct_io = c.direct_io;
  return s;
}

}  // namespace

DiskTier::DiskTier(const DiskTierConfig& config, std::string_view layout,
                   std::uint64_t payload_bytes,
                   std::function<std::span<std::byte>(HostBlockId)> host_block, std::uint64_t epoch)
    : Tier("disk tier", /*failures_expected=*/false),
      slots_(slots_config(config, layout, payload_bytes, epoch)),
      host_block_(std::move(host_block)) {
  KVOFFLOAD_EXPECTS(config.io_depth >= 1 && config.io_depth <= 4096,
                    "disk tier: io_depth must be 1 to 4096, got {}", config.io_depth);
  std::string why;
  if (config.io != DiskIo::threads) {
    // Twice the depth in buffers: operations are prepared ahead while others are in flight.
    uring_ = detail::UringIo::create(2 * static_cast<unsigned>(config.io_depth),
                                     slots_.slot_bytes(), why);
    if (uring_ == nullptr && config.io == DiskIo::io_uring) {
      throw unsupported("disk tier: io = io_uring, but io_uring is not available here: " + why);
    }
  }
  const std::string mode = slots_.direct() ? "O_DIRECT" : "buffered";
  if (uring_ != nullptr) {
    io_ = DiskIo::io_uring;
    detail::logger().info(
        "disk tier: {} slots of {} bytes in {}; io_uring, depth {}, {} "
        "buffers, {} I/O",
        slots_.num_slots(), slots_.slot_bytes(), slots_.layout_directory(), config.io_depth,
        uring_->registered() ? "registered" : "plain", mode);
    start_threads(1, [this] { run_uring(); });
  } else {
    io_ = DiskIo::threads;
    detail::logger().info(
        "disk tier: {} slots of {} bytes in {}; {} pread/pwrite thread(s){}, "
        "{} I/O",
        slots_.num_slots(), slots_.slot_bytes(), slots_.layout_directory(), config.io_threads,
        why.empty() ? "" : " (no io_uring: " + why + ")", mode);
    start_threads(config.io_threads, [this] { run_threads(); });
  }
}

void DiskTier::start_threads(int n, const std::function<void()>& body) {
  threads_.reserve(static_cast<std::size_t>(n));
  try {
    for (int i = 0; i < n; ++i) threads_.emplace_back(body);
  } catch (...) {
    // A thread that cannot start: the ones that did are stopped and joined before the
    // constructor's exception destroys what they use.
    stop();
    for (std::thread& t : threads_) t.join();
    throw;
  }
}

DiskTier::~DiskTier() {
  stall_io_for_test(false);
  stop();
  for (std::thread& t : threads_) t.join();
  join_clear();  // it uses slots_
}

void DiskTier::check(const TierJob& job) const {
  KVOFFLOAD_EXPECTS(
      job.keys.size() == job.host_block_ids.size() && job.keys.size() == job.slots.size(),
      "tier job {}: {} keys, {} host blocks and {} slots", job.id, job.keys.size(),
      job.host_block_ids.size(), job.slots.size());
  for (const std::int64_t slot : job.slots) {
    KVOFFLOAD_EXPECTS(slot >= 0 && slot < slots_.num_slots(),
                      "tier job {}: slot {} is outside the tier's 0..{}", job.id, slot,
                      slots_.num_slots() - 1);
  }
  // Two writes to one slot would race: the slot could end up with one block's header and
  // the other's payload (a counted miss, but never a block worth keeping).
  if (job.kind == JobKind::write) {
    const auto [i, j] = detail::first_repeat(job.slots);
    KVOFFLOAD_EXPECTS(i == j, "tier job {}: blocks {} and {} are both written to slot {}", job.id,
                      i, j, job.slots[i]);
  }
  detail::check_host_blocks(job, host_block_);
}

TierIoStats DiskTier::stats() const {
  const DiskSlotsStats s = slots_.stats();
  // DiskSlots counts attempts; a tier counts blocks moved and blocks that failed.
  return TierIoStats{s.reads - s.read_misses, s.read_misses, s.writes - s.write_errors,
                     s.write_errors};
}

std::span<std::uint8_t> DiskTier::host_bytes(const TierJob& job, std::size_t i) const {
  const std::span<std::byte> host = host_block_(job.host_block_ids[i]);
  return {reinterpret_cast<std::uint8_t*>(host.data()), host.size()};
}

void DiskTier::fail_reads_for_test(int count, int err) noexcept {
  read_fault_errno_.store(err);
  read_faults_.store(count);
}

void DiskTier::fail_submits_for_test(int count, int err) noexcept {
  if (uring_ != nullptr) uring_->fail_submits_for_test(count, err);
}

void DiskTier::erase_late_write(const TierJob& job, std::int64_t slot) {
  errno = 0;
  if (slots_.erase(slot)) return;
  detail::logger().error(
      "tier job {}: slot {} was written after the tier was cleared and could not be erased "
      "({}); a restart under the same weights may find it",
      job.id, slot, errno != 0 ? std::strerror(errno) : "a short write");
}

void DiskTier::stall_io_for_test(bool on) {
  {
    std::lock_guard lock(stall_mutex_);
    stalled_ = on;
  }
  stall_cv_.notify_all();
}

void DiskTier::wait_while_stalled() {
  std::unique_lock lock(stall_mutex_);
  stall_cv_.wait(lock, [&] { return !stalled_; });
}

int DiskTier::take_read_fault() noexcept {
  int n = read_faults_.load();
  while (n > 0 && !read_faults_.compare_exchange_weak(n, n - 1)) {
  }
  return n > 0 ? read_fault_errno_.load() : 0;
}

void DiskTier::settle_read(SlotRead r, std::int64_t slot) {
  // Bad bytes stay bad: a corrupt slot is emptied so a restart does not find it again. A read
  // that failed may work next time, and a well-formed slot of another key or epoch is not
  // this read's to judge: both are kept.
  if (r == SlotRead::corrupt) (void)slots_.erase(slot);
}

using Task = detail::TierQueue::Task;

void DiskTier::run_threads() {
  std::vector<Task> tasks;
  for (;;) {
    tasks.clear();
    if (!queue().take(tasks, 1, false)) return;
    if (tasks.empty()) continue;
    const TierJob& job = tasks[0].job->job;
    const std::size_t i = tasks[0].index;
    const std::int64_t slot = job.slots[i];
    bool ok = false;
    try {
      if (job.kind == JobKind::write) {
        // A write of a job from before a clear() is skipped, or erased if it landed after.
        const bool skip = queue().cleared_since(tasks[0]);
        wait_while_stalled();  // test seam: here a stall lets a clear() pass the check
        ok = !skip && slots_.write(slot, job.keys[i], job.epoch, host_bytes(job, i));
        if (ok && queue().cleared_since(tasks[0])) {
          erase_late_write(job, slot);
          ok = false;
        }
      } else {
        wait_while_stalled();
        SlotRead r = SlotRead::io_error;
        if (const int err = take_read_fault(); err != 0) {
          (void)slots_.prepare_read(slot);
          detail::logger().warn("tier job {}: reading slot {} failed: {}; the slot is kept", job.id,
                                slot, std::strerror(err));
          r = slots_.finish_read(nullptr, false, job.keys[i], job.epoch, host_bytes(job, i));
        } else {
          r = slots_.read(slot, job.keys[i], job.epoch, host_bytes(job, i));
        }
        ok = r == SlotRead::ok;
        settle_read(r, slot);
      }
    } catch (const std::exception& e) {
      detail::logger().error("tier job {}: slot {}: {}", job.id, slot, e.what());
    }
    queue().done(tasks[0], ok);
  }
}

void DiskTier::run_uring() {
  // Up to io_depth operations queued or in flight, and as many prepared ahead in spare
  // buffers, so the CPU work (a write's checksum and copy, a read's check and copy) overlaps
  // the I/O even at depth 1: a completion is replaced by a prepared operation before it is
  // processed.
  detail::UringIo& ring = *uring_;
  const unsigned depth = ring.depth() / 2;
  struct Prepared {
    unsigned buffer = 0;
    bool write = false;
    SlotIo io;
  };
  std::vector<unsigned> free_buffers;
  for (unsigned b = ring.depth(); b-- > 0;) free_buffers.push_back(b);
  std::vector<Task> owner(ring.depth());  // per buffer
  std::deque<Prepared> ready;
  std::vector<Task> tasks;
  std::vector<std::pair<unsigned, std::int64_t>> done;  // (buffer, bytes or -errno)
  std::vector<unsigned> cancelled;
  const auto busy = [&] { return ring.in_flight() + ring.queued(); };
  // Promotions ahead of writes at the device too (issue 30): writes hold at most three
  // quarters of the depth, so a promotion arriving behind a flood of writes goes to the
  // kernel at once, and no new write is handed over while a promotion's reads are out.
  const unsigned max_writes = std::max(1U, depth - std::max(1U, depth / 4));
  unsigned writes_out = 0, reads_out = 0;           // handed to the kernel, not finished
  std::vector<std::uint8_t> counted(ring.depth());  // per buffer: 1 a write, 2 a read, out
  // Hands prepared operations to the kernel. What it does not take waits for the next call
  // while operations are in flight (short of resources: completions free some); otherwise,
  // the kernel refusing, those operations fail now: into `done` as failed completions, their
  // blocks finished and buffers freed like any other.
  const auto submit_ready = [&] {
    for (; busy() < depth && !ready.empty(); ready.pop_front()) {
      const Prepared& p = ready.front();
      // Reads are ahead of writes in `ready`: a write here means no read is waiting.
      if (p.write && (writes_out >= max_writes || reads_out > 0)) break;
      if (!ring.queue(p.buffer, p.write, p.io)) {
        done.emplace_back(p.buffer, -EBUSY);
      } else {
        ++(p.write ? writes_out : reads_out);
        counted[p.buffer] = p.write ? 1 : 2;
      }
    }
    if (ring.queued() == 0) return;
    int err = 0;
    (void)ring.submit(err);
    if (err == 0 || ((err == EAGAIN || err == EBUSY) && ring.in_flight() > 0)) return;
    detail::logger().error("disk tier: io_uring_submit failed: {}; {} queued block(s) fail",
                           std::strerror(err), ring.queued());
    cancelled.clear();
    ring.cancel_queued(cancelled);
    for (const unsigned b : cancelled) done.emplace_back(b, -static_cast<std::int64_t>(err));
  };
  // Prepares queued blocks into free buffers, up to `depth` ahead; waits for work only when
  // nothing is queued, in flight, prepared or done. False: stopping and everything is done.
  const auto fill = [&]() -> bool {
    const bool idle = busy() == 0 && ready.empty() && done.empty();
    // About 1 MiB a pass (at least a block): preparing a write checksums and copies a whole
    // block, and a promotion arriving meanwhile waits for the pass to end (issue 30).
    const std::size_t per_pass = std::max<std::size_t>(1, (1U << 20) / slots_.slot_bytes());
    const std::size_t room =
        std::min({free_buffers.size(), static_cast<std::size_t>(depth) - ready.size(), per_pass});
    tasks.clear();
    if (room == 0 && !idle) return true;
    if (!queue().take(tasks, room, !idle)) return false;
    for (const Task& t : tasks) {
      const TierJob& job = t.job->job;
      const std::size_t i = t.index;
      const unsigned b = free_buffers.back();
      if (job.kind == JobKind::write && queue().cleared_since(t)) {
        queue().done(t, false);  // from before a clear(): never written
        continue;
      }
      wait_while_stalled();  // test seam: after the check, as in run_threads
      try {
        const bool write = job.kind == JobKind::write;
        const SlotIo io = write ? slots_.prepare_write(job.slots[i], job.keys[i], job.epoch,
                                                       host_bytes(job, i), ring.buffer(b))
                                : slots_.prepare_read(job.slots[i]);
        // A promotion is what a waiting request needs: it goes to the kernel before the
        // writes prepared earlier (behind the other reads), so it waits only for the writes
        // already in flight (issue 30). The scheduler never reads and writes one slot at once.
        const auto at = write ? ready.end()
                              : std::find_if(ready.begin(), ready.end(),
                                             [](const Prepared& p) { return p.write; });
        ready.insert(at, Prepared{b, write, io});
      } catch (const std::exception& e) {
        detail::logger().error("tier job {}: slot {}: {}", job.id, job.slots[i], e.what());
        queue().done(t, false);
        continue;
      }
      free_buffers.pop_back();
      owner[b] = t;
    }
    return true;
  };
  const auto finish = [&](unsigned b, std::int64_t res) {
    const TierJob& job = owner[b].job->job;
    const std::size_t i = owner[b].index;
    const std::int64_t slot = job.slots[i];
    bool ok = false;
    if (job.kind == JobKind::write) {
      const bool complete = res == static_cast<std::int64_t>(slots_.slot_bytes());
      if (!complete) slots_.write_failed(slot, res < 0 ? static_cast<int>(-res) : EIO);
      ok = complete;
      if (ok && queue().cleared_since(owner[b])) {  // landed after a clear(): erased
        erase_late_write(job, slot);
        ok = false;
      }
    } else {
      if (const int err = take_read_fault(); err != 0) res = -err;
      const bool complete = res == static_cast<std::int64_t>(slots_.slot_bytes());
      if (!complete) {
        detail::logger().warn("tier job {}: reading slot {} failed: {}; the slot is kept", job.id,
                              slot,
                              res < 0 ? std::strerror(static_cast<int>(-res)) : "a short read");
      }
      try {
        const SlotRead r = slots_.finish_read(ring.buffer(b), complete, job.keys[i], job.epoch,
                                              host_bytes(job, i));
        ok = r == SlotRead::ok;
        settle_read(r, slot);
      } catch (const std::exception& e) {
        detail::logger().error("tier job {}: slot {}: {}", job.id, slot, e.what());
      }
    }
    if (counted[b] != 0) {
      --(counted[b] == 1 ? writes_out : reads_out);
      counted[b] = 0;
    }
    free_buffers.push_back(b);
    queue().done(owner[b], ok);
  };
  for (;;) {
    if (!fill()) return;
    submit_ready();
    if (!fill()) return;  // the next blocks get ready while these are in flight
    if (done.empty()) {
      if (ring.in_flight() == 0) continue;
      ring.wait(done);  // may give nothing (only cancelled no-ops completed)
    }
    submit_ready();
    for (const auto& [b, res] : done) finish(b, res);
    done.clear();
  }
}

}  // namespace kvoffload
