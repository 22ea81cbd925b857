#include "kvoffload/transfer_engine.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "common/expects.hpp"

namespace kvoffload {

TransferEngine::TransferEngine(const KvLayout& layout, const HostRegion& host,
                               std::unique_ptr<Backend> backend, const TransferEngineConfig& config)
    : planner_(layout, host), backend_(std::move(backend)), config_(config) {
  KVOFFLOAD_EXPECTS(backend_ != nullptr, "transfer engine: no backend");
}

TransferEngine::~TransferEngine() {
  if (backend_) backend_->shutdown(/*drain=*/true);
}

void TransferEngine::start(const TransferJob& job, JobKind kind, ComputeMark mark) {
  CopyPlan plan;
  planner_.plan(job, kind, plan);  // throws before anything is submitted
  plan.compute_mark = mark;
  const JobId id = job.id;
  if (kind == JobKind::load) {
    tickets_[id] = backend_->submit(std::move(plan));
    return;
  }
  // The bound counts the stores copying in the backend, judged as each starts (a deferred one
  // at start_step): a step's stores waiting for the next step are not a backlog.
  const std::uint64_t bytes = plan.total_bytes;
  if (shed_over_bound(job, bytes)) {
    backend_->drop_mark(mark);
    return;
  }
  tickets_[id] = backend_->submit(std::move(plan));
  store_bytes_[id] = bytes;
  store_bytes_held_ += bytes;
}

void TransferEngine::submit(const TransferJob& job, JobKind kind) {
  std::lock_guard lock(mutex_);
  KVOFFLOAD_EXPECTS(tickets_.count(job.id) == 0 &&
                        std::none_of(deferred_.begin(), deferred_.end(),
                                     [&](const Deferred& d) { return d.job.id == job.id; }),
                    "transfer engine: job {} was already submitted", job.id);
  KVOFFLOAD_EXPECTS(job.kind == kind, "transfer engine: job {} is a {} job, given to submit_{}",
                    job.id, to_string(job.kind), to_string(kind));
  if (kind == JobKind::store && config_.defer_stores) {
    CopyPlan check;
    planner_.plan(job, kind, check);  // refuse a bad job now, not a step later
    // The engine's work queued so far is the forward pass this store reads; what it queues
    // before start_step (the next step's work, which may rewrite these blocks) is not.
    deferred_.push_back({job, 0});
    deferred_.back().mark = backend_->mark_compute();
    return;
  }
  start(job, kind);
}

bool TransferEngine::shed_over_bound(const TransferJob& job, std::uint64_t bytes) {
  const std::uint64_t bound = config_.max_store_bytes_in_flight;
  if (bound == 0 || store_bytes_held_ == 0 || store_bytes_held_ + bytes <= bound) return false;
  ++stats_.stores_shed;
  start_failed_.push_back(
      {job.id, JobKind::store, false,
       fmt::format("job {}: skipped: store back-pressure ({} bytes of stores copying, {} more, "
                   "max_store_bytes_in_flight {})",
                   job.id, store_bytes_held_, bytes, bound),
       0, 0});
  return true;
}

void TransferEngine::release_store(JobId job) {
  const auto it = store_bytes_.find(job);
  if (it == store_bytes_.end()) return;
  store_bytes_held_ -= it->second;
  store_bytes_.erase(it);
}

void TransferEngine::submit_store(const TransferJob& job) {
  submit(job, JobKind::store);
}
void TransferEngine::submit_load(const TransferJob& job) {
  submit(job, JobKind::load);
}

void TransferEngine::start_step() {
  std::lock_guard lock(mutex_);
  for (const Deferred& d : deferred_) start_deferred(d);
  deferred_.clear();
}

void TransferEngine::start_deferred(const Deferred& d) noexcept {
  const TransferJob& job = d.job;
  try {
    start(job, JobKind::store, d.mark);
  } catch (const std::exception& e) {
    backend_->drop_mark(d.mark);
    // Reported once, failed, like any job: the caller's step goes on with the others (start
    // holds its bytes only once the backend took it).
    start_failed_.push_back({job.id, JobKind::store, false,
                             fmt::format("job {}: its store could not start: {}", job.id, e.what()),
                             0, 0});
  }
}

std::vector<FinishedTransfer> TransferEngine::get_finished() {
  std::lock_guard lock(mutex_);
  polled_.clear();
  backend_->poll(polled_);
  std::vector<FinishedTransfer> out;
  out.reserve(polled_.size() + start_failed_.size());
  for (FinishedTransfer& f : start_failed_) {
    ++stats_.failed_jobs;
    ++stats_.store_jobs;
    out.push_back(std::move(f));
  }
  start_failed_.clear();
  for (BackendResult& r : polled_) {
    tickets_.erase(r.job);
    const bool store = r.kind == JobKind::store;
    if (store) release_store(r.job);
    if (!r.ok) ++stats_.failed_jobs;
    if (store) {
      ++stats_.store_jobs;
      stats_.bytes_stored += r.bytes;
      stats_.store_seconds += r.seconds;
    } else {
      ++stats_.load_jobs;
      stats_.bytes_loaded += r.bytes;
      stats_.load_seconds += r.seconds;
    }
    out.push_back({r.job, store ? JobKind::store : JobKind::load, r.ok, std::move(r.error), r.bytes,
                   r.seconds});
  }
  return out;
}

void TransferEngine::wait(std::span<const JobId> jobs) {
  std::vector<Ticket> tickets;
  {
    std::lock_guard lock(mutex_);
    // A flushed job that is still deferred must start now.
    for (auto it = deferred_.begin(); it != deferred_.end();) {
      if (std::find(jobs.begin(), jobs.end(), it->job.id) != jobs.end()) {
        start_deferred(*it);
        it = deferred_.erase(it);
      } else {
        ++it;
      }
    }
    for (const JobId id : jobs) {
      auto it = tickets_.find(id);
      if (it != tickets_.end()) tickets.push_back(it->second);
    }
  }
  for (const Ticket t : tickets) backend_->wait(t);
}

TransferStats TransferEngine::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

std::uint64_t TransferEngine::store_bytes_in_flight() const {
  std::lock_guard lock(mutex_);
  return store_bytes_held_;
}

bool TransferEngine::store_pressure() const {
  std::lock_guard lock(mutex_);
  const std::uint64_t bound = config_.max_store_bytes_in_flight;
  return bound > 0 && store_bytes_held_ >= bound - bound / 2;
}

}  // namespace kvoffload
