#pragma once

// Internal to the Python extension: the parts of the module each file binds.

#include <nanobind/nanobind.h>

#include <optional>
#include <string>
#include <vector>

#include "kvoffload/types.hpp"
#include "kvoffload/worker.hpp"

namespace kvoffload::python {

void bind_errors(nanobind::module_& m);
void bind_scheduler(nanobind::module_& m);
void bind_worker(nanobind::module_& m);
/// A tier scan as a list of (hash bytes, group) or None per slot (Worker.tier_scan).
nanobind::list scan_to_list(const std::vector<std::optional<Key>>& scan);

// config_binding.cpp: the config dataclasses by their attributes (config_fields.hpp's lists).
void bind_config(nanobind::module_& m);
SharedTierConfig shared_config_from_py(nanobind::handle obj, const std::string& what);
SchedulerConfig scheduler_config_from_py(nanobind::handle obj);
WorkerConfig worker_config_from_py(nanobind::handle obj);

}  // namespace kvoffload::python
