#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <unordered_set>
#include <vector>

#include "kvoffload/backend.hpp"
#include "kvoffload/export.hpp"

namespace kvoffload {

/// What a FaultyBackend does to the plans it passes on, each decided at random per plan.
struct FaultConfig {
  std::uint64_t seed = 1;
  /// Fail the plan: only its first half of descriptors is copied (a transfer that broke off),
  /// and its result says ok == false. A failed store's host block and a failed load's GPU
  /// blocks hold partial data, which nothing may serve.
  double fail = 0.0;
  /// Hold the finished result back for 1..max_delay_polls polls.
  double delay = 0.0;
  int max_delay_polls = 8;
  /// Release results in random order instead of submission order (breaking the Backend
  /// promise on purpose, to show that nothing above relies on it for correctness).
  bool reorder = false;
};

/// A Backend that wraps another (usually a HostBackend) and injects failures, delays and
/// reordering into its completions, for fault-injection tests of engines and of kvoffload
/// itself. wait() still waits for the copy itself, so a flush fence stays a real fence.
/// Thread-safety: as Backend.
class KVOFFLOAD_EXPORT FaultyBackend final : public Backend {
 public:
  FaultyBackend(std::unique_ptr<Backend> inner, const FaultConfig& config);
  ~FaultyBackend() override;

  Ticket submit(CopyPlan plan) override;
  void poll(std::vector<BackendResult>& finished) override;
  void wait(Ticket ticket) override;
  void shutdown(bool drain) override;
  ComputeMark mark_compute() noexcept override { return inner_->mark_compute(); }
  void drop_mark(ComputeMark mark) noexcept override { inner_->drop_mark(mark); }

  struct Counts {
    std::uint64_t plans = 0, failed = 0, delayed = 0, reordered_batches = 0;
  };
  [[nodiscard]] Counts counts() const;

 private:
  struct Held {
    BackendResult result;
    int polls_left = 0;
  };

  std::unique_ptr<Backend> inner_;
  FaultConfig config_;
  mutable std::mutex mutex_;
  std::mt19937_64 rng_;
  std::unordered_set<Ticket> failing_;
  std::deque<Held> held_;
  std::vector<BackendResult> fresh_;
  Counts counts_;
};

}  // namespace kvoffload
