// metrics_text(Scheduler): the host cache's snapshot (CacheStats) and each tier's index
// (TierStats) in the Prometheus text format. Fields of a signed type are levels (gauges), the
// unsigned ones only grow (counters, ..._total): the stats structs keep to that rule.

#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "common/prometheus_writer.hpp"
#include "kvoffload/detail/stats_fields.hpp"
#include "kvoffload/enums.hpp"
#include "kvoffload/metrics_text.hpp"
#include "kvoffload/scheduler.hpp"

namespace kvoffload {

std::string metrics_text(const Scheduler& scheduler, std::span<const MetricLabel> labels) {
  detail::PrometheusWriter w(labels);
  const CacheStats c = scheduler.cache_stats();
#define KVOFFLOAD_CACHE_SAMPLE(field)                                                          \
  {                                                                                            \
    constexpr bool counter = std::is_unsigned_v<decltype(c.field)>;                            \
    w.single(detail::PrometheusWriter::name("kvoffload_", #field, counter), counter, c.field); \
  }
  KVOFFLOAD_CACHE_STATS_FIELDS(KVOFFLOAD_CACHE_SAMPLE)
#undef KVOFFLOAD_CACHE_SAMPLE

  const auto& tiers = scheduler.config().tiers;
  if (tiers.empty()) return w.take();
  std::vector<TierStats> stats;
  std::vector<std::string> tier_labels;
  stats.reserve(tiers.size());
  tier_labels.reserve(tiers.size());
  for (std::size_t t = 0; t < tiers.size(); ++t) {
    stats.push_back(scheduler.tier_stats(t));
    tier_labels.push_back(fmt::format("tier=\"{}\",medium=\"{}\"", t, to_string(tiers[t].medium)));
  }
  // A family whole, then the next: one sample per tier each.
#define KVOFFLOAD_TIER_FAMILY(field)                                                               \
  {                                                                                                \
    constexpr bool counter = std::is_unsigned_v<decltype(TierStats{}.field)>;                      \
    const std::string name = detail::PrometheusWriter::name("kvoffload_tier_", #field, counter);   \
    w.family(name, counter);                                                                       \
    for (std::size_t t = 0; t < stats.size(); ++t) w.sample(name, tier_labels[t], stats[t].field); \
  }
  KVOFFLOAD_TIER_STATS_FIELDS(KVOFFLOAD_TIER_FAMILY)
#undef KVOFFLOAD_TIER_FAMILY
  return w.take();
}

}  // namespace kvoffload
