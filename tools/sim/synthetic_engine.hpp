#pragma once

// A synthetic serving engine: requests with shared prefixes go through the scheduler, the host
// block manager, the pinned pool and the transfer engine (HostBackend) over a real KV layout in
// host memory, step after step, with eviction pressure and preemption. Every block loaded back
// is compared byte for byte with what the request would have computed. Used by kvoffload-demo,
// the end-to-end test, the scheduler property test (through `observer`), the benchmark and the
// soak run.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kvoffload/config.hpp"
#include "kvoffload/host_block_manager.hpp"
#include "kvoffload/scheduler.hpp"
#include "kvoffload/testing/faulty_backend.hpp"

namespace kvsim {

/// What one step did, for an oracle outside the engine (SimConfig::observer). Valid during the
/// call only.
struct StepObservation {
  const kvoffload::Scheduler& scheduler;
  const std::vector<kvoffload::ScheduledRequest>& entries;
  const kvoffload::StepResult& out;
  /// Events taken before reset_cache (when `reset`), and those since (after build_step).
  const std::vector<kvoffload::ManagerEvent>& events_before_reset;
  const std::vector<kvoffload::ManagerEvent>& events;
  bool reset = false;  ///< reset_cache() ran right before this build_step
  /// GPU blocks this step writes: the forward pass, local prefix-cache hits, the loads.
  const std::unordered_set<kvoffload::GpuBlockId>& written;
  /// Store jobs whose copy may still run (neither flushed nor reported finished by the
  /// worker), with the GPU blocks they read.
  const std::unordered_map<kvoffload::JobId, std::vector<kvoffload::GpuBlockId>>& stores_running;
};

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
  std::int64_t num_workers = 1;  ///< reports per job (the engine stands in for every worker)
  bool prefix_caching = true;
  std::int64_t store_threshold = 0;
  double local_hit_probability = 0;  ///< a start finds a prefix in the GPU prefix cache
  double reset_probability = 0;      ///< reset_cache() before a step
  /// A worker reports a job failed although its copy succeeded (not with check_invariants,
  /// whose shadow cache follows the copies).
  double report_failure_probability = 0;
  /// Reports of a finished transfer trickle in over the next steps (1 or 2 at a time) instead
  /// of all at once.
  bool staggered_reports = false;
  std::function<void(const StepObservation&)> observer;
  bool defer_stores = true;
  bool verify = true;  ///< compare every loaded byte (off for speed measurements)
  int copy_threads = 0;
  /// Fault injection: wrap the HostBackend in a FaultyBackend with these settings.
  bool faulty = false;
  kvoffload::FaultConfig faults;
  /// Check the reliability invariants after every step (and drain at the end of run()):
  /// a key is ready in the host cache exactly when a store of it succeeded and it was not
  /// evicted since; every load job loads only such keys; every failed load is reported to
  /// the engine as failed; when all jobs are done no block is writing or being read.
  bool check_invariants = false;
  /// A disk tier below the host cache (off when empty): its directory and capacity. Blocks
  /// the host cache evicts are promoted back from it and verified like any other load; the
  /// same directory in a later run (same seed) is found again after the restart.
  std::string disk_dir;
  std::uint64_t disk_capacity = 64ull << 20;
  std::int64_t disk_store_threshold = 0;
  bool disk_write_back = false;  ///< write blocks to the disk when evicted, not when stored
  /// A shared tier on a Valkey cluster (off when empty): seed nodes "host:port[,...]", below
  /// the disk tier if there is one. Engines with the same seed and name share their blocks.
  std::string shared_nodes;
  std::string shared_name = "kvoffload-demo synthetic";
  std::int64_t shared_store_threshold = 0;  ///< admission (a huge value: read-only)
  int shared_reply_timeout_ms = 1000;
  /// The fleet secret: a file holding it (empty: the environment's KVOFFLOAD_SHARED_SECRET);
  /// insecure runs without one (a public secret, with a warning).
  std::string shared_secret_file;
  bool shared_insecure = false;
  /// AUTH (an ACL user; the password from a file, else KVOFFLOAD_SHARED_PASSWORD) and TLS
  /// (on when a CA file is given).
  std::string shared_username;
  std::string shared_password_file;
  std::string shared_tls_ca_file;
  std::string shared_tls_server_name;
  /// Block tables as vLLM makes them (issue 54): before each step's allocations, window blocks
  /// wholly before the window of the computed tokens are freed (vLLM's remove_skipped_blocks)
  /// and go back to the free list, where the next allocation, another request's in this very
  /// step, takes them at once; mamba groups retire older states now and then. The engine's copy
  /// of a table shows the nulls; the scheduler learns of none.
  bool vllm_tables = true;
  /// Mamba groups allocate like vLLM's align mode: a step's new positions are null pads but
  /// the last, which receives the state ([0, 0, hit, 0, state]). At f > 1 most mamba blocks are
  /// then stored partly written, and those never go to a tier (docs/semantics.md 6.8): off by
  /// default so the demo's tiers see mamba blocks; the property test turns it on at random.
  bool mamba_pads = false;
  /// Decode steps as under speculative decoding (issue 47): each schedules the sampled token
  /// and 0-3 draft tokens, a random number of which are accepted; attention KV past the
  /// accepted tokens is a rejected draft's (rewritten later), and a mamba block written by a
  /// decode step holds a decode-time state (advanced over the drafts, computed one token at a
  /// time), unlike the state a prefill computes, which is what a later request must load.
  bool spec_decode = false;
  /// The engine gives each request's final tokens (Scheduler::limit_state_stores: its prompt,
  /// or what a resumed request recomputes) at every lookup, as the vLLM connector does, and
  /// chunks prefills at block boundaries as vLLM's align mode does (a state lands where a step
  /// ends). Off by default: the demo's engine keeps a state at every block's end and does not
  /// speculate. The property test turns it on; its control turns it off under spec_decode.
  bool final_states = false;
  /// Every job and every shared-tier existence check finishes in the step that started it
  /// (the engine waits for them): a run is then a function of its seed and the tiers'
  /// contents, not of timing, so two runs can be compared block for block (the two-process
  /// test). Off by default: a real engine overlaps them with compute.
  bool lockstep = false;
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
  // Fault injection and invariants (check_invariants).
  std::uint64_t injected_failures = 0;     ///< plans the FaultyBackend failed
  std::uint64_t delayed_results = 0;       ///< results it held back
  std::int64_t failed_loads_reported = 0;  ///< loads the scheduler reported failed
  std::int64_t failed_stores = 0;
  std::uint64_t stores_without_room = 0;  ///< store attempts with the host cache full
  std::int64_t invariant_checks = 0;
  std::int64_t invariant_violations = 0;  ///< must be 0
  std::int64_t local_hits = 0;            ///< starts with a GPU prefix-cache hit
  std::int64_t resets = 0;
  /// Pages a load brought from host sub-blocks that their store skipped (leading null
  /// sub-blocks): each is also a mismatch (SEMANTICS 6.8 forbids them in every group kind).
  std::int64_t unwritten_reads = 0;
  /// The scheduler's counts of blocks stored from a sub-block > 0 and of lookups that refused
  /// one (the run exercised the rule).
  std::uint64_t partial_stores = 0;
  std::uint64_t partial_misses = 0;
  std::string first_violation;
  // The disk tier (disk_dir set).
  std::int64_t disk_slots = 0;
  std::int64_t disk_restored = 0;     ///< keys found by the scan at start
  std::uint64_t disk_promotions = 0;  ///< blocks promoted into host memory
  std::uint64_t disk_failed_promotions = 0;
  std::uint64_t disk_blocks_written = 0;
  std::uint64_t disk_failed_writes = 0;
  std::uint64_t disk_evictions = 0;
  // The shared tier (shared_nodes set): the scheduler's counters and the worker's.
  std::uint64_t shared_checks = 0;      ///< existence checks (one per request)
  std::uint64_t shared_found = 0;       ///< keys the checks found
  std::uint64_t shared_promotions = 0;  ///< blocks promoted into host memory
  std::uint64_t shared_failed_promotions = 0;
  std::uint64_t shared_blocks_written = 0;
  std::uint64_t shared_failed_writes = 0;
  std::uint64_t shared_bad_values = 0;   ///< values refused (header, length, checksum)
  std::uint64_t shared_read_errors = 0;  ///< GETs without a usable reply
  bool drained = false;  ///< run() ended with every job finished and the checks above
};

class SyntheticEngine {
 public:
  explicit SyntheticEngine(const SimConfig& config);
  ~SyntheticEngine();
  SyntheticEngine(const SyntheticEngine&) = delete;
  SyntheticEngine& operator=(const SyntheticEngine&) = delete;

  /// Runs one step; the report so far.
  const SimReport& step();
  /// Stops admitting work and finishes every job in flight, then checks that no host block is
  /// left writing or being read (part of run() when check_invariants is set).
  void drain();
  /// Runs config.steps steps, calling `progress` every `every` steps.
  SimReport run(const std::function<void(const SimReport&)>& progress = {},
                std::int64_t every = 1000);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvsim
