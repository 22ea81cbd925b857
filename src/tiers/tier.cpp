#include "kvoffload/tiers/tier.hpp"

#include <algorithm>

#include "common/expects.hpp"
#include "common/logging.hpp"
#include "tiers/tier_queue.hpp"

namespace kvoffload {

namespace detail {

void check_host_blocks(const TierJob& job,
                       const std::function<std::span<std::byte>(HostBlockId)>& host_block) {
  for (const HostBlockId id : job.host_block_ids) {
    try {
      (void)host_block(id);
    } catch (const invalid_argument& e) {
      throw invalid_argument(fmt::format("tier job {}: {}", job.id, e.what()));
    }
  }
  // Two promotions into one host block would race, and the block would hold whichever
  // finished last under the other's key.
  if (job.kind == JobKind::promote) {
    const auto [i, j] = first_repeat(job.host_block_ids);
    KVOFFLOAD_EXPECTS(i == j, "tier job {}: blocks {} and {} are both promoted into host block {}",
                      job.id, i, j, job.host_block_ids[i]);
  }
}

TierQueue::TierQueue(std::string name, bool failures_expected)
    : name_(std::move(name)), failures_expected_(failures_expected) {}

TierQueue::~TierQueue() {
  join_clear();
}

void TierQueue::submit(const TierJob& job) {
  auto state = std::make_unique<Job>();
  state->job = job;
  state->remaining = static_cast<std::int64_t>(job.keys.size());
  state->clears = clears_.load();
  {
    std::lock_guard lock(mutex_);
    KVOFFLOAD_EXPECTS(!jobs_.contains(job.id), "tier job {}: submitted twice to the {}", job.id,
                      name_);
    if (job.kind == JobKind::promote) {
      // Two promotions in flight into one host block race: the block could be reported
      // filled by one with the other's bytes.
      for (const HostBlockId h : job.host_block_ids) {
        const auto it = filling_.find(h);
        KVOFFLOAD_EXPECTS(it == filling_.end(),
                          "tier job {}: host block {} is being filled by tier job {}, still "
                          "running on the {}",
                          job.id, h, it == filling_.end() ? 0 : it->second, name_);
      }
    }
    if (state->remaining == 0) {
      finished_.push_back(FinishedTierJob{job.id, job.kind, true, 0});
      job_done_.notify_all();
      return;
    }
    Job* raw = state.get();
    jobs_.emplace(job.id, std::move(state));
    std::deque<Task>& q = job.kind == JobKind::promote ? promotes_ : writes_;
    for (std::size_t i = 0; i < job.keys.size(); ++i) q.push_back(Task{raw, i});
    // Last: nothing above may throw once the job's host blocks are marked.
    if (job.kind == JobKind::promote) {
      for (const HostBlockId h : job.host_block_ids) filling_.emplace(h, job.id);
    }
  }
  work_ready_.notify_all();
}

bool TierQueue::take(std::vector<Task>& out, std::size_t max, bool busy) {
  std::unique_lock lock(mutex_);
  const auto empty = [&] { return promotes_.empty() && writes_.empty(); };
  if (!busy) work_ready_.wait(lock, [&] { return !clearing_ && (stopping_ || !empty()); });
  if (clearing_) return true;  // busy: nothing new until the tier is emptied
  for (std::deque<Task>* q : {&promotes_, &writes_}) {
    while (out.size() < max && !q->empty()) {
      out.push_back(q->front());
      q->pop_front();
    }
  }
  // Stopping ends the loop only once every submitted block is done.
  return !(stopping_ && empty() && out.empty() && !busy);
}

void TierQueue::done(const Task& task, bool ok) {
  Job& j = *task.job;
  std::lock_guard lock(mutex_);
  if (!ok) ++j.failed;
  if (--j.remaining > 0) return;
  finished_.push_back(FinishedTierJob{j.job.id, j.job.kind, j.failed == 0, j.failed});
  if (j.failed > 0) {
    logger().log(failures_expected_ ? spdlog::level::debug : spdlog::level::warn,
                 "{}: tier job {} ({}): {} of {} block(s) failed", name_, j.job.id,
                 to_string(j.job.kind), j.failed, j.job.keys.size());
  }
  const JobId id = j.job.id;
  if (j.job.kind == JobKind::promote) {
    for (const HostBlockId h : j.job.host_block_ids) filling_.erase(h);
  }
  jobs_.erase(id);  // destroys j
  job_done_.notify_all();
}

std::vector<FinishedTierJob> TierQueue::get_finished() {
  std::lock_guard lock(mutex_);
  return std::exchange(finished_, {});
}

void TierQueue::wait(std::span<const JobId> jobs) {
  std::unique_lock lock(mutex_);
  job_done_.wait(lock, [&] {
    return std::none_of(jobs.begin(), jobs.end(), [&](JobId id) { return jobs_.contains(id); });
  });
}

bool TierQueue::owns(JobId job) const {
  std::lock_guard lock(mutex_);
  return jobs_.contains(job);
}

void TierQueue::start_clear(std::function<void()> clear_contents) {
  std::thread previous;
  std::unique_lock lock(mutex_);
  clears_.fetch_add(1);  // before the contents go: a write landing after is erased
  if (clearing_) {
    clear_again_ = true;
    return;
  }
  previous = std::move(clear_thread_);  // a clear that ended (clearing_ false): only exits
  clearing_ = true;
  try {
    clear_thread_ = std::thread([this, clear = std::move(clear_contents)] { run_clear(clear); });
  } catch (const std::exception& e) {
    // Old writes are still skipped or erased (the generation moved); the files keep the old
    // blocks, found by no lookup (another epoch).
    clearing_ = false;
    work_ready_.notify_all();
    job_done_.notify_all();
    logger().error("{}: not emptied: no thread to empty it on: {}", name_, e.what());
  }
  lock.unlock();
  if (previous.joinable()) previous.join();
}

void TierQueue::run_clear(const std::function<void()>& clear) {
  for (;;) {
    try {
      clear();
    } catch (const std::exception& e) {
      logger().error(
          "{}: emptying it failed: {}; its old blocks stay on disk, found by no lookup "
          "(another epoch)",
          name_, e.what());
    }
    std::lock_guard done(mutex_);
    if (clear_again_) {
      clear_again_ = false;
      continue;
    }
    clearing_ = false;
    work_ready_.notify_all();
    job_done_.notify_all();
    return;
  }
}

void TierQueue::wait_cleared() {
  std::unique_lock lock(mutex_);
  job_done_.wait(lock, [&] { return !clearing_; });
}

void TierQueue::join_clear() {
  wait_cleared();
  std::thread t;
  {
    std::lock_guard lock(mutex_);
    t = std::move(clear_thread_);
  }
  if (t.joinable()) t.join();
}

void TierQueue::stop() noexcept {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
}

}  // namespace detail

Tier::Tier(std::string name, bool failures_expected)
    : queue_(std::make_unique<detail::TierQueue>(std::move(name), failures_expected)) {}

Tier::~Tier() = default;

void Tier::submit(const TierJob& job) {
  KVOFFLOAD_EXPECTS(is_tier_job(job.kind),
                    "tier job {}: kind {} is not a tier job's (promote or write)", job.id,
                    to_string(job.kind));
  check(job);
  queue_->submit(job);
}

std::vector<FinishedTierJob> Tier::get_finished() {
  return queue_->get_finished();
}

void Tier::wait(std::span<const JobId> jobs) {
  queue_->wait(jobs);
}

bool Tier::owns(JobId job) const {
  return queue_->owns(job);
}

void Tier::clear() {
  if (num_slots() == 0) return;  // nothing of its own to clear (a shared tier)
  forget_scan();                 // here: scanned() is read on the caller's side
  queue_->start_clear([this] { clear_contents(); });
}

void Tier::wait_cleared() {
  queue_->wait_cleared();
}

void Tier::stop() noexcept {
  queue_->stop();
}

void Tier::join_clear() {
  queue_->join_clear();
}

}  // namespace kvoffload
