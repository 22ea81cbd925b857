// metrics_text(Worker): the worker's copies (TransferStats) and its tiers' I/O (TierIoStats;
// a shared tier's connection counters too) in the Prometheus text format.

#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/prometheus_writer.hpp"
#include "kvoffload/enums.hpp"
#include "kvoffload/metrics_text.hpp"
#include "kvoffload/tiers/shared_tier.hpp"
#include "kvoffload/worker.hpp"

namespace kvoffload {

std::string metrics_text(const Worker& worker, std::span<const MetricLabel> labels) {
  detail::PrometheusWriter w(labels);
  const TransferStats s = worker.stats();
  w.single("kvoffload_worker_store_jobs_total", true, s.store_jobs);
  w.single("kvoffload_worker_load_jobs_total", true, s.load_jobs);
  w.single("kvoffload_worker_failed_jobs_total", true, s.failed_jobs);
  w.single("kvoffload_worker_bytes_stored_total", true, s.bytes_stored);
  w.single("kvoffload_worker_bytes_loaded_total", true, s.bytes_loaded);
  w.single("kvoffload_worker_store_seconds_total", true, s.store_seconds);
  w.single("kvoffload_worker_load_seconds_total", true, s.load_seconds);
  w.single("kvoffload_worker_stores_shed_total", true, s.stores_shed);

  const std::size_t n = worker.num_tiers();
  if (n == 0) return w.take();
  std::vector<TierIoStats> io;
  std::vector<std::string> tier_labels;
  std::vector<std::size_t> shared;
  io.reserve(n);
  tier_labels.reserve(n);
  for (std::size_t t = 0; t < n; ++t) {
    io.push_back(worker.tier(t).stats());
    tier_labels.push_back(
        fmt::format("tier=\"{}\",medium=\"{}\"", t, to_string(worker.tier_medium(t))));
    if (worker.tier_medium(t) == Medium::shared) shared.push_back(t);
  }
  auto tier_family = [&](const char* name, auto field) {
    w.family(name, true);
    for (std::size_t t = 0; t < n; ++t) w.sample(name, tier_labels[t], io[t].*field);
  };
  tier_family("kvoffload_worker_tier_reads_total", &TierIoStats::reads);
  tier_family("kvoffload_worker_tier_read_failures_total", &TierIoStats::read_failures);
  tier_family("kvoffload_worker_tier_writes_total", &TierIoStats::writes);
  tier_family("kvoffload_worker_tier_write_failures_total", &TierIoStats::write_failures);
  if (shared.empty()) return w.take();
  std::vector<SharedTierStats> ss;
  ss.reserve(shared.size());
  for (const std::size_t t : shared) ss.push_back(worker.shared_tier(t).shared_stats());
  auto shared_family = [&](const char* name, auto field) {
    w.family(name, true);
    for (std::size_t i = 0; i < shared.size(); ++i) {
      w.sample(name, tier_labels[shared[i]], ss[i].*field);
    }
  };
  shared_family("kvoffload_worker_shared_bad_values_total", &SharedTierStats::bad_values);
  shared_family("kvoffload_worker_shared_read_misses_total", &SharedTierStats::read_misses);
  shared_family("kvoffload_worker_shared_bytes_read_total", &SharedTierStats::bytes_read);
  shared_family("kvoffload_worker_shared_bytes_written_total", &SharedTierStats::bytes_written);
  shared_family("kvoffload_worker_shared_connect_errors_total", &SharedTierStats::connect_errors);
  shared_family("kvoffload_worker_shared_tls_errors_total", &SharedTierStats::tls_errors);
  shared_family("kvoffload_worker_shared_auth_errors_total", &SharedTierStats::auth_errors);
  shared_family("kvoffload_worker_shared_io_errors_total", &SharedTierStats::io_errors);
  shared_family("kvoffload_worker_shared_timeouts_total", &SharedTierStats::timeouts);
  shared_family("kvoffload_worker_shared_protocol_errors_total", &SharedTierStats::protocol_errors);
  shared_family("kvoffload_worker_shared_oversized_total", &SharedTierStats::oversized);
  return w.take();
}

}  // namespace kvoffload
