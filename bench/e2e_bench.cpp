// kvoffload-bench e2e: steps per second of the synthetic engine loop, verification off.

#include "bench_common.hpp"
#include "scenarios.hpp"
#include "sim/synthetic_engine.hpp"

namespace kvbench {

nlohmann::json run_e2e(const Options& opt) {
  const std::size_t runs = opt.runs > 0 ? opt.runs : (opt.quick ? 2 : 5);
  kvsim::SimConfig c;
  c.steps = opt.quick ? 2000 : 20000;
  c.verify = false;
  std::vector<double> rate;
  kvsim::SimReport last;
  Progress progress("e2e", runs);
  for (std::size_t r = 0; r < runs; ++r) {
    c.seed = 1 + r;
    kvsim::SyntheticEngine engine(c);
    last = engine.run();
    rate.push_back(static_cast<double>(last.steps) / last.seconds);
    progress.step();
  }
  progress.done();
  return {{"steps", c.steps},
          {"steps_per_second", to_json(summarize(rate), "per_s")},
          {"loads_per_run", last.load_jobs},
          {"stores_per_run", last.store_jobs},
          {"evictions_per_run", last.evictions}};
}

}  // namespace kvbench
