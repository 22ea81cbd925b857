#pragma once

// Test helpers: configurations, chain hashes, and a Harness that drives a Scheduler the way an
// engine does (update, lookup, alloc, step, complete) with short calls.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvoffload/scheduler.hpp"

namespace kvtest {

using namespace kvoffload;

/// Chain hashes: hash i depends on `seed` and i, so equal seeds share prefixes.
std::vector<BlockHash> chain_hashes(std::string_view seed, std::size_t count);
/// Hashes equal to `prefix` then `count - prefix.size()` more from `seed`.
std::vector<BlockHash> extend_hashes(std::vector<BlockHash> prefix, std::string_view seed,
                                     std::size_t count);

GroupConfig full(std::int64_t gpu_block_size = 16);
GroupConfig window(std::int64_t sliding_window, std::int64_t gpu_block_size = 16);
GroupConfig mamba(std::int64_t gpu_block_size = 16);

SchedulerConfig make_config(std::vector<GroupConfig> groups, std::int64_t f,
                            std::int64_t host_blocks, std::int64_t hash_block_size = 16,
                            std::int64_t num_workers = 1);

/// `count` consecutive GPU ids from `first`, preceded by `nulls` null blocks.
std::vector<GpuBlockId> ids(GpuBlockId first, std::int64_t count, std::int64_t nulls = 0);

/// The result of a step or events call as JSON, for comparing two runs.
nlohmann::json to_json(const StepResult& step);
nlohmann::json to_json(const std::vector<ManagerEvent>& events);

struct Harness {
  explicit Harness(const SchedulerConfig& config, SchedulerServices services = {})
      : s(config, std::move(services)) {}

  /// update_request + lookup.
  std::optional<std::int64_t> lookup(const std::string& req, const std::vector<BlockHash>& hashes,
                                     std::int64_t num_tokens, std::int64_t computed = 0);
  /// on_allocated with external tokens 0 and the right number of empty groups.
  void alloc_none(const std::string& req);
  /// One step scheduling `req` alone with new blocks per group.
  StepResult step(const std::string& req, std::int64_t computed, std::int64_t scheduled,
                  std::vector<std::vector<GpuBlockId>> new_ids, bool resumed = false);
  /// Completes `job` with `num_workers` ok reports.
  std::vector<CompletedJob> complete(JobId job, bool ok = true);

  /// Puts key (hashes[index], group) of a request with these hashes into the cache (ready, or
  /// writing if !ready) by storing it from a donor request whose other blocks are null.
  /// `index` counts the group's blocks. Needs block_size_factor 1. Returns the store job id.
  JobId place(const std::vector<BlockHash>& hashes, std::size_t group, std::size_t index,
              bool ready = true);

  Scheduler s;
  int donors = 0;
  GpuBlockId next_gpu_id = 100000;
};

}  // namespace kvtest
