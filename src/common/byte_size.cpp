#include "kvoffload/byte_size.hpp"

#include <array>
#include <cctype>
#include <limits>
#include <utility>

#include "common/expects.hpp"

namespace kvoffload {

std::uint64_t parse_bytes(std::string_view text, std::string_view field) {
  std::size_t i = 0;
  std::uint64_t value = 0;
  bool digits = false;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
    const auto d = static_cast<std::uint64_t>(text[i] - '0');
    KVOFFLOAD_EXPECTS(value <= (std::numeric_limits<std::uint64_t>::max() - d) / 10,
                      "{}: \"{}\" is too large", field, text);
    value = value * 10 + d;
    digits = true;
  }
  KVOFFLOAD_EXPECTS(digits, "{}: \"{}\" is not a byte size (e.g. 64GiB)", field, text);
  while (i < text.size() && text[i] == ' ') ++i;
  const std::string_view unit = text.substr(i);
  static constexpr std::array<std::pair<std::string_view, std::uint64_t>, 10> units{{
      {"", 1},
      {"B", 1},
      {"KiB", std::uint64_t{1} << 10},
      {"MiB", std::uint64_t{1} << 20},
      {"GiB", std::uint64_t{1} << 30},
      {"TiB", std::uint64_t{1} << 40},
      {"KB", 1000},
      {"MB", 1000 * 1000},
      {"GB", 1000 * 1000 * 1000},
      {"TB", std::uint64_t{1000} * 1000 * 1000 * 1000},
  }};
  for (const auto& [name, factor] : units) {
    if (unit != name) continue;
    KVOFFLOAD_EXPECTS(value <= std::numeric_limits<std::uint64_t>::max() / factor,
                      "{}: \"{}\" is too large", field, text);
    return value * factor;
  }
  throw invalid_argument(
      fmt::format("{}: unknown unit \"{}\" in \"{}\" (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)",
                  field, unit, text));
}

std::string format_bytes(std::uint64_t bytes) {
  static constexpr std::array<const char*, 5> names{"B", "KiB", "MiB", "GiB", "TiB"};
  auto value = static_cast<double>(bytes);
  std::size_t u = 0;
  while (value >= 1024.0 && u + 1 < names.size()) {
    value /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.2f} {}", value, names[u]);
}

}  // namespace kvoffload
