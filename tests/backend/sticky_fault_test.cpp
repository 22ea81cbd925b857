// A fault while a kernel runs (here: a kernel-mode plan on host memory the device cannot reach)
// poisons the whole context, as CUDA does: that job and every later one fail, none is ever
// reported ok (issue 49, item 8). On the simulated device and, as [gpu], on a GPU, where the
// bundle runs each [gpu] case in a process of its own, so the poisoned context ends with it.

#include <sys/mman.h>

#include <cstdint>
#include <memory>
#include <vector>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "backend/device_rig.hpp"
#include "backend/sim_engine.hpp"
#include "kvoffload/cuda_backend.hpp"
#include "kvoffload/testing/sim_device.hpp"

using namespace kvoffload;
using Catch::Matchers::ContainsSubstring;
using kvtest::DeviceRig;

namespace {

/// Host memory no device can reach, even one that reads pageable memory (HMM): no access.
class Unreachable {
 public:
  Unreachable() {
    p_ = mmap(nullptr, kBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p_ != MAP_FAILED);
  }
  ~Unreachable() { munmap(p_, kBytes); }
  Unreachable(const Unreachable&) = delete;
  Unreachable& operator=(const Unreachable&) = delete;
  [[nodiscard]] std::uintptr_t address() const { return reinterpret_cast<std::uintptr_t>(p_); }
  static constexpr std::size_t kBytes = 1 << 16;

 private:
  void* p_ = nullptr;
};

void fault_is_sticky(const std::shared_ptr<DeviceRuntime>& rt) {
  DeviceRig rig(rt, 1, 1024, 16, 16);
  CudaBackendConfig c;
  c.mode = CopyMode::kernel;
  CudaBackend backend(c, rt);
  REQUIRE(backend.kernel_available());
  const Unreachable bad_host;
  auto store = [&](JobId id, std::uintptr_t host) {
    CopyPlan p;
    p.job = id;
    p.kind = JobKind::store;
    p.descriptors = {{reinterpret_cast<std::uintptr_t>(rig.device[0]), host, 1024}};
    p.total_bytes = 1024;
    return p;
  };
  backend.wait(backend.submit(store(1, rig.region.base)));  // fine before the fault
  std::vector<BackendResult> done;
  backend.poll(done);
  REQUIRE(done.size() == 1);
  CHECK(done[0].ok);
  backend.wait(backend.submit(store(2, bad_host.address())));
  for (JobId id = 3; id < 23; ++id) backend.wait(backend.submit(store(id, rig.region.base)));
  backend.poll(done);
  REQUIRE(done.size() == 22);
  for (std::size_t i = 1; i < done.size(); ++i) {
    INFO("job " << done[i].job << ": " << done[i].error);
    CHECK_FALSE(done[i].ok);
    CHECK(done[i].bytes == 0);
  }
  CHECK_THAT(done[1].error, ContainsSubstring("job 2"));
}

}  // namespace

TEST_CASE("sim: a kernel fault is sticky: that job and every later one fail",
          "[sim][cuda_backend][errors]") {
  auto sim = kvtest::sim_with(19, 1, 5);
  fault_is_sticky(sim);
  CHECK(sim->poisoned());
}

TEST_CASE("gpu: a kernel fault is sticky: that job and every later one fail",
          "[gpu][cuda_backend][errors]") {
  if (!CudaBackend::available()) SKIP("no CUDA device");
  fault_is_sticky(cuda_runtime());
}
