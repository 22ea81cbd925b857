// The "conversation continues" hint `kvoffload-bench trace --hint-accuracy` gives policy reuse
// (issue 55): what a chat front end or router knows and a trace lacks, so it is drawn from the
// trace's own future, right with a given probability. A study of what such a signal is worth,
// never a figure of the policy alone.

#include <random>
#include <span>
#include <unordered_map>

#include "trace_bench.hpp"

namespace kvbench {

std::vector<char> continued_requests(const std::vector<TraceRequest>& trace,
                                     std::int64_t block_tokens) {
  std::vector<char> continued(trace.size(), 0);
  std::unordered_map<std::uint64_t, std::size_t> last_user;  // full block -> request
  for (std::size_t k = 0; k < trace.size(); ++k) {
    const auto ids = std::span(trace[k].hash_ids).first(full_blocks(trace[k], block_tokens));
    std::size_t m = 0;
    while (m < ids.size() && last_user.contains(ids[m])) ++m;
    if (m > 0) {
      // The last request to use its deepest known block, if this one extends its whole prompt.
      const std::size_t p = last_user.at(ids[m - 1]);
      if (m >= full_blocks(trace[p], block_tokens)) continued[p] = 1;
    }
    for (const std::uint64_t id : ids) last_user[id] = k;
  }
  return continued;
}

std::vector<std::int8_t> continue_hints(const std::vector<TraceRequest>& trace,
                                        std::int64_t block_tokens, double accuracy,
                                        std::uint64_t seed) {
  std::vector<std::int8_t> hints(trace.size(), -1);
  if (accuracy <= 0) return hints;
  const std::vector<char> continued = continued_requests(trace, block_tokens);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (std::size_t k = 0; k < trace.size(); ++k) {
    const bool right = u(rng) < accuracy;
    hints[k] = static_cast<std::int8_t>((continued[k] != 0) == right ? 1 : 0);
  }
  return hints;
}

}  // namespace kvbench
