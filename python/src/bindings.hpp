#pragma once

// Internal to the Python extension: the parts of the module each file binds.

#include <nanobind/nanobind.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "kvoffload/tiers/shared_tier.hpp"
#include "kvoffload/types.hpp"

namespace kvoffload::python {

void bind_errors(nanobind::module_& m);
void bind_scheduler(nanobind::module_& m);
void bind_worker(nanobind::module_& m);
/// A tier scan as a list of (hash bytes, group) or None per slot (Worker.tier_scan).
nanobind::list scan_to_list(const std::vector<std::optional<Key>>& scan);

/// SharedTierConfig._tuple(): nodes, name, tp_rank, tp_size, connect and reply timeouts (ms),
/// blocks in flight.
using SharedTuple = std::tuple<std::string, std::string, int, int, int, int, int>;
inline SharedTierConfig shared_config(const SharedTuple& t) {
  SharedTierConfig c;
  std::tie(c.nodes, c.name, c.tp_rank, c.tp_size, c.connect_timeout_ms, c.reply_timeout_ms,
           c.in_flight) = t;
  return c;
}

}  // namespace kvoffload::python
