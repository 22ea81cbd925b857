#pragma once

// The HostBackend's queue of copy tasks (issue 30: loads ahead of stores). A load gates a
// request's first token, a store only keeps a copy: pop() hands out every queued load task
// before any store task, each kind in submission order. A load submitted behind a flood of
// stores therefore waits only for the store tasks already running (one per copy thread, each
// at most a task's bytes), never for the queued ones.
//
// Not synchronized: the backend holds its lock around every call.

#include <cstddef>
#include <deque>
#include <optional>

#include "kvoffload/enums.hpp"

namespace kvoffload::detail {

template <class Task>
class CopyTaskQueue {
 public:
  void push(JobKind kind, const Task& task) {
    (kind == JobKind::load ? loads_ : stores_).push_back(task);
  }
  /// The next task to run: the oldest load, else the oldest store.
  std::optional<Task> pop() {
    for (std::deque<Task>* q : {&loads_, &stores_}) {
      if (!q->empty()) {
        Task t = q->front();
        q->pop_front();
        return t;
      }
    }
    return std::nullopt;
  }
  [[nodiscard]] bool empty() const noexcept { return loads_.empty() && stores_.empty(); }
  /// Removes every queued task, calling f on each (loads first).
  template <class F>
  void drain(F&& f) {
    for (std::deque<Task>* q : {&loads_, &stores_}) {
      for (const Task& t : *q) f(t);
      q->clear();
    }
  }

 private:
  std::deque<Task> loads_;
  std::deque<Task> stores_;
};

}  // namespace kvoffload::detail
