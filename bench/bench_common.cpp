#include "bench_common.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>

#include <malloc.h>
#include <sys/utsname.h>

#include "kvoffload/device.hpp"

namespace kvbench {

Summary summarize(std::vector<double> samples) {
  Summary s;
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  s.median = n % 2 == 1 ? samples[n / 2] : (samples[n / 2 - 1] + samples[n / 2]) / 2;
  s.min = samples.front();
  s.max = samples.back();
  s.runs = n;
  return s;
}

nlohmann::json to_json(const Summary& s, const std::string& unit) {
  return {{"median_" + unit, s.median},
          {"min_" + unit, s.min},
          {"max_" + unit, s.max},
          {"runs", s.runs}};
}

Progress::Progress(std::string what, std::size_t total)
    : what_(std::move(what)), total_(total), start_(std::chrono::steady_clock::now()) {}

void Progress::step(const std::string& detail) {
  ++at_;
  std::fprintf(stderr, "\r[%s] %zu/%zu %s (%.1f s)   ", what_.c_str(), at_, total_, detail.c_str(),
               seconds_since(start_));
  std::fflush(stderr);
}

void Progress::done() {
  std::fprintf(stderr, "\r[%s] done in %.1f s%40s\n", what_.c_str(), seconds_since(start_), "");
}

nlohmann::json machine_json() {
  utsname u{};
  uname(&u);
  std::string cpu;
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  return {{"cpu", cpu},
          {"cores", std::thread::hardware_concurrency()},
          {"kernel", std::string(u.release)},
          {"cuda_build", kvoffload::built_with_cuda()},
          {"cuda_devices", kvoffload::cuda_device_count()}};
}

double quantile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::clamp<std::size_t>(rank, 1, v.size()) - 1];
}

double heap_in_use() {
  const struct mallinfo2 m = ::mallinfo2();
  return static_cast<double>(m.uordblks) + static_cast<double>(m.hblkhd);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::vector<std::uint64_t> parse_counts(const std::string& list, const std::string& option,
                                        double min, double max) {
  std::vector<std::uint64_t> out;
  for (std::size_t at = 0; at <= list.size();) {
    const std::size_t comma = std::min(list.find(',', at), list.size());
    const std::string text = list.substr(at, comma - at);
    std::size_t used = 0;
    double v = 0;
    try {
      v = std::stod(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    const std::string unit = text.substr(used);
    const double mul = unit.empty() ? 1 : unit == "K" || unit == "k" ? 1e3 : unit == "M" ? 1e6 : 0;
    if (used == 0 || mul == 0 || v * mul < min || v * mul > max) {
      throw std::invalid_argument(option + ": '" + text + "' is not a count of " +
                                  std::to_string(static_cast<std::uint64_t>(min)) + " to " +
                                  std::to_string(static_cast<std::uint64_t>(max)) +
                                  " (e.g. 4K, 10M)");
    }
    out.push_back(static_cast<std::uint64_t>(v * mul));
    at = comma + 1;
  }
  return out;
}

}  // namespace kvbench
