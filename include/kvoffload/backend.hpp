#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvoffload/copy_planner.hpp"
#include "kvoffload/export.hpp"

namespace kvoffload {

/// A backend's handle for one submitted plan; increases from 1.
using Ticket = std::uint64_t;

/// A finished plan. ok == false means its bytes must not be trusted (error says why).
struct BackendResult {
  Ticket ticket = 0;
  JobId job = 0;
  JobKind kind = JobKind::store;
  bool ok = true;
  std::string error;
  std::uint64_t bytes = 0;
  double seconds = 0;  ///< from submit to completion
};

/// Runs copy plans asynchronously. Results of one direction come out in submission order.
/// Thread-safety: submit and poll may be called from different threads; each is internally
/// synchronized.
class KVOFFLOAD_EXPORT Backend {
 public:
  virtual ~Backend();

  /// Starts the plan's copies and returns its ticket. The plan is moved in.
  virtual Ticket submit(CopyPlan plan) = 0;
  /// Appends the plans finished since the last call, in submission order per direction, and
  /// never blocks.
  virtual void poll(std::vector<BackendResult>& finished) = 0;
  /// Blocks until `ticket` has finished (its result still comes out of poll).
  virtual void wait(Ticket ticket) = 0;
  /// Stops the backend: with drain, runs everything submitted first; without, plans not
  /// finished fail with "cancelled". Later submits fail at once. Idempotent.
  virtual void shutdown(bool drain) = 0;
  /// Marks the engine's work queued so far (the forward pass a deferred store reads), for a
  /// plan submitted later with this compute_mark: it then waits for that work and not for
  /// engine work queued in between. 0 when there is nothing to wait for (the default: a
  /// backend without a compute stream). Never throws.
  virtual ComputeMark mark_compute() noexcept { return 0; }
  /// Forgets a mark that no plan will use (its store was shed or could not start); unknown
  /// or used marks are ignored.
  virtual void drop_mark(ComputeMark /*mark*/) noexcept {}
};

}  // namespace kvoffload
