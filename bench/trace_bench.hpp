#pragma once

// kvoffload-bench trace: production traffic through the real scheduler, host cache and tiers
// (issue 50). A trace in the Mooncake format (JSON lines: timestamp, input_length,
// output_length, hash_ids: one id per 512-token block, ids chaining like prefix hashes) is
// replayed request by request: the longest prefix of its blocks found in host memory or a
// tier is a hit (promotions run on the real disk tier), then every block of the request is
// stored. Hit ratios are token-weighted: a full block counts block_tokens, the last block the
// request's remaining tokens.

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
};

/// The token-weighted hit ratio a cache that never evicts reaches on `trace`: per request,
/// the longest prefix of its blocks seen in any earlier request (the bound).
double infinite_hit_ratio(const std::vector<TraceRequest>& trace, std::int64_t block_tokens);

nlohmann::json run_trace(const Options& opt, const TraceOptions& trace);

}  // namespace kvbench
