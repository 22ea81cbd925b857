#include "kvoffload/tiers/disk_tier.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/expects.hpp"
#include "common/logging.hpp"
#include "tiers/disk/uring_io.hpp"

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
                             std::uint64_t payload_bytes) {
  KVOFFLOAD_EXPECTS(!c.path.empty(), "disk tier: path is empty");
  KVOFFLOAD_EXPECTS(c.io_threads >= 1 && c.io_threads <= 256,
                    "disk tier: io_threads must be 1 to 256, got {}", c.io_threads);
  KVOFFLOAD_EXPECTS(c.tp_size >= 1 && c.tp_rank >= 0 && c.tp_rank < c.tp_size,
                    "disk tier: tp_rank {} is not in 0..tp_size-1 (tp_size {})", c.tp_rank,
                    c.tp_size);
  DiskSlotsConfig s;
  s.directory = c.path;
  s.layout_digest = disk_layout_digest(c, layout);
  s.payload_bytes = payload_bytes;
  s.capacity_bytes = c.capacity_bytes;
  s.verify_payloads_on_scan = c.verify_payloads_on_scan;
  s.direct_io = c.direct_io;
  return s;
}

}  // namespace

DiskTier::DiskTier(const DiskTierConfig& config, std::string_view layout,
                   std::uint64_t payload_bytes,
                   std::function<std::span<std::byte>(HostBlockId)> host_block)
    : slots_(slots_config(config, layout, payload_bytes)), host_block_(std::move(host_block)) {
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
    threads_.emplace_back([this] { run_uring(); });
  } else {
    io_ = DiskIo::threads;
    detail::logger().info(
        "disk tier: {} slots of {} bytes in {}; {} pread/pwrite thread(s){}, "
        "{} I/O",
        slots_.num_slots(), slots_.slot_bytes(), slots_.layout_directory(), config.io_threads,
        why.empty() ? "" : " (no io_uring: " + why + ")", mode);
    threads_.reserve(static_cast<std::size_t>(config.io_threads));
    for (int i = 0; i < config.io_threads; ++i) threads_.emplace_back([this] { run_threads(); });
  }
}

DiskTier::~DiskTier() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void DiskTier::submit(const TierJob& job) {
  KVOFFLOAD_EXPECTS(
      job.keys.size() == job.host_block_ids.size() && job.keys.size() == job.tier_block_ids.size(),
      "tier job {}: {} keys, {} host blocks and {} slots", job.id, job.keys.size(),
      job.host_block_ids.size(), job.tier_block_ids.size());
  for (const std::int64_t slot : job.tier_block_ids) {
    KVOFFLOAD_EXPECTS(slot >= 0 && slot < slots_.num_slots(),
                      "tier job {}: slot {} is outside the tier's 0..{}", job.id, slot,
                      slots_.num_slots() - 1);
  }
  for (const HostBlockId id : job.host_block_ids) (void)host_block_(id);  // throws if bad
  auto state = std::make_unique<Job>();
  state->job = job;
  state->remaining = static_cast<std::int64_t>(job.keys.size());
  std::lock_guard lock(mutex_);
  KVOFFLOAD_EXPECTS(!jobs_.contains(job.id), "tier job {} was submitted twice", job.id);
  Job* raw = state.get();
  jobs_.emplace(job.id, std::move(state));
  if (raw->remaining == 0) {
    finished_.push_back(FinishedTierJob{job.id, job.kind, true, 0});
    jobs_.erase(job.id);
    job_done_.notify_all();
    return;
  }
  for (std::size_t i = 0; i < job.keys.size(); ++i) queue_.emplace_back(raw, i);
  work_ready_.notify_all();
}

bool DiskTier::take(std::vector<Task>& out, std::size_t max, bool busy) {
  std::unique_lock lock(mutex_);
  if (!busy) work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
  while (out.size() < max && !queue_.empty()) {
    out.push_back(queue_.front());
    queue_.pop_front();
  }
  // Stopping ends the loop only once every submitted block is done.
  return !(stopping_ && queue_.empty() && out.empty() && !busy);
}

std::span<std::uint8_t> DiskTier::host_bytes(const Job& j, std::size_t i) const {
  const std::span<std::byte> host = host_block_(j.job.host_block_ids[i]);
  return {reinterpret_cast<std::uint8_t*>(host.data()), host.size()};
}

void DiskTier::block_done(Job& j, bool ok) {
  std::lock_guard lock(mutex_);
  if (!ok) ++j.failed;
  if (--j.remaining > 0) return;
  finished_.push_back(FinishedTierJob{j.job.id, j.job.kind, j.failed == 0, j.failed});
  if (j.failed > 0) {
    detail::logger().warn("tier job {} ({}): {} of {} block(s) failed", j.job.id,
                          to_string(j.job.kind), j.failed, j.job.keys.size());
  }
  jobs_.erase(j.job.id);  // destroys j
  job_done_.notify_all();
}

void DiskTier::run_threads() {
  std::vector<Task> tasks;
  for (;;) {
    tasks.clear();
    if (!take(tasks, 1, false)) return;
    if (tasks.empty()) continue;
    Job& j = *tasks[0].first;
    const std::size_t i = tasks[0].second;
    const std::int64_t slot = j.job.tier_block_ids[i];
    bool ok = false;
    try {
      if (j.job.kind == TierJobKind::write) {
        ok = slots_.write(slot, j.job.keys[i], host_bytes(j, i));
      } else {
        ok = slots_.read(slot, j.job.keys[i], host_bytes(j, i));
        // Bad bytes stay bad: the slot is emptied so a restart does not find it again.
        if (!ok) (void)slots_.erase(slot);
      }
    } catch (const std::exception& e) {
      detail::logger().error("tier job {}: slot {}: {}", j.job.id, slot, e.what());
    }
    block_done(j, ok);
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
    if (!take(tasks, room, !idle)) return false;
    for (const Task& t : tasks) {
      Job& j = *t.first;
      const std::size_t i = t.second;
      const unsigned b = free_buffers.back();
      try {
        const bool write = j.job.kind == TierJobKind::write;
        const SlotIo io = write ? slots_.prepare_write(j.job.tier_block_ids[i], j.job.keys[i],
                                                       host_bytes(j, i), ring.buffer(b))
                                : slots_.prepare_read(j.job.tier_block_ids[i]);
        ready.push_back(Prepared{b, write, io});
      } catch (const std::exception& e) {
        detail::logger().error("tier job {}: slot {}: {}", j.job.id, j.job.tier_block_ids[i],
                               e.what());
        block_done(j, false);
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
      Job& j = *owner[b].first;
      const std::size_t i = owner[b].second;
      const std::int64_t slot = j.job.tier_block_ids[i];
      const bool complete = res == static_cast<std::int64_t>(slots_.slot_bytes());
      bool ok = false;
      if (j.job.kind == TierJobKind::write) {
        if (!complete) slots_.write_failed(slot, res < 0 ? static_cast<int>(-res) : EIO);
        ok = complete;
      } else {
        try {
          ok = slots_.finish_read(ring.buffer(b), complete, j.job.keys[i], host_bytes(j, i));
        } catch (const std::exception& e) {
          detail::logger().error("tier job {}: slot {}: {}", j.job.id, slot, e.what());
        }
        if (!ok) (void)slots_.erase(slot);
      }
      free_buffers.push_back(b);
      block_done(j, ok);
    }
  }
}

std::vector<FinishedTierJob> DiskTier::get_finished() {
  std::lock_guard lock(mutex_);
  std::vector<FinishedTierJob> out;
  out.swap(finished_);
  return out;
}

void DiskTier::wait(std::span<const JobId> jobs) {
  std::unique_lock lock(mutex_);
  job_done_.wait(lock, [&] {
    return std::none_of(jobs.begin(), jobs.end(), [&](JobId id) { return jobs_.contains(id); });
  });
}

void DiskTier::clear() {
  std::lock_guard lock(mutex_);
  if (!jobs_.empty()) {
    throw error(
        fmt::format("disk tier: clear() with {} tier job(s) still running (wait for "
                    "the step's flush set first)",
                    jobs_.size()));
  }
  slots_.clear();
}

bool DiskTier::owns(JobId job) const {
  std::lock_guard lock(mutex_);
  return jobs_.contains(job);
}

}  // namespace kvoffload
