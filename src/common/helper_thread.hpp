#pragma once

// One thread that runs posted work in order, beside the thread that posts it: the shared
// tier's I/O thread hands it each value's MAC check and reads the next reply meanwhile.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace kvoffload::detail {

class HelperThread {
 public:
  HelperThread() : thread_([this] { loop(); }) {}
  ~HelperThread() {
    {
      std::lock_guard lock(m_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();  // runs what was posted first
  }
  HelperThread(const HelperThread&) = delete;
  HelperThread& operator=(const HelperThread&) = delete;

  /// Runs `work` on the helper thread after what was posted before it. `work` reports its own
  /// failures: an exception escaping it is dropped (it must not end the process).
  void post(std::function<void()> work) {
    {
      std::lock_guard lock(m_);
      queue_.push_back(std::move(work));
    }
    cv_.notify_all();
  }

  /// Returns once everything posted so far has run (what it wrote is then visible here).
  void wait() {
    std::unique_lock lock(m_);
    cv_.wait(lock, [this] { return queue_.empty() && !running_; });
  }

 private:
  void loop() {
    std::unique_lock lock(m_);
    for (;;) {
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      std::function<void()> work = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
      lock.unlock();
      try {
        work();
      } catch (...) {  // NOLINT(bugprone-empty-catch): see post()
      }
      lock.lock();
      running_ = false;
      if (queue_.empty()) cv_.notify_all();
    }
  }

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool running_ = false;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the rest is ready
};

}  // namespace kvoffload::detail
