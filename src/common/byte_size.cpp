#include "kvoffload/byte_size.hpp"

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <utility>

#include "common/expects.hpp"

namespace kvoffload {

namespace {

bool is_digit(char c) noexcept {
  return std::isdigit(static_cast<unsigned char>(c)) != 0;
}

bool same_unit(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

}  // namespace

// The one byte-size grammar of every front end (C++, C, Python, the vLLM connector, the
// tools): a number, optional blanks, an optional unit in any case. Whole numbers are exact;
// a fraction or an exponent ("1.5GiB", "2e9") is rounded down to whole bytes.
std::uint64_t parse_bytes(std::string_view text, std::string_view field) {
  const std::string_view all = text;
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  std::size_t i = 0;
  std::uint64_t value = 0;
  bool digits = false;
  for (; i < text.size() && is_digit(text[i]); ++i) {
    const auto d = static_cast<std::uint64_t>(text[i] - '0');
    KVOFFLOAD_EXPECTS(value <= (std::numeric_limits<std::uint64_t>::max() - d) / 10,
                      "{}: \"{}\" is too large", field, all);
    value = value * 10 + d;
    digits = true;
  }
  // A fraction or an exponent: the number is read again as a floating-point value.
  std::size_t j = i;
  if (j < text.size() && text[j] == '.') {
    ++j;
    while (j < text.size() && is_digit(text[j])) {
      ++j;
      digits = true;
    }
  }
  KVOFFLOAD_EXPECTS(digits, "{}: \"{}\" is not a byte size (e.g. 64GiB)", field, all);
  if (j < text.size() && (text[j] == 'e' || text[j] == 'E')) {
    std::size_t k = j + 1;
    if (k < text.size() && (text[k] == '+' || text[k] == '-')) ++k;
    const std::size_t exp_digits = k;
    while (k < text.size() && is_digit(text[k])) ++k;
    if (k > exp_digits) j = k;  // else the 'e' starts the unit (and fails there)
  }
  const bool exact = j == i;
  const std::string_view number = text.substr(0, j);
  i = j;
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
    if (!same_unit(unit, name)) continue;
    if (exact) {
      KVOFFLOAD_EXPECTS(value <= std::numeric_limits<std::uint64_t>::max() / factor,
                        "{}: \"{}\" is too large", field, all);
      return value * factor;
    }
    // from_chars, not strtold: the host program's locale must not change what "1.5" means.
    long double mantissa = 0;
    const auto parsed = std::from_chars(number.data(), number.data() + number.size(), mantissa);
    KVOFFLOAD_EXPECTS(parsed.ec == std::errc{} && parsed.ptr == number.data() + number.size(),
                      "{}: \"{}\" is too large", field, all);
    const long double scaled = mantissa * static_cast<long double>(factor);
    // 2^64 as a long double: every value below it converts to uint64 without overflow.
    KVOFFLOAD_EXPECTS(std::isfinite(scaled) && scaled < 18446744073709551616.0L,
                      "{}: \"{}\" is too large", field, all);
    return static_cast<std::uint64_t>(scaled);
  }
  throw invalid_argument(
      fmt::format("{}: unknown unit \"{}\" in \"{}\" (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)",
                  field, unit, all));
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
