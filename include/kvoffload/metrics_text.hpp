#pragma once

// The library's statistics in the Prometheus text exposition format (version 0.0.4), for
// engines that are not vLLM (vLLM gets them through the connector's stats): serve the text
// on a /metrics endpoint as it is.

#include <span>
#include <string>

#include "kvoffload/export.hpp"

namespace kvoffload {

class Scheduler;
class Worker;

/// A label every sample gets (an engine's name, say). Names follow Prometheus' rules
/// ([a-zA-Z_][a-zA-Z0-9_]*, not starting with "__", not "tier" or "medium": those are ours);
/// values are escaped.
struct MetricLabel {
  std::string name;
  std::string value;
};

/// Not thread-safe against the scheduler's other calls (like Scheduler::stats): render it
/// on the scheduler's thread and hand the text to the thread serving /metrics.
/// The scheduler's host cache and counters (kvoffload_<field>: gauges for occupancy,
/// counters named ..._total for the rest, CacheStats' fields) and each tier's index
/// (kvoffload_tier_<field>{tier="0",medium="disk"}, TierStats' fields). Throws
/// invalid_argument naming a bad label.
[[nodiscard]] KVOFFLOAD_EXPORT std::string metrics_text(const Scheduler& scheduler,
                                                        std::span<const MetricLabel> labels = {});

/// The worker's copies (kvoffload_worker_<field>_total: jobs, failed jobs, bytes and summed
/// seconds per direction) and its tiers' I/O (kvoffload_worker_tier_<field>_total{tier,
/// medium}; shared tiers' connection counters as kvoffload_worker_shared_<field>_total).
[[nodiscard]] KVOFFLOAD_EXPORT std::string metrics_text(const Worker& worker,
                                                        std::span<const MetricLabel> labels = {});

}  // namespace kvoffload
