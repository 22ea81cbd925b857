// kvoffload-bench's CUDA scenarios in a build without CUDA.

#include "scenarios.hpp"

namespace kvbench {

nlohmann::json run_copy_cuda_sweep(const Options& /*opt*/) {
  return {{"backend", "cuda"}, {"skipped", "built without CUDA"}};
}
nlohmann::json run_calibrate(const Options& /*opt*/) {
  return {{"skipped", "built without CUDA"}};
}
nlohmann::json run_compact(const Options& /*opt*/) {
  return {{"skipped", "built without CUDA"}};
}
nlohmann::json run_source_order(const Options& /*opt*/) {
  return {{"skipped", "built without CUDA"}};
}

}  // namespace kvbench
