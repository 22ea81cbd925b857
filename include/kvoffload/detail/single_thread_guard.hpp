#pragma once

#include <atomic>

#include "kvoffload/error.hpp"

namespace kvoffload::detail {

/// Detects a single-threaded object being entered by two threads at once: each public call
/// holds a Scope, and a second concurrent Scope throws kvoffload::error naming the call. The
/// Scheduler uses it in debug builds (its contract: one thread at a time); it costs one atomic
/// exchange per call.
class SingleThreadGuard {
 public:
  class Scope {
   public:
    Scope(SingleThreadGuard& guard, const char* what) : guard_(guard) {
      if (guard_.busy_.exchange(true, std::memory_order_acquire)) {
        throw error(std::string(what) +
                    ": called while another thread is inside the scheduler; a Scheduler is "
                    "single-threaded by contract (one thread, or a lock around every call)");
      }
    }
    ~Scope() { guard_.busy_.store(false, std::memory_order_release); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    SingleThreadGuard& guard_;
  };

 private:
  std::atomic<bool> busy_{false};
};

}  // namespace kvoffload::detail
