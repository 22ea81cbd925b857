#include "kvoffload/disk_tier.hpp"

#include <algorithm>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "expects.hpp"
#include "logging.hpp"

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
  detail::logger().info("disk tier: {} slots of {} bytes in {}, {} I/O thread(s), {} I/O",
                        slots_.num_slots(), slots_.slot_bytes(), slots_.layout_directory(),
                        config.io_threads,
                        slots_.direct() ? "O_DIRECT pread/pwrite" : "buffered pread/pwrite");
  threads_.reserve(static_cast<std::size_t>(config.io_threads));
  for (int i = 0; i < config.io_threads; ++i) threads_.emplace_back([this] { run(); });
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

void DiskTier::run() {
  for (;;) {
    std::pair<Job*, std::size_t> task;
    {
      std::unique_lock lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and every submitted block is done
      task = queue_.front();
      queue_.pop_front();
    }
    Job& j = *task.first;
    const std::size_t i = task.second;
    const std::int64_t slot = j.job.tier_block_ids[i];
    bool ok = false;
    try {
      const std::span<std::byte> host = host_block_(j.job.host_block_ids[i]);
      const std::span<std::uint8_t> bytes(reinterpret_cast<std::uint8_t*>(host.data()),
                                          host.size());
      if (j.job.kind == TierJobKind::write) {
        ok = slots_.write(slot, j.job.keys[i], bytes);
      } else {
        ok = slots_.read(slot, j.job.keys[i], bytes);
        // Bad bytes stay bad: the slot is emptied so a restart does not find it again.
        if (!ok) (void)slots_.erase(slot);
      }
    } catch (const std::exception& e) {
      detail::logger().error("tier job {}: slot {}: {}", j.job.id, slot, e.what());
    }
    std::lock_guard lock(mutex_);
    if (!ok) ++j.failed;
    if (--j.remaining == 0) {
      finished_.push_back(FinishedTierJob{j.job.id, j.job.kind, j.failed == 0, j.failed});
      if (j.failed > 0) {
        detail::logger().warn("tier job {} ({}): {} of {} block(s) failed", j.job.id,
                              to_string(j.job.kind), j.failed, j.job.keys.size());
      }
      jobs_.erase(j.job.id);
      job_done_.notify_all();
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

bool DiskTier::owns(JobId job) const {
  std::lock_guard lock(mutex_);
  return jobs_.contains(job);
}

}  // namespace kvoffload
