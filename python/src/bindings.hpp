#pragma once

// Internal to the Python extension: the parts of the module each file binds.

#include <nanobind/nanobind.h>

namespace kvoffload::python {

void bind_errors(nanobind::module_& m);
void bind_scheduler(nanobind::module_& m);
void bind_worker(nanobind::module_& m);

}  // namespace kvoffload::python
