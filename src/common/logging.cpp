#include "common/logging.hpp"

#include <cstdlib>
#include <memory>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

namespace kvoffload::detail {
namespace {

std::shared_ptr<spdlog::logger> make_logger() {
  std::shared_ptr<spdlog::logger> log;
  const char* file = std::getenv("KVOFFLOAD_LOG_FILE");
  if (file != nullptr && *file != '\0') {
    try {
      log = std::make_shared<spdlog::logger>(
          "kvoffload", std::make_shared<spdlog::sinks::basic_file_sink_mt>(file));
    } catch (const spdlog::spdlog_ex&) {
      log.reset();  // fall back to stderr rather than fail the engine
    }
  }
  if (!log) {
    log = std::make_shared<spdlog::logger>("kvoffload",
                                           std::make_shared<spdlog::sinks::stderr_sink_mt>());
  }
  log->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [kvoffload] [%l] %v");
  const char* level = std::getenv("KVOFFLOAD_LOG_LEVEL");
  log->set_level(level != nullptr ? spdlog::level::from_str(level) : spdlog::level::warn);
  if (level != nullptr && spdlog::level::from_str(level) == spdlog::level::off &&
      std::string_view(level) != "off") {
    log->set_level(spdlog::level::warn);  // unknown names keep the default
  }
  return log;
}

}  // namespace

spdlog::logger& logger() {
  static const std::shared_ptr<spdlog::logger> instance = make_logger();
  return *instance;
}

}  // namespace kvoffload::detail
