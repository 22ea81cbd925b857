#pragma once

// One function per kvoffload-bench subcommand; each returns its part of the JSON document.

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "bench_common.hpp"

namespace kvbench {

nlohmann::json run_scheduler(const Options& opt, const std::string& preset);
nlohmann::json run_manager(const Options& opt);
/// Heap per stored block and lookup latency of the block index at each size in `blocks`
/// (comma-separated counts: "1M,10M"), against a std::unordered_map of the same keys.
nlohmann::json run_index(const Options& opt, const std::string& blocks, std::size_t hash_bytes);
nlohmann::json run_copy_host(const Options& opt);
nlohmann::json run_copy_cuda(const Options& opt);
nlohmann::json run_copy_cuda_sweep(const Options& opt);
nlohmann::json run_calibrate(const Options& opt);
nlohmann::json run_compact(const Options& opt);
nlohmann::json run_source_order(const Options& opt);
nlohmann::json run_pool(const Options& opt, const std::string& size);
nlohmann::json run_e2e(const Options& opt);
nlohmann::json run_disk(const Options& opt, const std::string& directory, const std::string& size);
/// The disk tier's restart at each slot count in `slots` ("1M,10M"): header scan and index
/// rebuild, warm and cold, against reading the same headers unparsed.
nlohmann::json run_disk_restart(const Options& opt, const std::string& directory,
                                const std::string& slots);
/// How the shared benchmark reaches its cluster: TLS (on when a CA file is given) and AUTH,
/// for the tier and the baseline tool alike.
struct SharedAccess {
  std::string tls_ca_file;
  std::string user;
  std::string password_file;
};
nlohmann::json run_shared(const Options& opt, const std::string& nodes, const std::string& size,
                          const SharedAccess& access);
nlohmann::json run_loads(const Options& opt, const std::string& disk_dir);
nlohmann::json run_soak(const Options& opt, std::int64_t steps, std::int64_t samples);

}  // namespace kvbench
