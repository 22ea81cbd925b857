#pragma once

// Internal to the Python extension: the parts of the module each file binds.

#include <nanobind/nanobind.h>

#include <optional>
#include <vector>

#include "kvoffload/types.hpp"

namespace kvoffload::python {

void bind_errors(nanobind::module_& m);
void bind_scheduler(nanobind::module_& m);
void bind_worker(nanobind::module_& m);
/// A tier scan as a list of (hash bytes, group) or None per slot (Worker.tier_scan).
nanobind::list scan_to_list(const std::vector<std::optional<Key>>& scan);

}  // namespace kvoffload::python
