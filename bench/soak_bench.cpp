// kvoffload-bench soak: the end-to-end loop for a long run (1,000,000 steps by default), with
// every loaded byte verified and the reliability invariants checked, sampling resident memory
// along the way. After warm-up the curve must be flat: a leak in the scheduler, the manager,
// the engine or the backend shows as growth. Not part of `all` (it takes minutes).

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "bench_common.hpp"
#include "scenarios.hpp"
#include "sim/synthetic_engine.hpp"

namespace kvbench {
namespace {

double resident_mib() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) /
         (1024.0 * 1024.0);
}

}  // namespace

nlohmann::json run_soak(const Options& opt, std::int64_t steps, std::int64_t samples) {
  kvsim::SimConfig c;
  c.steps = opt.quick ? 20000 : steps;
  c.seed = 11;
  c.verify = true;
  c.check_invariants = true;
  const std::int64_t every =
      std::max<std::int64_t>(1, c.steps / std::max<std::int64_t>(samples, 1));
  nlohmann::json curve = nlohmann::json::array();
  curve.push_back({{"step", 0}, {"rss_mib", resident_mib()}});
  Progress progress("soak", static_cast<std::size_t>(c.steps / every));
  kvsim::SyntheticEngine engine(c);
  const kvsim::SimReport r = engine.run(
      [&](const kvsim::SimReport& s) {
        curve.push_back({{"step", s.steps}, {"rss_mib", resident_mib()}});
        progress.step(std::to_string(s.requests_finished) + " requests done");
      },
      every);
  progress.done();
  // Flatness: the largest resident size after warm-up (the first tenth of the run) against the
  // size at the end of warm-up.
  double at_warm = 0, peak_after = 0;
  for (const auto& p : curve) {
    const auto step = p["step"].get<std::int64_t>();
    const double rss = p["rss_mib"].get<double>();
    if (step <= c.steps / 10)
      at_warm = rss;
    else
      peak_after = std::max(peak_after, rss);
  }
  const double growth = peak_after - at_warm;
  return {{"steps", r.steps},
          {"seconds", r.seconds},
          {"steps_per_second", static_cast<double>(r.steps) / r.seconds},
          {"requests_finished", r.requests_finished},
          {"blocks_verified", r.blocks_verified},
          {"mismatches", r.mismatches},
          {"invariant_violations", r.invariant_violations},
          {"drained", r.drained},
          {"rss_after_warmup_mib", at_warm},
          {"rss_peak_after_warmup_mib", peak_after},
          {"rss_growth_after_warmup_mib", growth},
          {"flat", growth <= std::max(2.0, 0.02 * at_warm)},
          {"curve", curve}};
}

}  // namespace kvbench
