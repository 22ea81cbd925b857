#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kvoffload/backend.hpp"

namespace kvoffload {
namespace detail {
template <class Task>
class CopyTaskQueue;
}  // namespace detail

struct HostBackendConfig {
  int threads = 0;  ///< copy threads (0: all cores)
  /// Plans are cut into tasks of about this many bytes (large descriptors are split), so a
  /// big job spreads over every thread and a queue lock is taken once per task, not per
  /// descriptor.
  std::uint64_t task_bytes = std::uint64_t{4} << 20;
  /// Threads take queued load tasks before store tasks (false: one queue in submission
  /// order, the behaviour before issue 30; kvoffload-bench loads measures both).
  bool loads_first = true;
};

/// A real backend for machines without a GPU (and for CPU-side KV caches): worker threads run
/// each plan's descriptors with memcpy over ordinary memory. Results per direction come out
/// in submission order. Loads run ahead of stores: a thread takes every queued load task
/// before any store task, so a load waits only for the store tasks already running. A plan with a
/// null or overlapping descriptor fails instead of copying. Thread-safety: as Backend (submit, poll
/// and wait from any threads; one lock inside).
class KVOFFLOAD_EXPORT HostBackend final : public Backend {
 public:
  explicit HostBackend(const HostBackendConfig& config = {});
  /// Cancels what has not run and joins the threads.
  ~HostBackend() override;
  HostBackend(const HostBackend&) = delete;
  HostBackend& operator=(const HostBackend&) = delete;

  Ticket submit(CopyPlan plan) override;
  void poll(std::vector<BackendResult>& finished) override;
  void wait(Ticket ticket) override;
  void shutdown(bool drain) override;

  [[nodiscard]] int threads() const noexcept { return static_cast<int>(workers_.size()); }

 private:
  struct Job;
  struct Task {
    Job* job;
    std::size_t first, last;       // descriptors [first, last)
    std::uint64_t offset, length;  // a slice of descriptor `first` when last == first + 1
  };

  void run_worker();
  void finish_task(Job& job);

  HostBackendConfig config_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable job_done_;
  std::unique_ptr<detail::CopyTaskQueue<Task>> tasks_;  // loads before stores
  std::deque<std::unique_ptr<Job>> in_order_[2];        // per direction, submission order
  Ticket next_ticket_ = 1;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace kvoffload
