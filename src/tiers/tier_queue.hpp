#pragma once

// The job bookkeeping every tier shares (tier.hpp): submitted jobs by id, their blocks queued,
// per-job progress, the finished list, waiting and stopping.
//
// Promotions first (issue 28): a promotion is what a waiting request needs, a write only keeps
// a copy, so take() hands out every queued promote block before any write block; each kind
// keeps its submission order.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvoffload/job.hpp"
#include "kvoffload/tiers/tier.hpp"

namespace kvoffload::detail {

/// Checks every host block of `job` exists (host_block throws invalid_argument otherwise) and
/// that a promotion fills each at most once, naming the job in the error.
void check_host_blocks(const TierJob& job,
                       const std::function<std::span<std::byte>(HostBlockId)>& host_block);

/// The first two positions holding equal values (i < j), or {0, 0} if all are distinct.
template <typename T>
std::pair<std::size_t, std::size_t> first_repeat(const std::vector<T>& values) {
  std::vector<std::size_t> order(values.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return values[a] != values[b] ? values[a] < values[b] : a < b;
  });
  for (std::size_t k = 1; k < order.size(); ++k) {
    if (values[order[k - 1]] == values[order[k]]) {
      return {std::min(order[k - 1], order[k]), std::max(order[k - 1], order[k])};
    }
  }
  return {0, 0};
}

class TierQueue {
 public:
  struct Job {
    TierJob job;
    std::int64_t remaining = 0;
    std::int64_t failed = 0;
    std::uint64_t clears = 0;  // start_clear calls before it was submitted
  };
  /// One block of a job: the job (alive until its last block is done) and the block's index
  /// into its lists.
  struct Task {
    Job* job = nullptr;
    std::size_t index = 0;
  };

  TierQueue(std::string name, bool failures_expected);
  ~TierQueue();
  TierQueue(const TierQueue&) = delete;
  TierQueue& operator=(const TierQueue&) = delete;

  /// Queues every block of `job` (a job without blocks finishes at once). Throws
  /// invalid_argument if a job of that id is still running.
  void submit(const TierJob& job);
  /// Appends up to `max` queued blocks to `out`, promote blocks before write blocks, each kind
  /// in submission order; waits for one unless `busy` (the caller has work in flight). False
  /// once stopping with nothing queued, nothing taken and not busy.
  bool take(std::vector<Task>& out, std::size_t max, bool busy);
  /// Counts one block done; the job finishes with its last block.
  void done(const Task& task, bool ok);
  std::vector<FinishedTierJob> get_finished();
  void wait(std::span<const JobId> jobs);
  [[nodiscard]] bool owns(JobId job) const;
  /// Starts emptying the tier on a thread of its own and returns at once: an ftruncate waits
  /// in the kernel for I/O in flight, which on a stalled device is forever, so never on the
  /// caller's (an engine step's) thread. No block is handed out meanwhile (take() waits), so
  /// a job submitted after runs on the emptied tier; a write of a job submitted before is
  /// skipped or erased (cleared_since). A clear asked for while one runs runs once more after
  /// it. A failure is logged (the old blocks stay unreachable: another epoch).
  void start_clear(std::function<void()> clear_contents);
  /// Returns once no clear is running.
  void wait_cleared();
  /// Joins the clear's thread (the tier kind's destructor, after its I/O threads stopped).
  void join_clear();
  /// Whether the tier was cleared since `task`'s job was submitted: its write is skipped, or,
  /// if it already landed, erased.
  [[nodiscard]] bool cleared_since(const Task& task) const noexcept {
    return task.job->clears != clears_.load();
  }
  void stop() noexcept;

 private:
  /// start_clear's thread: `clear`, again while asked for meanwhile; failures logged.
  void run_clear(const std::function<void()>& clear);

  std::string name_;
  bool failures_expected_;
  mutable std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable job_done_;
  std::unordered_map<JobId, std::unique_ptr<Job>> jobs_;  // submitted, not finished
  std::unordered_map<HostBlockId, JobId> filling_;        // host blocks promotions fill
  std::deque<Task> promotes_;                             // blocks of promote jobs, taken first
  std::deque<Task> writes_;                               // blocks of write jobs
  std::vector<FinishedTierJob> finished_;
  bool stopping_ = false;
  std::atomic<std::uint64_t> clears_{0};
  bool clearing_ = false;     // start_clear's thread runs: nothing is handed out
  bool clear_again_ = false;  // asked for again meanwhile
  std::thread clear_thread_;
};

}  // namespace kvoffload::detail
