#pragma once

// Internal: the scheduler's state, shared by scheduler.cpp (steps, completion),
// scheduler_lookup.cpp (SEMANTICS 4) and scheduler_validate.cpp (SEMANTICS 8b).

#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvoffload/detail/flat_hash_map.hpp"
#include "kvoffload/detail/single_thread_guard.hpp"
#include "kvoffload/scheduler.hpp"
#include "registrations.hpp"
#include "request_table.hpp"

namespace kvoffload {

struct GroupState {
  std::vector<GpuBlockId> block_ids;  // the request's GPU blocks of this group, nulls included
  std::int64_t next_stored = 0;       // next offloaded block to store
  std::int64_t num_hit_blocks = 0;    // offloaded blocks hit at the first lookup
  // The host block each key was last seen in (-1: unknown). Every store touches all of the
  // request's keys; checking a remembered block (one compare) is much cheaper than finding
  // the key again in the manager's index. A stale entry is detected and refreshed.
  std::vector<HostBlockId> known_blocks;
};

struct RequestState {
  std::string id;
  std::int64_t num_tokens = 0;
  std::vector<BlockHash> hashes;
  bool remote_decode = false;
  bool looked_up = false;  // "known" in SEMANTICS 4: state exists once looked up
  bool finished = false;
  bool load_in_flight = false;
  std::uint64_t step_stamp = 0;  // the last build_step that validated this request
  std::size_t slot = 0;          // RequestTable's bookkeeping
  std::int64_t num_local_tokens = 0;
  std::vector<GroupState> groups;
  std::vector<JobId> jobs;  // in flight: one load, or any number of stores
};

struct JobState {
  JobId id = 0;
  JobKind kind = JobKind::store;
  RequestState* request = nullptr;
  std::vector<Key> keys;              // loads only (the "being loaded" set needs them)
  std::vector<HostBlockId> host_ids;  // stores: completed by block, without key lookups
  std::int64_t remaining = 0;         // worker reports still expected
  bool ok = true;
  // A store's source ids and per-group counts: window-group ids are registered (fenced) at
  // once, full-attention ids when the request finishes.
  std::vector<GpuBlockId> source_ids;
  std::vector<std::int64_t> group_sizes;
  bool full_registered = false;

  /// Empties the job for reuse, keeping its vectors' capacity.
  void recycle() {
    request = nullptr;
    keys.clear();
    host_ids.clear();
    remaining = 0;
    ok = true;
    source_ids.clear();
    group_sizes.clear();
    full_registered = false;
  }
};

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};

struct Scheduler::Impl {
  explicit Impl(const SchedulerConfig& config);

  // scheduler_validate.cpp: each throws invalid_argument, changing nothing.
  RequestState& find_record(std::string_view id, std::string_view op);
  RequestState& find_looked_up(std::string_view id, std::string_view op);
  void validate_hashes(const RequestState& r, std::span<const BlockHash> hashes) const;
  void validate_allocated(RequestState& r, std::span<const AllocatedGroup> groups,
                          std::int64_t num_external_tokens);
  void validate_step(std::span<const ScheduledRequest> scheduled,
                     std::span<const std::string> preempted);
  void validate_reports(std::span<const JobReport> reports);

  // scheduler_lookup.cpp
  std::optional<std::int64_t> lookup(RequestState& r, std::int64_t num_computed_tokens);

  // scheduler.cpp
  void on_allocated(RequestState& r, std::span<const AllocatedGroup> groups,
                    std::int64_t num_external_tokens);
  /// `blocks[g]`: offloaded blocks complete after the step (validate_step computed them).
  void build_store(RequestState& r, const ScheduledRequest& entry, const std::int64_t* blocks,
                   StepResult& out);
  void complete(JobState& job, std::vector<CompletedJob>& done);
  void forget(RequestState& r);
  /// A new entry in `jobs`, reusing a completed job's node and vectors when there is one:
  /// steady-state steps then allocate only the vectors handed to the worker.
  JobState& add_job(JobId id, JobKind kind, RequestState& r);
  void retire_job(JobId id);
  void touch(const RequestState& r);
  /// touch() right after prepare_store, reusing the blocks it found for the candidates
  /// (candidate_blocks, starting at candidate_start[g] for group g).
  void touch_stored(RequestState& r);
  void check(const TransferJob& job) const;
  /// Calls f(block) for each source id of a store job in groups that are (windowed == true)
  /// or are not windowed.
  template <class F>
  void for_each_source(const JobState& job, bool windowed, F&& fn) const {
    std::size_t at = 0;
    for (std::size_t g = 0; g < job.group_sizes.size(); ++g) {
      const auto n = static_cast<std::size_t>(job.group_sizes[g]);
      if (layouts[g].windowed() == windowed) {
        for (std::size_t i = at; i < at + n; ++i) fn(job.source_ids[i]);
      }
      at += n;
    }
  }

  /// SEMANTICS 7: a windowed group does not touch its first num_hit_blocks - window keys.
  [[nodiscard]] std::int64_t touch_skip(const RequestState& r, std::size_t g) const noexcept {
    return layouts[g].windowed()
               ? std::max<std::int64_t>(0, r.groups[g].num_hit_blocks - layouts[g].window_blocks)
               : 0;
  }
  [[nodiscard]] std::int64_t num_keys(const RequestState& r, std::size_t g) const noexcept {
    return static_cast<std::int64_t>(r.hashes.size()) / layouts[g].hash_factor;
  }
  [[nodiscard]] Key key(const RequestState& r, std::size_t g, std::int64_t i) const noexcept {
    return Key{r.hashes[static_cast<std::size_t>((i + 1) * layouts[g].hash_factor - 1)],
               static_cast<std::uint32_t>(g)};
  }

  SchedulerConfig config;
  std::vector<GroupLayout> layouts;
  std::vector<std::size_t> lookup_order;  // SEMANTICS 4.2
  bool any_windowed = false;
  std::int64_t f = 1;
  HostBlockManager manager;
  SchedulerStats stats;

  RequestTable<RequestState> requests;
  using Jobs = std::unordered_map<JobId, JobState>;
  Jobs jobs;
  std::vector<Jobs::node_type> spare_jobs;  // completed jobs kept for reuse (add_job)
  std::vector<TransferJob> pending_loads;   // planned by on_allocated, emitted by the next step
  std::vector<JobId> flush;                 // for the next step
  JobId next_job = 0;
  JobId stale_below = 0;  // reports of jobs below this id predate reset_cache()
  detail::FlatHashMap<Key, std::int32_t, KeyHash> being_loaded;  // key -> loads in flight
  Registrations registrations;  // GPU block id -> store jobs still reading it

  // Scratch buffers reused across calls so steps do not allocate per key.
  std::vector<Key> candidates;
  std::vector<Key> keys_to_store;
  std::vector<HostBlockId> host_ids;
  std::vector<Key> touch_keys;
  std::vector<HostBlockId> touch_ids;
  std::vector<HostBlockId> candidate_blocks;
  std::vector<std::uint8_t> candidate_stored;  // 1: prepare_store stored this candidate
  std::vector<std::size_t> candidate_start;
  std::vector<std::int64_t> candidate_end_;  // per group: n of the step being built
  std::vector<RequestState*> step_requests;  // validate_step's lookups, in entry order
  std::uint64_t step_stamp = 0;
  std::vector<std::int64_t> step_blocks;  // per entry, per group: offloadable / obs
  std::vector<std::uint8_t> step_idle;    // per entry: 1 if build_store would change nothing
  detail::FlatHashMap<JobId, std::int64_t, detail::IntHash> report_sums;
  std::uint64_t no_room_warnings = 0;
  detail::SingleThreadGuard one_thread;  // debug builds: concurrent calls throw
};

}  // namespace kvoffload
