#pragma once

// kvoffload-bench trace: production traffic through the real scheduler, host cache and tiers
// (issue 50). A trace in the Mooncake format (JSON lines: timestamp, input_length,
// output_length, hash_ids: one id per 512-token block, ids chaining like prefix hashes) is
// replayed request by request: the longest prefix of its blocks found in host memory or a
// tier is a hit (promotions run on the real disk tier and the real shared tier on a Valkey
// cluster), then every block of the request is stored. Hit ratios are token-weighted: a full
// block counts block_tokens, the last block the request's remaining tokens. Several processes
// given slices of one trace, the same --shared cluster and name, and --pace with one
// --start-at are a fleet sharing KV (scripts/trace-fleet).

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_common.hpp"

namespace kvbench {

/// One request of a trace.
struct TraceRequest {
  std::int64_t timestamp_ms = 0;
  std::int64_t input_length = 0;  ///< prompt tokens
  std::vector<std::uint64_t> hash_ids;
};

/// Reads a Mooncake trace (JSON lines) from `in`: at most `limit` requests (0: all). Every line
/// is bounded (1 MiB, 65536 ids) before it is kept; throws kvoffload::invalid_argument naming
/// the line and field for a malformed one (an input_length its blocks of `block_tokens` do
/// not fit included).
std::vector<TraceRequest> read_mooncake_trace(std::istream& in, std::size_t limit,
                                              std::int64_t block_tokens);

/// What `kvoffload-bench trace` replays against.
struct TraceOptions {
  std::string file;                 ///< the trace ("-": standard input)
  std::int64_t block_tokens = 512;  ///< tokens per hash id
  double host_tokens = 3e6;         ///< the host cache's capacity in tokens
  double disk_tokens = 0;           ///< a disk tier of this many tokens (0: none)
  std::string disk_dir;             ///< its directory (needed with disk_tokens)
  std::string policy = "lru";       ///< lru or arc, for the host cache and the tier
  std::int64_t store_threshold = 0;
  std::int64_t block_bytes = 4096;  ///< bytes per block moved (scaled down; see the output)
  std::size_t limit = 0;            ///< requests replayed (0: all)
  /// Bytes per token at full size, for the output's "full size" figures (Llama-3-8B bf16:
  /// 32 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes = 128 KiB).
  std::int64_t model_bytes_per_token = 131072;
  /// A shared tier: the cluster's seed nodes ("" none), the fleet's name (its keys' namespace:
  /// engines that share give the same; every shared run has one weights identity, so the name
  /// alone keeps fleets apart), the fleet secret's file
  /// (else KVOFFLOAD_SHARED_SECRET), and how many tokens this engine's index of the cluster's
  /// keys may name (the cluster's memory bounds what it holds).
  std::string shared_nodes;
  std::string shared_name;
  std::string shared_secret_file;
  double shared_tokens = 1.34e8;
  /// Arrival times kept, sped up this many times (0: every request at once, as fast as it
  /// goes); the clock starts at start_at_ms (Unix milliseconds; 0: now), so processes of a
  /// fleet replay in step.
  double pace = 0;
  std::int64_t start_at_ms = 0;
  /// The trace time (ms) the clock's start stands for (-1: the first request's), so that
  /// processes given slices of one trace keep the trace's own timing between them.
  std::int64_t origin_ms = -1;
  /// The JSON keeps every request's time from lookup to loaded (a fleet's quantiles).
  bool latency_samples = false;
  /// Policy reuse's "conversation continues" hint, drawn from the trace's future and right
  /// with this probability (0: no hint; continue_hints), and its generator's seed.
  double hint_accuracy = 0;
  std::uint64_t hint_seed = 1;
};

/// Tokens of block i of a request: block_tokens, the last one what remains of the prompt.
std::int64_t block_tokens_of(const TraceRequest& r, std::size_t i, std::int64_t block_tokens);
/// The blocks a real engine would hash and could store or hit: the full ones (a partial last
/// block has no hash in vLLM or SGLang; the next turn rehashes it with more tokens).
std::size_t full_blocks(const TraceRequest& r, std::int64_t block_tokens);
/// The request's prompt tokens, as its blocks count them.
std::int64_t prompt_tokens(const TraceRequest& r, std::int64_t block_tokens);

/// The token-weighted hit ratio a cache that never evicts reaches on `trace`: per request,
/// the longest prefix of its full blocks seen in any earlier request (the bound).
double infinite_hit_ratio(const std::vector<TraceRequest>& trace, std::int64_t block_tokens);

/// The token-weighted hit ratio of the offline optimum with `capacity_blocks` blocks: Belady's
/// rule (evict the held block whose next use is farthest; admit no block used later than every
/// held one), the whole trace known in advance (bench/trace_optimum.cpp). What any eviction
/// policy of that capacity could approach: the curve's reference beside LRU and ARC.
double optimum_hit_ratio(const std::vector<TraceRequest>& trace, std::int64_t block_tokens,
                         std::int64_t capacity_blocks);

/// Per request: 1 if a later request extends its whole prompt (its full blocks), the last
/// request to use its deepest block; else 0 (bench/trace_hints.cpp).
std::vector<char> continued_requests(const std::vector<TraceRequest>& trace,
                                     std::int64_t block_tokens);
/// Per request, the "conversation continues" hint policy reuse is given: continued_requests
/// with probability `accuracy`, its opposite otherwise (seeded); all -1 (none) for accuracy 0.
std::vector<std::int8_t> continue_hints(const std::vector<TraceRequest>& trace,
                                        std::int64_t block_tokens, double accuracy,
                                        std::uint64_t seed);

nlohmann::json run_trace(const Options& opt, const TraceOptions& trace);

}  // namespace kvbench
