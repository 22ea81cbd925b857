#pragma once

// One function per kvoffload-bench subcommand; each returns its part of the JSON document.

#include <string>

#include <nlohmann/json.hpp>

#include "bench_common.hpp"

namespace kvbench {

nlohmann::json run_pool(const Options& opt, const std::string& size);

}  // namespace kvbench
