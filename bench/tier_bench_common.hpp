#pragma once

// What the disk and shared tier benchmarks share: running the baseline tool, a host pool for timing
// tier jobs, their keys, and one engine (TierRig) for the "lookup to loaded block" measurement.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_common.hpp"
#include "kvoffload/config.hpp"
#include "kvoffload/scheduler.hpp"
#include "kvoffload/tiers/tier.hpp"
#include "kvoffload/worker.hpp"

namespace kvbench {

/// Runs a shell command (a baseline tool) and returns its standard output (nullopt if it
/// failed).
std::optional<std::string> capture(const std::string& command);

/// A host pool of `blocks` blocks in ordinary memory, filled with random bytes.
struct HostPool {
  HostPool(std::int64_t blocks, std::uint64_t bytes_per_block);
  std::span<std::byte> block(kvoffload::HostBlockId id);
  std::uint64_t block_bytes;
  std::vector<std::byte> bytes;
};

/// Block i's key (group 0); another salt gives other keys.
kvoffload::Key bench_key(std::int64_t i, std::uint64_t salt);

/// Times `n` blocks moved by tier jobs of `kind` (keys key_of(i), slots slot_of(i)) through a
/// pool of `pool_blocks` host blocks: writes as one job per lap over the pool, all submitted
/// at once; promotions, which may not fill a host block another promotion is still filling,
/// as jobs of half the pool each, the halves in turn, two in flight (each submitted once the
/// one two before it has finished). Job ids from `id` * 2^20. Throws naming the first job
/// that failed. Returns seconds.
double time_tier_jobs(kvoffload::Tier& tier, kvoffload::JobId id, kvoffload::JobKind kind,
                      std::int64_t n, std::int64_t pool_blocks,
                      const std::function<kvoffload::Key(std::int64_t)>& key_of,
                      const std::function<std::int64_t(std::int64_t)>& slot_of,
                      const std::function<kvoffload::HostBlockId(std::int64_t)>& write_block_of);

/// One engine: a scheduler with one tier below host memory (a disk or a shared tier) and a
/// worker (host backend) whose "GPU" cache is ordinary memory; one full-attention group,
/// factor 1, a prefix of kBlocks blocks. A fresh rig is another engine (or a restart): empty
/// host cache, the tier as it was.
struct TierRig {
  static constexpr std::int64_t kBlocks = 16;

  /// `tier` describes the tier once (its store included); the worker is derived from it. A
  /// disk tier's blocks are the worker's slots, its index restored from the worker's scan.
  TierRig(std::uint64_t page_bytes, kvoffload::TierConfig tier,
          std::vector<kvoffload::BlockHash> prefix);

  /// Runs the step's jobs on the worker, waits for them and reports them; returns their count.
  std::size_t run(const kvoffload::StepResult& out);
  /// Stores the prefix and writes it through to the tier; throws unless all of it was written.
  void fill();
  /// A request for the prefix: lookup (retry later while the tier answers and promotes), then
  /// allocation and the load. Returns the tokens loaded; throws if the prefix was not found.
  std::int64_t load(const std::string& request);

  std::vector<std::byte> gpu;
  std::unique_ptr<kvoffload::Worker> worker;
  std::unique_ptr<kvoffload::Scheduler> scheduler;
  std::vector<kvoffload::BlockHash> hashes;

 private:
  [[nodiscard]] std::vector<kvoffload::AllocatedGroup> alloc(kvoffload::GpuBlockId first) const;
  /// Lookups of `request` until one answers (steps run between them), at most `tries`.
  std::optional<std::int64_t> lookup(const std::string& request, int tries);
};

/// Lookup to loaded block: a `what` hit (a fresh rig from make() after a first one filled the
/// tier) against a host hit of the same request in the same rig, medians over the runs: JSON
/// with "<what>_hit", "host_hit" and "<what>_over_host".
nlohmann::json hit_latency(const Options& opt, const std::string& what, std::uint64_t page_bytes,
                           const std::function<std::unique_ptr<TierRig>()>& make);

}  // namespace kvbench
