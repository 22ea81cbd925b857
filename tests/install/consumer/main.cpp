// Stores a prompt with the C++ API of an installed kvoffload and checks that a second
// request with the same prompt hits it.
#include <cstdio>
#include <vector>

#include "kvoffload/scheduler.hpp"

int main() {
  using namespace kvoffload;
  SchedulerConfig c;
  c.groups = {GroupConfig{}};
  c.manager.host_blocks = 16;
  Scheduler s(c);
  std::vector<BlockHash> hashes;
  for (std::uint8_t i = 1; i <= 4; ++i) {
    const std::uint8_t b[2] = {i, 0x42};
    hashes.push_back(BlockHash::from_bytes(b));
  }
  s.update_request("a", 64, hashes);
  if (s.lookup("a", 0) != 0) return 1;
  s.on_allocated("a", std::vector<AllocatedGroup>(1), 0);
  const StepResult r = s.build_step(std::vector<ScheduledRequest>{{"a", 0, 64, {{1, 2, 3, 4}}}});
  if (r.store_jobs.size() != 1 || r.store_jobs[0].keys.size() != 4) return 2;
  (void)s.on_completed(std::vector<JobReport>{{r.store_jobs[0].id, 1, true}});
  s.update_request("b", 64, hashes);
  const auto hit = s.lookup("b", 0);
  if (!hit || *hit < 48) return 3;
  std::printf("consumer: stored 4 blocks, request b hits %lld tokens\n",
              static_cast<long long>(*hit));
  return 0;
}
