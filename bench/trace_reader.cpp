// The Mooncake trace's reader and the figures computed from the trace alone (trace_bench.hpp).

#include <algorithm>
#include <istream>
#include <unordered_set>

#include "kvoffload/error.hpp"
#include "trace_bench.hpp"

namespace kvbench {

using kvoffload::invalid_argument;

namespace {

constexpr std::size_t kMaxLine = 1 << 20;    // a request's line (the trace's longest: ~3 KB)
constexpr std::size_t kMaxBlocks = 1 << 16;  // hash ids per request

/// The next line of `in` into `line`, refused past kMaxLine before more is kept. False at
/// the end.
bool bounded_line(std::istream& in, std::string& line, std::size_t number) {
  line.clear();
  int c = 0;
  while ((c = in.get()) != std::char_traits<char>::eof()) {
    if (c == '\n') return true;
    if (line.size() == kMaxLine) {
      throw invalid_argument("trace line " + std::to_string(number) + ": longer than " +
                             std::to_string(kMaxLine) + " bytes");
    }
    line.push_back(static_cast<char>(c));
  }
  return !line.empty();
}

std::int64_t int_field(const nlohmann::json& j, const char* name, std::size_t number) {
  const auto it = j.find(name);
  if (it == j.end() || !it->is_number_integer() || it->get<std::int64_t>() < 0) {
    throw invalid_argument("trace line " + std::to_string(number) + ": \"" + name +
                           "\" must be a non-negative integer");
  }
  return it->get<std::int64_t>();
}

}  // namespace

std::int64_t block_tokens_of(const TraceRequest& r, std::size_t i, std::int64_t block_tokens) {
  if (i + 1 < r.hash_ids.size()) return block_tokens;
  const std::int64_t rest =
      r.input_length - block_tokens * static_cast<std::int64_t>(r.hash_ids.size() - 1);
  return std::clamp<std::int64_t>(rest, 0, block_tokens);
}

std::size_t full_blocks(const TraceRequest& r, std::int64_t block_tokens) {
  const std::size_t n = r.hash_ids.size();
  return n > 0 && block_tokens_of(r, n - 1, block_tokens) < block_tokens ? n - 1 : n;
}

std::int64_t prompt_tokens(const TraceRequest& r, std::int64_t block_tokens) {
  std::int64_t t = 0;
  for (std::size_t i = 0; i < r.hash_ids.size(); ++i) t += block_tokens_of(r, i, block_tokens);
  return t;
}

std::vector<TraceRequest> read_mooncake_trace(std::istream& in, std::size_t limit,
                                              std::int64_t block_tokens) {
  std::vector<TraceRequest> out;
  std::string line;
  for (std::size_t number = 1; (limit == 0 || out.size() < limit) && bounded_line(in, line, number);
       ++number) {
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      throw invalid_argument("trace line " + std::to_string(number) + ": not JSON: " + e.what());
    }
    if (!j.is_object()) {
      throw invalid_argument("trace line " + std::to_string(number) + ": not a JSON object");
    }
    TraceRequest r;
    r.timestamp_ms = int_field(j, "timestamp", number);
    r.input_length = int_field(j, "input_length", number);
    const auto ids = j.find("hash_ids");
    if (ids == j.end() || !ids->is_array() || ids->empty() || ids->size() > kMaxBlocks) {
      throw invalid_argument("trace line " + std::to_string(number) +
                             ": \"hash_ids\" must be an array of 1 to " +
                             std::to_string(kMaxBlocks) + " ids");
    }
    for (const auto& id : *ids) {
      if (!id.is_number_unsigned()) {
        throw invalid_argument("trace line " + std::to_string(number) +
                               ": \"hash_ids\" holds a value that is not a non-negative integer");
      }
      r.hash_ids.push_back(id.get<std::uint64_t>());
    }
    // The last block holds what remains of the prompt: 1 to block_tokens tokens.
    const auto n = static_cast<std::int64_t>(r.hash_ids.size());
    if (r.input_length <= block_tokens * (n - 1) || r.input_length > block_tokens * n) {
      throw invalid_argument("trace line " + std::to_string(number) + ": \"input_length\" " +
                             std::to_string(r.input_length) + " does not fit " + std::to_string(n) +
                             " blocks of " + std::to_string(block_tokens) + " tokens");
    }
    out.push_back(std::move(r));
  }
  return out;
}

double infinite_hit_ratio(const std::vector<TraceRequest>& trace, std::int64_t block_tokens) {
  std::unordered_set<std::uint64_t> seen;
  std::int64_t hit = 0, total = 0;
  for (const TraceRequest& r : trace) {
    const std::size_t n = full_blocks(r, block_tokens);
    std::size_t i = 0;
    while (i < n && seen.contains(r.hash_ids[i])) {
      hit += block_tokens_of(r, i, block_tokens);
      ++i;
    }
    total += prompt_tokens(r, block_tokens);
    seen.insert(r.hash_ids.begin(), r.hash_ids.begin() + static_cast<std::ptrdiff_t>(n));
  }
  return total > 0 ? static_cast<double>(hit) / static_cast<double>(total) : 0.0;
}

}  // namespace kvbench
