#pragma once

// Internal: the project logger. spdlog stays out of public headers and out of the exported
// symbol table. Configured from the environment on first use:
//   KVOFFLOAD_LOG_LEVEL  trace, debug, info, warn (default), error, critical, off
//   KVOFFLOAD_LOG_FILE   append to this file instead of standard error

#include <spdlog/spdlog.h>

namespace kvoffload::detail {

spdlog::logger& logger();

}  // namespace kvoffload::detail
