#include "bench_common.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <thread>

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

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace kvbench
