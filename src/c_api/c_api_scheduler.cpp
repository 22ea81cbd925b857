// The C API's scheduler and step handles (include/kvoffload/kvoffload.h).

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "c_api/c_api_common.hpp"
#include "kvoffload/detail/stats_fields.hpp"
#include "kvoffload/metrics_text.hpp"
#include "kvoffload/scheduler.hpp"
#include "kvoffload/tiers/shared_presence.hpp"

struct kvoffload_scheduler_s {
  kvoffload_scheduler_s(const kvoffload::SchedulerConfig& c, kvoffload::SchedulerServices services)
      : scheduler(c, std::move(services)) {}
  kvoffload::Scheduler scheduler;
  std::vector<kvoffload::BlockHash> hashes;  // scratch for update/extend
  std::vector<kvoffload::CompletedJob> completed;
  std::vector<kvoffload::ManagerEvent> events;
  std::vector<std::vector<kvoffload_key_t>> event_keys;
  std::vector<kvoffload_event_t> c_events;
  std::vector<const char*> event_media;
  std::string metrics;  // the last metrics_text
};

struct kvoffload_step_s {
  kvoffload::StepResult result;
  std::vector<std::vector<kvoffload_key_t>> load_keys, store_keys, tier_keys;
};

namespace kvoffload::capi {
namespace {

/// A transfer's kind from a C caller: true for loads; throws for anything but 0 and 1.
bool is_load(const kvoffload_job_kind_t& kind, std::string_view fn) {
  const int k = raw_enum(kind);
  if (k != KVOFFLOAD_JOB_LOAD && k != KVOFFLOAD_JOB_STORE) {
    throw invalid_argument(
        fmt::format("{}: kind is {} (KVOFFLOAD_JOB_LOAD 0 or _STORE 1; tier jobs are "
                    "kvoffload_step_num_tier_jobs/_get_tier_job's)",
                    fn, k));
  }
  return k == KVOFFLOAD_JOB_LOAD;
}

void read_hashes(kvoffload_scheduler_s& s, const kvoffload_block_hash_t* hashes, std::size_t n,
                 std::string_view fn) {
  require_array(hashes, n, fn, "hashes");
  s.hashes.clear();
  s.hashes.reserve(n);
  for (std::size_t i = 0; i < n; ++i) s.hashes.push_back(to_hash(hashes[i], fn, i));
}

std::vector<kvoffload_key_t> keys_of(const TransferJob& job) {
  std::vector<kvoffload_key_t> out;
  out.reserve(job.keys.size());
  for (const Key& k : job.keys) out.push_back(to_c(k));
  return out;
}

ScheduledRequest to_entry(const kvoffload_scheduled_request_t& r, std::size_t i) {
  constexpr std::string_view fn = "kvoffload_scheduler_build_step";
  if (r.request_id == nullptr) {
    throw invalid_argument(fmt::format("{}: requests[{}].request_id is NULL", fn, i));
  }
  ScheduledRequest e;
  e.request_id = r.request_id;
  e.num_computed_tokens = r.num_computed_tokens;
  e.num_scheduled_tokens = r.num_scheduled_tokens;
  e.resumed = r.resumed != 0;
  if (r.num_groups > 0 && (r.new_block_ids == nullptr || r.num_new_block_ids == nullptr)) {
    throw invalid_argument(
        fmt::format("{}: request \"{}\": new_block_ids or num_new_block_ids is NULL with {} groups",
                    fn, e.request_id, r.num_groups));
  }
  e.new_block_ids.resize(r.num_groups);
  for (std::size_t g = 0; g < r.num_groups; ++g) {
    const std::size_t n = r.num_new_block_ids[g];
    if (n > 0 && r.new_block_ids[g] == nullptr) {
      throw invalid_argument(
          fmt::format("{}: request \"{}\": new_block_ids[{}] is NULL but its length is {}", fn,
                      e.request_id, g, n));
    }
    if (n > 0) e.new_block_ids[g].assign(r.new_block_ids[g], r.new_block_ids[g] + n);
  }
  return e;
}

}  // namespace
}  // namespace kvoffload::capi

using namespace kvoffload;
using namespace kvoffload::capi;

extern "C" {

kvoffload_status_t kvoffload_scheduler_create(const kvoffload_scheduler_config_t* config,
                                              kvoffload_scheduler_t* scheduler) {
  return guard([&] {
    require(scheduler, "kvoffload_scheduler_create", "scheduler");
    *scheduler = nullptr;
    require(config, "kvoffload_scheduler_create", "config");
    const SchedulerConfig c = from_c(*config, "kvoffload_scheduler_create", "config");
    *scheduler = new kvoffload_scheduler_s(c, make_scheduler_services(c));
  });
}

kvoffload_status_t kvoffload_scheduler_destroy(kvoffload_scheduler_t scheduler) {
  return guard([&] { delete scheduler; });
}

kvoffload_status_t kvoffload_scheduler_update_request(kvoffload_scheduler_t s,
                                                      const char* request_id, int64_t num_tokens,
                                                      const kvoffload_block_hash_t* hashes,
                                                      size_t num_hashes, int remote_decode) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_scheduler_update_request";
    require(s, fn, "scheduler");
    require(request_id, fn, "request_id");
    read_hashes(*s, hashes, num_hashes, fn);
    s->scheduler.update_request(request_id, num_tokens, s->hashes, remote_decode != 0);
  });
}

kvoffload_status_t kvoffload_scheduler_extend_request(kvoffload_scheduler_t s,
                                                      const char* request_id, int64_t num_tokens,
                                                      const kvoffload_block_hash_t* new_hashes,
                                                      size_t num_new_hashes) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_scheduler_extend_request";
    require(s, fn, "scheduler");
    require(request_id, fn, "request_id");
    read_hashes(*s, new_hashes, num_new_hashes, fn);
    s->scheduler.extend_request(request_id, num_tokens, s->hashes);
  });
}

kvoffload_status_t kvoffload_scheduler_lookup(kvoffload_scheduler_t s, const char* request_id,
                                              int64_t num_computed_tokens, int64_t* hit_tokens) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_scheduler_lookup";
    require(s, fn, "scheduler");
    require(request_id, fn, "request_id");
    require(hit_tokens, fn, "hit_tokens");
    const auto hit = s->scheduler.lookup(request_id, num_computed_tokens);
    *hit_tokens = hit.has_value() ? *hit : KVOFFLOAD_RETRY_LATER;
  });
}

kvoffload_status_t kvoffload_scheduler_on_allocated(kvoffload_scheduler_t s, const char* request_id,
                                                    const kvoffload_allocated_group_t* groups,
                                                    size_t num_groups,
                                                    int64_t num_external_tokens) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_scheduler_on_allocated";
    require(s, fn, "scheduler");
    require(request_id, fn, "request_id");
    require_array(groups, num_groups, fn, "groups");
    std::vector<AllocatedGroup> g(num_groups);
    for (std::size_t i = 0; i < num_groups; ++i) {
      require_array(groups[i].block_ids, groups[i].num_block_ids, fn,
                    fmt::format("groups[{}].block_ids", i));
      if (groups[i].num_block_ids > 0) {
        g[i].block_ids.assign(groups[i].block_ids, groups[i].block_ids + groups[i].num_block_ids);
      }
      g[i].num_computed_blocks = groups[i].num_computed_blocks;
    }
    s->scheduler.on_allocated(request_id, g, num_external_tokens);
  });
}

kvoffload_status_t kvoffload_scheduler_build_step(kvoffload_scheduler_t s,
                                                  const kvoffload_scheduled_request_t* requests,
                                                  size_t num_requests, const char* const* preempted,
                                                  size_t num_preempted, kvoffload_step_t* step) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_scheduler_build_step";
    require(step, fn, "step");
    *step = nullptr;
    require(s, fn, "scheduler");
    require_array(requests, num_requests, fn, "requests");
    require_array(preempted, num_preempted, fn, "preempted");
    std::vector<ScheduledRequest> entries;
    entries.reserve(num_requests);
    for (std::size_t i = 0; i < num_requests; ++i) entries.push_back(to_entry(requests[i], i));
    std::vector<std::string> gone;
    for (std::size_t i = 0; i < num_preempted; ++i) {
      if (preempted[i] == nullptr) {
        throw invalid_argument(fmt::format("{}: preempted[{}] is NULL", fn, i));
      }
      gone.emplace_back(preempted[i]);
    }
    auto out = std::make_unique<kvoffload_step_s>();
    out->result = s->scheduler.build_step(entries, gone);
    for (const TransferJob& j : out->result.load_jobs) out->load_keys.push_back(keys_of(j));
    for (const TransferJob& j : out->result.store_jobs) out->store_keys.push_back(keys_of(j));
    for (const TierJob& j : out->result.tier_jobs) {
      std::vector<kvoffload_key_t> keys;
      keys.reserve(j.keys.size());
      for (const Key& k : j.keys) keys.push_back(to_c(k));
      out->tier_keys.push_back(std::move(keys));
    }
    *step = out.release();
  });
}

kvoffload_status_t kvoffload_scheduler_on_completed(kvoffload_scheduler_t s,
                                                    const kvoffload_job_report_t* reports,
                                                    size_t num_reports,
                                                    kvoffload_completed_job_t* completed,
                                                    size_t capacity, size_t* num_completed) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_scheduler_on_completed";
    require(num_completed, fn, "num_completed");
    *num_completed = 0;
    require(s, fn, "scheduler");
    require_array(reports, num_reports, fn, "reports");
    require_array(completed, capacity, fn, "completed");
    if (capacity < num_reports) {
      // Checked first: the scheduler must not change if the answer cannot be returned.
      throw invalid_argument(fmt::format(
          "{}: capacity {} is less than num_reports {} (each report may complete a job)", fn,
          capacity, num_reports));
    }
    std::vector<JobReport> r(num_reports);
    for (std::size_t i = 0; i < num_reports; ++i) {
      r[i] = JobReport{reports[i].job, reports[i].count, reports[i].ok != 0};
    }
    s->completed = s->scheduler.on_completed(r);
    for (std::size_t i = 0; i < s->completed.size(); ++i) {
      const CompletedJob& c = s->completed[i];
      completed[i] =
          kvoffload_completed_job_t{c.job, to_c(c.kind), c.request_id.c_str(), c.ok ? 1 : 0};
    }
    *num_completed = s->completed.size();
  });
}

kvoffload_status_t kvoffload_scheduler_on_finished(kvoffload_scheduler_t s,
                                                   const char* request_id) {
  return guard([&] {
    require(s, "kvoffload_scheduler_on_finished", "scheduler");
    require(request_id, "kvoffload_scheduler_on_finished", "request_id");
    s->scheduler.on_finished(request_id);
  });
}

kvoffload_status_t kvoffload_scheduler_limit_stores(kvoffload_scheduler_t s, const char* request_id,
                                                    int64_t max_tokens) {
  return guard([&] {
    require(s, "kvoffload_scheduler_limit_stores", "scheduler");
    require(request_id, "kvoffload_scheduler_limit_stores", "request_id");
    s->scheduler.limit_stores(request_id, max_tokens);
  });
}

kvoffload_status_t kvoffload_scheduler_limit_state_stores(kvoffload_scheduler_t s,
                                                          const char* request_id,
                                                          int64_t final_tokens) {
  return guard([&] {
    require(s, "kvoffload_scheduler_limit_state_stores", "scheduler");
    require(request_id, "kvoffload_scheduler_limit_state_stores", "request_id");
    s->scheduler.limit_state_stores(request_id, final_tokens);
  });
}

kvoffload_status_t kvoffload_scheduler_limit_loads(kvoffload_scheduler_t s, const char* request_id,
                                                   int64_t max_tokens) {
  return guard([&] {
    require(s, "kvoffload_scheduler_limit_loads", "scheduler");
    require(request_id, "kvoffload_scheduler_limit_loads", "request_id");
    s->scheduler.limit_loads(request_id, max_tokens);
  });
}

kvoffload_status_t kvoffload_scheduler_hint_continues(kvoffload_scheduler_t s,
                                                      const char* request_id, int continues) {
  return guard([&] {
    require(s, "kvoffload_scheduler_hint_continues", "scheduler");
    require(request_id, "kvoffload_scheduler_hint_continues", "request_id");
    if (continues != 0 && continues != 1) {
      throw invalid_argument(fmt::format(
          "kvoffload_scheduler_hint_continues: continues must be 0 or 1, got {}", continues));
    }
    s->scheduler.hint_continues(request_id, continues == 1);
  });
}

kvoffload_status_t kvoffload_scheduler_set_time(kvoffload_scheduler_t s, double seconds) {
  return guard([&] {
    require(s, "kvoffload_scheduler_set_time", "scheduler");
    s->scheduler.set_time(seconds);
  });
}

kvoffload_status_t kvoffload_scheduler_reset_cache(kvoffload_scheduler_t s) {
  return guard([&] {
    require(s, "kvoffload_scheduler_reset_cache", "scheduler");
    s->scheduler.reset_cache();
  });
}

kvoffload_status_t kvoffload_scheduler_reset_weights(kvoffload_scheduler_t s, const char* weights) {
  return guard([&] {
    require(s, "kvoffload_scheduler_reset_weights", "scheduler");
    require(weights, "kvoffload_scheduler_reset_weights", "weights");
    s->scheduler.reset_cache(std::string_view(weights));
  });
}

kvoffload_status_t kvoffload_scheduler_take_events(kvoffload_scheduler_t s,
                                                   const kvoffload_event_t** events,
                                                   size_t* num_events) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_scheduler_take_events";
    require(s, fn, "scheduler");
    require(events, fn, "events");
    require(num_events, fn, "num_events");
    s->events = s->scheduler.take_events();
    s->event_keys.clear();
    s->c_events.clear();
    for (const ManagerEvent& e : s->events) {
      std::vector<kvoffload_key_t> keys;
      keys.reserve(e.keys.size());
      for (const Key& k : e.keys) keys.push_back(to_c(k));
      s->event_keys.push_back(std::move(keys));
    }
    for (std::size_t i = 0; i < s->events.size(); ++i) {
      s->c_events.push_back(kvoffload_event_t{s->events[i].removed ? 1 : 0, s->event_keys[i].data(),
                                              s->event_keys[i].size()});
    }
    *events = s->c_events.data();
    *num_events = s->c_events.size();
  });
}

kvoffload_status_t kvoffload_scheduler_get_stats(kvoffload_scheduler_t s,
                                                 kvoffload_scheduler_stats_t* stats) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_scheduler_get_stats";
    require(s, fn, "scheduler");
    require(stats, fn, "stats");
    // 0.5.0's struct ended before pressure_skips: such a caller gets the fields it has.
    const std::size_t size = stats->struct_size;
    require_struct_size(size, offsetof(kvoffload_scheduler_stats_t, pressure_skips), fn, "stats",
                        "KVOFFLOAD_SCHEDULER_STATS_INIT");
    const CacheStats c = s->scheduler.cache_stats();
    kvoffload_scheduler_stats_t o = KVOFFLOAD_SCHEDULER_STATS_INIT;
#define KVOFFLOAD_COPY_FIELD(name) o.name = c.name;
    KVOFFLOAD_CACHE_STATS_FIELDS(KVOFFLOAD_COPY_FIELD)
#undef KVOFFLOAD_COPY_FIELD
    o.struct_size = size;
    std::memcpy(stats, &o, std::min(size, sizeof o));
  });
}

kvoffload_status_t kvoffload_scheduler_set_store_pressure(kvoffload_scheduler_t s, int on) {
  return guard([&] {
    require(s, "kvoffload_scheduler_set_store_pressure", "scheduler");
    s->scheduler.set_store_pressure(on != 0);
  });
}

kvoffload_status_t kvoffload_scheduler_handed_out(kvoffload_scheduler_t s,
                                                  const kvoffload_block_id_t* block_ids,
                                                  size_t num_block_ids) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_scheduler_handed_out";
    require(s, fn, "scheduler");
    require_array(block_ids, num_block_ids, fn, "block_ids");
    if (num_block_ids == 0) return;
    s->scheduler.handed_out(std::span(block_ids, num_block_ids));
  });
}

kvoffload_status_t kvoffload_step_num_jobs(kvoffload_step_t step, kvoffload_job_kind_t kind,
                                           size_t* num_jobs) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_step_num_jobs";
    require(step, fn, "step");
    require(num_jobs, fn, "num_jobs");
    *num_jobs = is_load(kind, fn) ? step->result.load_jobs.size() : step->result.store_jobs.size();
  });
}

kvoffload_status_t kvoffload_step_get_job(kvoffload_step_t step, kvoffload_job_kind_t kind,
                                          size_t index, kvoffload_job_t* job) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_step_get_job";
    require(step, fn, "step");
    require(job, fn, "job");
    const bool load = is_load(kind, fn);
    const auto& jobs = load ? step->result.load_jobs : step->result.store_jobs;
    if (index >= jobs.size()) {
      throw invalid_argument(fmt::format("{}: index {} is out of range ({} {} jobs)", fn, index,
                                         jobs.size(), load ? "load" : "store"));
    }
    const TransferJob& j = jobs[index];
    const auto& keys = (load ? step->load_keys : step->store_keys)[index];
    *job = kvoffload_job_t{j.id,
                           load ? KVOFFLOAD_JOB_LOAD : KVOFFLOAD_JOB_STORE,
                           j.request_id.c_str(),
                           keys.data(),
                           j.host_block_ids.data(),
                           j.host_block_ids.size(),
                           j.gpu.block_ids.data(),
                           j.gpu.block_ids.size(),
                           j.gpu.group_sizes.data(),
                           j.gpu.block_indices.data(),
                           j.gpu.group_sizes.size()};
  });
}

kvoffload_status_t kvoffload_step_get_flush(kvoffload_step_t step, const kvoffload_job_id_t** jobs,
                                            size_t* num_jobs) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_step_get_flush";
    require(step, fn, "step");
    require(jobs, fn, "jobs");
    require(num_jobs, fn, "num_jobs");
    *jobs = step->result.flush.data();
    *num_jobs = step->result.flush.size();
  });
}

kvoffload_status_t kvoffload_step_destroy(kvoffload_step_t step) {
  return guard([&] { delete step; });
}

}  // extern "C"

kvoffload_status_t kvoffload_step_num_tier_jobs(kvoffload_step_t step, size_t* num_jobs) {
  return guard([&] {
    require(num_jobs, "kvoffload_step_num_tier_jobs", "num_jobs");
    require(step, "kvoffload_step_num_tier_jobs", "step");
    *num_jobs = step->result.tier_jobs.size();
  });
}

kvoffload_status_t kvoffload_step_get_tier_job(kvoffload_step_t step, size_t index,
                                               kvoffload_tier_job_t* job) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_step_get_tier_job";
    require(step, fn, "step");
    require(job, fn, "job");
    const auto& jobs = step->result.tier_jobs;
    if (index >= jobs.size()) {
      throw invalid_argument(fmt::format("{}: index {} is out of range (the step has {} tier jobs)",
                                         fn, index, jobs.size()));
    }
    const TierJob& j = jobs[index];
    job->id = j.id;
    job->kind = to_c(j.kind);
    job->tier = j.tier;
    job->request_id = j.request_id.c_str();
    job->keys = step->tier_keys[index].data();
    job->host_block_ids = j.host_block_ids.data();
    job->slots = j.slots.data();
    job->num_blocks = j.keys.size();
    job->epoch = j.epoch;
  });
}

kvoffload_status_t kvoffload_scheduler_restore_tier(kvoffload_scheduler_t s, size_t tier,
                                                    const kvoffload_key_t* keys,
                                                    const uint8_t* present, size_t num_slots,
                                                    int64_t* restored) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_scheduler_restore_tier";
    require(s, fn, "scheduler");
    require_array(keys, num_slots, fn, "keys");
    require_array(present, num_slots, fn, "present");
    std::vector<std::optional<Key>> slots(num_slots);
    for (std::size_t i = 0; i < num_slots; ++i) {
      if (present[i] != 0) slots[i] = from_c(keys[i], fn, i);
    }
    const std::int64_t n = s->scheduler.restore_tier(tier, slots);
    if (restored != nullptr) *restored = n;
  });
}

kvoffload_status_t kvoffload_scheduler_get_tier_stats(kvoffload_scheduler_t s, size_t tier,
                                                      kvoffload_tier_stats_t* stats) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_scheduler_get_tier_stats";
    require(s, fn, "scheduler");
    require(stats, fn, "stats");
    // Structs from before promotions_overdue are filled as far as they reach.
    constexpr std::size_t v1_size = offsetof(kvoffload_tier_stats_t, promotions_overdue);
    require_struct_size(stats->struct_size, v1_size, fn, "stats", "KVOFFLOAD_TIER_STATS_INIT");
    const TierStats t = s->scheduler.tier_stats(tier);
    kvoffload_tier_stats_t out = KVOFFLOAD_TIER_STATS_INIT;
#define KVOFFLOAD_C_FIELD(name) out.name = t.name;
    KVOFFLOAD_TIER_STATS_FIELDS(KVOFFLOAD_C_FIELD)
#undef KVOFFLOAD_C_FIELD
    const std::size_t size = std::min(stats->struct_size, sizeof(out));
    out.struct_size = stats->struct_size;
    std::memcpy(stats, &out, size);
  });
}

kvoffload_status_t kvoffload_scheduler_metrics_text(kvoffload_scheduler_t s, const char** text,
                                                    size_t* length) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_scheduler_metrics_text";
    require(s, fn, "scheduler");
    require(text, fn, "text");
    require(length, fn, "length");
    s->metrics = metrics_text(s->scheduler);
    *text = s->metrics.c_str();
    *length = s->metrics.size();
  });
}

kvoffload_status_t kvoffload_scheduler_event_media(kvoffload_scheduler_t s,
                                                   const char* const** media, size_t* num_events) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_scheduler_event_media";
    require(s, fn, "scheduler");
    require(media, fn, "media");
    require(num_events, fn, "num_events");
    s->event_media.clear();
    // to_string returns views of static strings: stable pointers.
    for (const ManagerEvent& e : s->events) s->event_media.push_back(to_string(e.medium).data());
    *media = s->event_media.data();
    *num_events = s->event_media.size();
  });
}
