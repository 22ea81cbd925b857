#pragma once

// Writes samples in the Prometheus text exposition format (0.0.4): one "# TYPE" line per
// metric family (families must be written whole, one after the other), then its samples,
// with the constant labels first. Shared by metrics_text(Scheduler) and metrics_text(Worker).

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

#include "common/expects.hpp"
#include "kvoffload/metrics_text.hpp"

namespace kvoffload::detail {

class PrometheusWriter {
 public:
  explicit PrometheusWriter(std::span<const MetricLabel> labels) {
    for (std::size_t i = 0; i < labels.size(); ++i) {
      const MetricLabel& l = labels[i];
      for (std::size_t j = 0; j < i; ++j) {
        KVOFFLOAD_EXPECTS(labels[j].name != l.name, "metrics label \"{}\" is given twice", l.name);
      }
      KVOFFLOAD_EXPECTS(
          valid_name(l.name) && !l.name.starts_with("__") && l.name != "tier" && l.name != "medium",
          "metrics label \"{}\": not a label name of your own (letters, digits and "
          "_, not starting with a digit or __; tier and medium are taken)",
          l.name);
      constant_ +=
          fmt::format("{}{}=\"{}\"", constant_.empty() ? "" : ",", l.name, escape(l.value));
    }
  }

  /// The family's "# TYPE" line: a gauge, or a counter (named ..._total).
  void family(std::string_view name, bool counter) {
    out_ += fmt::format("# TYPE {} {}\n", name, counter ? "counter" : "gauge");
  }

  /// One sample of the current family; `extra` are its own labels, already formatted
  /// (tier="0",medium="disk") or empty.
  template <typename T>
  void sample(std::string_view name, std::string_view extra, T value) {
    const std::string_view comma = !constant_.empty() && !extra.empty() ? "," : "";
    if (constant_.empty() && extra.empty()) {
      out_ += fmt::format("{} {}\n", name, number(value));
    } else {
      out_ += fmt::format("{}{{{}{}{}}} {}\n", name, constant_, comma, extra, number(value));
    }
  }

  /// A family of one sample.
  template <typename T>
  void single(std::string_view name, bool counter, T value) {
    family(name, counter);
    sample(name, {}, value);
  }

  [[nodiscard]] std::string take() { return std::move(out_); }

  /// A metric's name: prefix + field, counters ending in _total; a gauge whose field ends in
  /// _total (blocks_total, a capacity) is named ..._capacity, as gauges must not end in _total.
  static std::string name(std::string_view prefix, std::string_view field, bool counter) {
    std::string n = std::string(prefix) + std::string(field);
    if (counter) return n + "_total";
    if (n.ends_with("_total")) n.replace(n.size() - 6, 6, "_capacity");
    return n;
  }

  static std::string escape(std::string_view v) {
    std::string s;
    for (const char c : v) {
      if (c == '\\') {
        s += "\\\\";
      } else if (c == '"') {
        s += "\\\"";
      } else if (c == '\n') {
        s += "\\n";
      } else {
        s += c;
      }
    }
    return s;
  }

 private:
  static bool valid_name(std::string_view n) {
    if (n.empty() || (n[0] >= '0' && n[0] <= '9')) return false;
    for (const char c : n) {
      if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            c == '_')) {
        return false;
      }
    }
    return true;
  }
  template <typename T>
  static std::string number(T value) {
    if constexpr (std::is_floating_point_v<T>) {
      return fmt::format("{:.9g}", value);
    } else {
      return fmt::format("{}", value);
    }
  }

  std::string constant_;
  std::string out_;
};

}  // namespace kvoffload::detail
