#pragma once

// A synthetic serving engine: requests with shared prefixes go through the scheduler, the host
// block manager, the pinned pool and the transfer engine (HostBackend) over a real KV layout in
// host memory, step after step, with eviction pressure and preemption. Every block loaded back
// is compared byte for byte with what the request would have computed. Used by kvoffload-demo,
// the end-to-end test, the benchmark and the soak run.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvoffload/config.hpp"

namespace kvsim {

struct SimConfig {
  std::uint64_t seed = 1;
  std::int64_t steps = 2000;
  std::vector<kvoffload::GroupConfig> groups = {{kvoffload::GroupKind::full_attention, 16, 0},
                                                {kvoffload::GroupKind::sliding_window, 16, 128},
                                                {kvoffload::GroupKind::mamba, 16, 0}};
  std::int64_t block_size_factor = 4;
  std::int64_t hash_block_size = 16;
  int layers = 2;                 ///< per-layer K and V tensors per group
  std::int64_t page_bytes = 256;  ///< bytes of one GPU page of one tensor
  std::int64_t gpu_blocks = 4096;
  std::int64_t host_blocks = 192;  ///< small: eviction pressure
  int max_running = 8;
  int prefix_families = 4;  ///< requests share prefixes from this many families
  double preempt_probability = 0.01;
  std::string policy = "lru";
  bool defer_stores = true;
  bool verify = true;  ///< compare every loaded byte (off for speed measurements)
  int copy_threads = 0;
};

struct SimReport {
  std::int64_t steps = 0;
  std::int64_t requests_finished = 0;
  std::int64_t store_jobs = 0;
  std::int64_t load_jobs = 0;
  std::int64_t lookup_hits = 0;
  std::int64_t blocks_verified = 0;  ///< GPU blocks compared after loads
  std::int64_t mismatches = 0;       ///< pages that differed: must be 0
  std::int64_t preemptions = 0;
  std::uint64_t evictions = 0;
  std::uint64_t bytes_stored = 0;
  std::uint64_t bytes_loaded = 0;
  double seconds = 0;
  std::string first_mismatch;  ///< where, if any
};

class SyntheticEngine {
 public:
  explicit SyntheticEngine(const SimConfig& config);
  ~SyntheticEngine();
  SyntheticEngine(const SyntheticEngine&) = delete;
  SyntheticEngine& operator=(const SyntheticEngine&) = delete;

  /// Runs one step; the report so far.
  const SimReport& step();
  /// Runs config.steps steps, calling `progress` every `every` steps.
  SimReport run(const std::function<void(const SimReport&)>& progress = {},
                std::int64_t every = 1000);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvsim
