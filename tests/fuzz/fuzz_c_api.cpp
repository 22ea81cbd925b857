// Fuzz target: random sequences of C API calls on one scheduler and one worker, with random
// (often wrong) lengths, NULLs, kinds, ids and reports. Every call must return a status, and
// every failure must come with a message; nothing may crash, leak or read out of bounds.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_input.hpp"
#include "kvoffload/kvoffload.h"

namespace {

void check(kvoffload_status_t s) {
  if (s < KVOFFLOAD_SUCCESS || s >= KVOFFLOAD_NUM_STATUSES) std::abort();
  if (s != KVOFFLOAD_SUCCESS && kvoffload_last_error()[0] == '\0') std::abort();
  // A bug, not bad input (no tier is configured here, so no I/O error either).
  if (s == KVOFFLOAD_INTERNAL_ERROR || s == KVOFFLOAD_IO_ERROR) std::abort();
}

const char* kIds[] = {"a", "b", "c", "a-much-longer-request-identifier-0001"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  kvfuzz::Input in(data, size);
  std::vector<kvoffload_group_config_t> groups(static_cast<std::size_t>(in.range(0, 3)));
  for (auto& g : groups) {
    // Out-of-range kinds too, written as bytes: a C caller can store any int there, but a C++
    // program may not even load such an enum value.
    const int kind = static_cast<int>(in.range(0, 3));
    std::memcpy(&g.kind, &kind, sizeof kind);
    g.gpu_block_size = in.range(0, 2) * 8;
    g.sliding_window = in.range(0, 4) * 16;
  }
  kvoffload_scheduler_config_t sc = KVOFFLOAD_SCHEDULER_CONFIG_INIT;
  sc.groups = groups.data();
  sc.num_groups = groups.size();
  sc.block_size_factor = in.range(0, 3);
  sc.hash_block_size = in.range(1, 2) * 8;
  sc.host_blocks = in.range(0, 12);
  sc.num_workers = in.range(1, 2);
  sc.policy = in.flag() ? "arc" : "lru";
  sc.store_threshold = in.range(0, 2);
  kvoffload_scheduler_t s = nullptr;
  check(kvoffload_scheduler_create(&sc, &s));
  if (s == nullptr) return 0;

  // A worker over a small "GPU" buffer (one tensor per group, block ids up to 40 fit), when the
  // configuration allows one: jobs the scheduler emits are submitted to it.
  kvoffload_worker_t w = nullptr;
  std::vector<std::uint8_t> gpu(41 * 64 * (groups.size() + 1));
  std::vector<kvoffload_kv_tensor_t> tensors;
  std::vector<kvoffload_group_tensor_t> owned(groups.size());
  std::vector<kvoffload_group_tensors_t> per_group;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    tensors.push_back({reinterpret_cast<std::uintptr_t>(gpu.data() + g * 41 * 64), 41, 64, 64});
    owned[g] = {static_cast<std::int32_t>(g), 64};
    per_group.push_back({&owned[g], 1});
  }
  kvoffload_worker_config_t wc = KVOFFLOAD_WORKER_CONFIG_INIT;
  wc.tensors = tensors.data();
  wc.num_tensors = tensors.size();
  wc.groups = per_group.data();
  wc.num_groups = per_group.size();
  wc.scheduler = &sc;  // the factor and the pool's size come from the scheduler's config
  wc.threads = 1;
  if (in.flag()) check(kvoffload_worker_create(&wc, &w));

  std::vector<kvoffload_step_t> steps;
  std::vector<kvoffload_job_id_t> seen_jobs;
  while (!in.done()) {
    const char* id = kIds[in.range(0, 3)];
    switch (in.range(0, 9)) {
      case 0: {  // update_request
        std::vector<kvoffload_block_hash_t> h(static_cast<std::size_t>(in.range(0, 8)));
        for (std::size_t i = 0; i < h.size(); ++i) {
          std::memset(&h[i], 0, sizeof(h[i]));
          h[i].size = static_cast<std::uint32_t>(in.range(0, 33));
          h[i].bytes[0] = static_cast<std::uint8_t>(in.range(0, 3));
        }
        check(kvoffload_scheduler_update_request(s, id, in.range(-1, 160),
                                                 in.flag() ? h.data() : nullptr, h.size(), 0));
        break;
      }
      case 1: {
        std::int64_t hit = 0;
        check(kvoffload_scheduler_lookup(s, id, in.range(-1, 64), in.flag() ? &hit : nullptr));
        break;
      }
      case 2: {  // on_allocated
        std::vector<std::vector<kvoffload_block_id_t>> ids(groups.size());
        std::vector<kvoffload_allocated_group_t> g(groups.size() +
                                                   static_cast<std::size_t>(in.range(0, 1)));
        for (std::size_t i = 0; i < g.size(); ++i) {
          auto& v = i < ids.size() ? ids[i] : ids.emplace_back();
          v.resize(static_cast<std::size_t>(in.range(0, 12)));
          for (auto& b : v) b = static_cast<kvoffload_block_id_t>(in.range(-1, 40));
          g[i] = {in.flag() ? v.data() : nullptr, v.size(), in.range(-1, 4)};
        }
        check(kvoffload_scheduler_on_allocated(s, id, g.data(), g.size(), in.range(-1, 96)));
        break;
      }
      case 3: {  // build_step
        std::vector<std::vector<kvoffload_block_id_t>> ids(groups.size() + 1);
        std::vector<const kvoffload_block_id_t*> ptrs;
        std::vector<std::size_t> counts;
        for (auto& v : ids) {
          v.resize(static_cast<std::size_t>(in.range(0, 10)));
          for (auto& b : v) b = static_cast<kvoffload_block_id_t>(in.range(-1, 40));
          ptrs.push_back(in.range(0, 7) == 0 ? nullptr : v.data());
          counts.push_back(v.size());
        }
        kvoffload_scheduled_request_t r{
            id,
            in.range(-1, 96),
            in.range(-1, 96),
            ptrs.data(),
            counts.data(),
            groups.size() + static_cast<std::size_t>(in.range(0, 1)) -
                static_cast<std::size_t>(groups.empty() ? 0 : in.range(0, 1)),
            static_cast<int>(in.range(0, 1))};
        const char* gone[] = {kIds[in.range(0, 3)]};
        kvoffload_step_t step = nullptr;
        check(kvoffload_scheduler_build_step(s, &r, in.range(0, 1), gone, in.range(0, 1), &step));
        if (step != nullptr) steps.push_back(step);
        break;
      }
      case 4: {  // look at a step's jobs
        if (steps.empty()) break;
        kvoffload_step_t step = steps[static_cast<std::size_t>(
            in.range(0, static_cast<std::int64_t>(steps.size()) - 1))];
        std::size_t n = 0;
        // In range only: an enum argument cannot hold anything else in C++ (tests/c covers
        // bad kinds from C).
        const auto kind = in.flag() ? KVOFFLOAD_JOB_LOAD : KVOFFLOAD_JOB_STORE;
        check(kvoffload_step_num_jobs(step, kind, &n));
        kvoffload_job_t job;
        if (kvoffload_step_get_job(step, kind, static_cast<std::size_t>(in.range(0, 2)), &job) ==
            KVOFFLOAD_SUCCESS) {
          std::int64_t sum = 0;
          for (std::size_t g = 0; g < job.num_groups; ++g) sum += job.group_sizes[g];
          if (sum != static_cast<std::int64_t>(job.num_gpu_block_ids))
            std::abort();  // the contract
          for (std::size_t i = 0; i < job.num_gpu_block_ids; ++i) {
            if (job.gpu_block_ids[i] == 0) std::abort();  // never a null block
          }
          seen_jobs.push_back(job.id);
          if (w != nullptr) {
            check(kvoffload_worker_submit(w, &job));
            if (in.flag()) check(kvoffload_worker_wait(w, &job.id, 1));
            kvoffload_finished_transfer_t fin[4];
            std::size_t got = 0;
            check(kvoffload_worker_get_finished(w, fin, 4, &got));
          }
        }
        const kvoffload_job_id_t* flush = nullptr;
        check(kvoffload_step_get_flush(step, &flush, &n));
        break;
      }
      case 5: {  // reports, real and made up
        std::vector<kvoffload_job_report_t> rep(static_cast<std::size_t>(in.range(0, 3)));
        for (auto& r : rep) {
          const bool real = !seen_jobs.empty() && in.flag();
          r = {real ? seen_jobs[static_cast<std::size_t>(
                          in.range(0, static_cast<std::int64_t>(seen_jobs.size()) - 1))]
                    : in.range(-1, 20),
               in.range(0, 2), static_cast<int>(in.range(0, 1))};
        }
        std::vector<kvoffload_completed_job_t> done(rep.size() + 1);
        std::size_t n = 0;
        check(kvoffload_scheduler_on_completed(
            s, rep.data(), rep.size(), done.data(),
            static_cast<std::size_t>(in.range(0, static_cast<std::int64_t>(done.size()))), &n));
        break;
      }
      case 6: check(kvoffload_scheduler_on_finished(s, in.flag() ? id : nullptr)); break;
      case 7: {
        const kvoffload_event_t* ev = nullptr;
        std::size_t n = 0;
        check(kvoffload_scheduler_take_events(s, &ev, &n));
        kvoffload_scheduler_stats_t st = KVOFFLOAD_SCHEDULER_STATS_INIT;
        check(kvoffload_scheduler_get_stats(s, &st));
        if (st.blocks_used > st.blocks_total || st.blocks_used < 0) std::abort();
        break;
      }
      case 8:
        if (in.range(0, 7) == 0) check(kvoffload_scheduler_reset_cache(s));
        break;
      default:
        if (!steps.empty()) {
          check(kvoffload_step_destroy(steps.back()));
          steps.pop_back();
        }
        break;
    }
  }
  for (kvoffload_step_t st : steps) check(kvoffload_step_destroy(st));
  check(kvoffload_worker_destroy(w));
  check(kvoffload_scheduler_destroy(s));
  return 0;
}
