#pragma once

// Internal to the Python extension: the parts of the module each file binds.

#include <nanobind/nanobind.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvoffload/metrics_text.hpp"
#include "kvoffload/scheduler.hpp"
#include "kvoffload/types.hpp"
#include "kvoffload/worker.hpp"

namespace kvoffload::python {

void bind_errors(nanobind::module_& m);
void bind_scheduler(nanobind::module_& m);
void bind_worker(nanobind::module_& m);
void bind_vllm(nanobind::module_& m);  // vllm_binding.cpp: VllmBridge
/// build_step's result as (load jobs, store jobs, flush, tier jobs).
nanobind::tuple step_to_tuple(StepResult&& r);
/// metrics_text's labels from Python's sorted (name, value) pairs.
using LabelPairs = std::vector<std::pair<std::string, std::string>>;
inline std::vector<MetricLabel> metric_labels(const LabelPairs& pairs) {
  std::vector<MetricLabel> out;
  out.reserve(pairs.size());
  for (const auto& [name, value] : pairs) out.push_back({name, value});
  return out;
}
/// A tier scan as a list of (hash bytes, group) or None per slot (Worker.tier_scan).
nanobind::list scan_to_list(const std::vector<std::optional<Key>>& scan);

// config_binding.cpp: the config dataclasses by their attributes (config_fields.hpp's lists).
void bind_config(nanobind::module_& m);
SharedTierConfig shared_config_from_py(nanobind::handle obj, const std::string& what);
SchedulerConfig scheduler_config_from_py(nanobind::handle obj);
WorkerConfig worker_config_from_py(nanobind::handle obj);

}  // namespace kvoffload::python
