#pragma once

// Shared pieces of kvoffload-bench: repeated timing with median/min/max, a progress line on
// stderr, and the JSON result document.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvbench {

struct Summary {
  double median = 0;
  double min = 0;
  double max = 0;
  std::size_t runs = 0;
};

/// Median, min and max of the samples (which it sorts).
Summary summarize(std::vector<double> samples);
nlohmann::json to_json(const Summary& s, const std::string& unit);

/// "[what] i/n" on stderr, overwritten in place; done() ends the line.
class Progress {
 public:
  Progress(std::string what, std::size_t total);
  void step(const std::string& detail = {});
  void done();

 private:
  std::string what_;
  std::size_t total_;
  std::size_t at_ = 0;
  std::chrono::steady_clock::time_point start_;
};

/// Options every scenario shares.
struct Options {
  bool quick = false;                ///< small sizes and few runs (CI smoke test)
  std::size_t runs = 0;              ///< 0: the scenario's default
  std::string json_path;             ///< write the result document here
  std::uint64_t copy_total = 0;      ///< copy cuda, source-order: run bytes (0: 1GiB, 256MiB)
  std::uint64_t copy_piece_max = 0;  ///< the same: largest piece (0: 16MiB, 1MiB)
  /// copy cuda: the kernel's CTA counts to sweep for the kernel and staged modes (empty: the
  /// backend's default), and whether the host side is a PinnedHostPool (registered memory, as
  /// a Worker's) instead of cudaMallocHost: the diagnostics for a two-way miss (issue 49).
  std::vector<int> copy_ctas;
  bool copy_host_pool = false;
  std::int64_t compact_max_ids = 0;  ///< compact: largest id count (0: 16 M, quick 64 Ki)
  std::string disk_io = "auto";      ///< disk: the tier's I/O engine (auto, io_uring, threads)
};

/// Machine facts recorded next to every result.
nlohmann::json machine_json();

double seconds_since(std::chrono::steady_clock::time_point start);

/// The q-quantile (0..1) of `v` (sorted here), nearest rank; 0 for none.
double quantile(std::vector<double>& v, double q);

/// Bytes the allocator has handed out (glibc's mallinfo2: small blocks and mmapped ones).
double heap_in_use();

/// A comma-separated list of counts ("4K,1M,10M": K and M are powers of 1000), each within
/// [min, max]. Throws invalid_argument naming `option` and the bad item.
std::vector<std::uint64_t> parse_counts(const std::string& list, const std::string& option,
                                        double min, double max);

}  // namespace kvbench
