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
  stop();
  for (std::thread& t : threads_) t.join();
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
        ok = slots_.write(slot, job.keys[i], job.epoch, host_bytes(job, i));
      } else {
        ok = slots_.read(slot, job.keys[i], job.epoch, host_bytes(job, i));
        // Bad bytes stay bad: the slot is emptied so a restart does not find it again.
        if (!ok) (void)slots_.erase(slot);
      }
    } catch (const std::exception& e) {
      detail::logger().error("tier job {}: slot {}: {}", job.id, slot, e.what());
    }
    queue().done(tasks[0], ok);
  }
}

void DiskTier::run_uring() {
  // Up to io_depth operations in flight, and as many prepared ahead in spare buffers, so the
  // CPU work (a write's checksum and copy, a read's check and copy) overlaps the I/O even at
  // depth 1: a completion is replaced by a prepared operation before it is processed.
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
  std::vector<std::pair<unsigned, std::int64_t>> done;
  unsigned busy = 0;
  const auto submit_ready = [&] {
    unsigned queued = 0;
    for (; busy < depth && !ready.empty(); ready.pop_front()) {
      ring.queue(ready.front().buffer, ready.front().write, ready.front().io);
      ++busy;
      ++queued;
    }
    int err = 0;
    if (queued > 0 && !ring.submit(err)) {
      detail::logger().error("disk tier: io_uring_submit failed: {}", std::strerror(err));
    }
  };
  // Prepares queued blocks into free buffers, up to `depth` ahead; waits for work only when
  // nothing is in flight or prepared. False: stopping and everything is done.
  const auto fill = [&]() -> bool {
    const bool idle = busy == 0 && ready.empty();
    const std::size_t room = std::min<std::size_t>(free_buffers.size(), depth - ready.size());
    tasks.clear();
    if (room == 0 && !idle) return true;
    if (!queue().take(tasks, room, !idle)) return false;
    for (const Task& t : tasks) {
      const TierJob& job = t.job->job;
      const std::size_t i = t.index;
      const unsigned b = free_buffers.back();
      try {
        const bool write = job.kind == JobKind::write;
        const SlotIo io = write ? slots_.prepare_write(job.slots[i], job.keys[i], job.epoch,
                                                       host_bytes(job, i), ring.buffer(b))
                                : slots_.prepare_read(job.slots[i]);
        ready.push_back(Prepared{b, write, io});
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
  for (;;) {
    if (!fill()) return;
    submit_ready();
    if (!fill()) return;  // the next blocks get ready while these are in flight
    if (busy == 0) continue;
    done.clear();
    ring.wait(done);
    busy -= static_cast<unsigned>(done.size());
    submit_ready();
    for (const auto& [b, res] : done) {
      const TierJob& job = owner[b].job->job;
      const std::size_t i = owner[b].index;
      const std::int64_t slot = job.slots[i];
      const bool complete = res == static_cast<std::int64_t>(slots_.slot_bytes());
      bool ok = false;
      if (job.kind == JobKind::write) {
        if (!complete) slots_.write_failed(slot, res < 0 ? static_cast<int>(-res) : EIO);
        ok = complete;
      } else {
        try {
          ok = slots_.finish_read(ring.buffer(b), complete, job.keys[i], job.epoch,
                                  host_bytes(job, i));
        } catch (const std::exception& e) {
          detail::logger().error("tier job {}: slot {}: {}", job.id, slot, e.what());
        }
        if (!ok) (void)slots_.erase(slot);
      }
      free_buffers.push_back(b);
      queue().done(owner[b], ok);
    }
  }
}

}  // namespace kvoffload
