// The C API's worker handle: the KV layout, a host pool and a TransferEngine on the host or
// CUDA backend (include/kvoffload/kvoffload.h).

#include <cstddef>
#include <deque>
#include <mutex>
#include <vector>

#include "c_api/c_api_common.hpp"
#include "kvoffload/cuda_backend.hpp"
#include "kvoffload/metrics_text.hpp"
#include "kvoffload/worker.hpp"

struct kvoffload_worker_s {
  explicit kvoffload_worker_s(const kvoffload::WorkerConfig& c) : worker(c) {}
  kvoffload::Worker worker;
  std::mutex mutex;  // guards the two queues below (the worker locks itself)
  std::deque<kvoffload::FinishedTransfer> pending;  // finished, not yet handed out
  std::vector<kvoffload::FinishedTransfer> handed;  // the last call's, owning the messages
  std::vector<kvoffload_key_t> scan_keys;           // the last tier_scan's
  std::vector<std::uint8_t> scan_present;
  std::string metrics;  // the last metrics_text
};

namespace kvoffload::capi {
namespace {

TransferJob to_job(const kvoffload_job_t& j) {
  constexpr std::string_view fn = "kvoffload_worker_submit";
  const int kind = raw_enum(j.kind);
  if (kind != KVOFFLOAD_JOB_LOAD && kind != KVOFFLOAD_JOB_STORE) {
    throw invalid_argument(fmt::format("{}: job {}: kind is {} (0 load, 1 store)", fn, j.id, kind));
  }
  const std::string job = fmt::format("job {}", j.id);
  require_array(j.keys, j.num_host_blocks, fn, job + " keys");
  require_array(j.host_block_ids, j.num_host_blocks, fn, job + " host_block_ids");
  require_array(j.gpu_block_ids, j.num_gpu_block_ids, fn, job + " gpu_block_ids");
  require_array(j.group_sizes, j.num_groups, fn, job + " group_sizes");
  require_array(j.block_indices, j.num_groups, fn, job + " block_indices");
  TransferJob t;
  t.id = j.id;
  t.kind = kind == KVOFFLOAD_JOB_LOAD ? JobKind::load : JobKind::store;
  t.request_id = j.request_id != nullptr ? j.request_id : "";
  for (std::size_t i = 0; i < j.num_host_blocks; ++i) t.keys.push_back(from_c(j.keys[i], fn, i));
  t.host_block_ids.assign(j.host_block_ids, j.host_block_ids + j.num_host_blocks);
  t.gpu.block_ids.assign(j.gpu_block_ids, j.gpu_block_ids + j.num_gpu_block_ids);
  t.gpu.group_sizes.assign(j.group_sizes, j.group_sizes + j.num_groups);
  t.gpu.block_indices.assign(j.block_indices, j.block_indices + j.num_groups);
  return t;
}

}  // namespace
}  // namespace kvoffload::capi

using namespace kvoffload;
using namespace kvoffload::capi;

extern "C" {

kvoffload_status_t kvoffload_worker_create(const kvoffload_worker_config_t* config,
                                           kvoffload_worker_t* worker) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_worker_create";
    require(worker, fn, "worker");
    *worker = nullptr;
    require(config, fn, "config");
    const kvoffload_worker_config_t& c = *config;
    // 0.3 moved fields (the scheduler pointer replaced 0.2's factor, pool size and tier
    // arrays): a struct of any other size is from another header, and reading it would read
    // its fields at the wrong offsets.
    // 0.5.0's struct ended at tp_rank: accepted, with max_store_bytes_in_flight 0.
    constexpr std::size_t v050 = offsetof(kvoffload_worker_config_t, max_store_bytes_in_flight);
    const bool old = c.struct_size == v050;
    if (!old && c.struct_size != sizeof(kvoffload_worker_config_t)) {
      throw invalid_argument(fmt::format(
          "{}: config->struct_size is {}, but this library's kvoffload_worker_config_t is {} "
          "bytes: rebuild against its header and initialize with KVOFFLOAD_WORKER_CONFIG_INIT",
          fn, c.struct_size, sizeof(kvoffload_worker_config_t)));
    }
    require(c.scheduler, fn, "config->scheduler");
    const SchedulerConfig description = from_c(*c.scheduler, fn, "config->scheduler");
    for (std::size_t t = 0; t < description.tiers.size(); ++t) {
      if (!description.tiers[t].store) {
        throw invalid_argument(fmt::format(
            "{}: config->scheduler->tiers[{}].disk is NULL: a worker runs the tier's store", fn,
            t));
      }
    }
    require_array(c.tensors, c.num_tensors, fn, "config->tensors");
    require_array(c.groups, c.num_groups, fn, "config->groups");
    WorkerConfig wc;
    for (std::size_t i = 0; i < c.num_tensors; ++i) {
      const kvoffload_kv_tensor_t& t = c.tensors[i];
      wc.tensors.push_back({t.base, t.num_blocks, t.page_bytes, t.block_stride_bytes});
    }
    wc.groups.resize(c.num_groups);
    for (std::size_t g = 0; g < c.num_groups; ++g) {
      require_array(c.groups[g].tensors, c.groups[g].num_tensors, fn,
                    fmt::format("config->groups[{}].tensors", g));
      for (std::size_t k = 0; k < c.groups[g].num_tensors; ++k) {
        wc.groups[g].push_back({c.groups[g].tensors[k].tensor, c.groups[g].tensors[k].page_bytes});
      }
    }
    wc.threads = c.threads;
    wc.cuda_device = c.cuda_device;
    wc.defer_stores = c.defer_stores != 0;
    if (c.has_compute_stream != 0) wc.compute_stream = c.compute_stream;
    wc.loads_wait_for_compute = c.loads_wait_for_compute != 0;
    wc.tp_rank = c.tp_rank;
    if (!old) wc.max_store_bytes_in_flight = c.max_store_bytes_in_flight;
    switch (raw_enum(c.backend)) {
      case KVOFFLOAD_BACKEND_HOST: wc.backend = BackendKind::host; break;
      case KVOFFLOAD_BACKEND_CUDA: wc.backend = BackendKind::cuda; break;
      default:
        throw invalid_argument(
            fmt::format("{}: config->backend is {} (0 host, 1 cuda)", fn, raw_enum(c.backend)));
    }
    auto w = std::make_unique<kvoffload_worker_s>(derive_worker_config(description, wc));
    *worker = w.release();
  });
}

kvoffload_status_t kvoffload_worker_set_compute_stream(kvoffload_worker_t w, int has_stream,
                                                       uintptr_t stream) {
  return guard([&] {
    require(w, "kvoffload_worker_set_compute_stream", "worker");
    w->worker.set_compute_stream(has_stream != 0 ? std::optional<StreamHandle>(stream)
                                                 : std::nullopt);
  });
}

kvoffload_status_t kvoffload_worker_destroy(kvoffload_worker_t worker) {
  return guard([&] { delete worker; });
}

kvoffload_status_t kvoffload_worker_submit(kvoffload_worker_t w, const kvoffload_job_t* job) {
  return guard([&] {
    require(w, "kvoffload_worker_submit", "worker");
    require(job, "kvoffload_worker_submit", "job");
    w->worker.submit(to_job(*job));
  });
}

kvoffload_status_t kvoffload_worker_start_step(kvoffload_worker_t w) {
  return guard([&] {
    require(w, "kvoffload_worker_start_step", "worker");
    w->worker.start_step();
  });
}

kvoffload_status_t kvoffload_worker_get_finished(kvoffload_worker_t w,
                                                 kvoffload_finished_transfer_t* finished,
                                                 size_t capacity, size_t* num_finished) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_worker_get_finished";
    require(num_finished, fn, "num_finished");
    *num_finished = 0;
    require(w, fn, "worker");
    require_array(finished, capacity, fn, "finished");
    std::lock_guard lock(w->mutex);
    for (FinishedTransfer& f : w->worker.get_finished()) w->pending.push_back(std::move(f));
    w->handed.clear();
    while (w->handed.size() < capacity && !w->pending.empty()) {
      w->handed.push_back(std::move(w->pending.front()));
      w->pending.pop_front();
    }
    for (std::size_t i = 0; i < w->handed.size(); ++i) {
      const FinishedTransfer& f = w->handed[i];
      finished[i] = kvoffload_finished_transfer_t{f.job, to_c(f.kind), f.ok ? 1 : 0,
                                                  f.error.c_str(), f.bytes};
    }
    *num_finished = w->handed.size();
  });
}

kvoffload_status_t kvoffload_worker_wait(kvoffload_worker_t w, const kvoffload_job_id_t* jobs,
                                         size_t num_jobs) {
  return guard([&] {
    require(w, "kvoffload_worker_wait", "worker");
    require_array(jobs, num_jobs, "kvoffload_worker_wait", "jobs");
    w->worker.wait(std::span<const JobId>(jobs, num_jobs));
  });
}

kvoffload_status_t kvoffload_worker_host_block(kvoffload_worker_t w, int32_t block, void** data,
                                               size_t* block_bytes) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_worker_host_block";
    require(w, fn, "worker");
    require(data, fn, "data");
    require(block_bytes, fn, "block_bytes");
    const std::span<std::byte> b = w->worker.host_block(block);
    *data = b.data();
    *block_bytes = b.size();
  });
}

}  // extern "C"

kvoffload_status_t kvoffload_worker_submit_tier(kvoffload_worker_t w,
                                                const kvoffload_tier_job_t* job) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_worker_submit_tier";
    require(w, fn, "worker");
    require(job, fn, "job");
    TierJob t;
    t.id = job->id;
    switch (raw_enum(job->kind)) {
      case KVOFFLOAD_JOB_TIER_PROMOTE: t.kind = JobKind::promote; break;
      case KVOFFLOAD_JOB_TIER_WRITE: t.kind = JobKind::write; break;
      default:
        throw invalid_argument(fmt::format(
            "{}: job {}: kind is {} (KVOFFLOAD_JOB_TIER_PROMOTE {} or _TIER_WRITE {})", fn, job->id,
            raw_enum(job->kind), static_cast<int>(KVOFFLOAD_JOB_TIER_PROMOTE),
            static_cast<int>(KVOFFLOAD_JOB_TIER_WRITE)));
    }
    t.tier = job->tier;  // the worker's tier t knows its own kind
    t.epoch = job->epoch;
    if (job->request_id != nullptr) t.request_id = job->request_id;
    require_array(job->keys, job->num_blocks, fn, "job->keys");
    require_array(job->host_block_ids, job->num_blocks, fn, "job->host_block_ids");
    require_array(job->slots, job->num_blocks, fn, "job->slots");
    for (std::size_t i = 0; i < job->num_blocks; ++i) {
      t.keys.push_back(from_c(job->keys[i], fn, i));
      t.host_block_ids.push_back(job->host_block_ids[i]);
      t.slots.push_back(job->slots[i]);
    }
    w->worker.submit_tier(t);
  });
}

namespace {
/// Throws invalid_argument naming the C function for a tier the worker does not have.
void require_tier(kvoffload_worker_t w, std::size_t tier, std::string_view fn) {
  if (tier >= w->worker.num_tiers()) {
    throw invalid_argument(
        fmt::format("{}: tier {} is not configured ({} tiers)", fn, tier, w->worker.num_tiers()));
  }
}
}  // namespace

kvoffload_status_t kvoffload_worker_tier_scan(kvoffload_worker_t w, size_t tier,
                                              const kvoffload_key_t** keys, const uint8_t** present,
                                              size_t* num_slots) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_worker_tier_scan";
    require(w, fn, "worker");
    require(keys, fn, "keys");
    require(present, fn, "present");
    require(num_slots, fn, "num_slots");
    require_tier(w, tier, fn);
    const auto& scanned = w->worker.tier(tier).scanned();
    std::lock_guard lock(w->mutex);
    w->scan_keys.assign(scanned.size(), kvoffload_key_t{});
    w->scan_present.assign(scanned.size(), 0);
    for (std::size_t i = 0; i < scanned.size(); ++i) {
      if (scanned[i]) {
        w->scan_keys[i] = to_c(*scanned[i]);
        w->scan_present[i] = 1;
      }
    }
    *keys = w->scan_keys.data();
    *present = w->scan_present.data();
    *num_slots = scanned.size();
  });
}

kvoffload_status_t kvoffload_worker_tier_scan_release(kvoffload_worker_t w, size_t tier) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_worker_tier_scan_release";
    require(w, fn, "worker");
    require_tier(w, tier, fn);
    // Under the lock kvoffload_worker_tier_scan reads the tier's scan with.
    std::lock_guard lock(w->mutex);
    w->worker.release_tier_scan(tier);
    std::vector<kvoffload_key_t>().swap(w->scan_keys);
    std::vector<std::uint8_t>().swap(w->scan_present);
  });
}

kvoffload_status_t kvoffload_worker_metrics_text(kvoffload_worker_t w, const char** text,
                                                 size_t* length) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_worker_metrics_text";
    require(w, fn, "worker");
    require(text, fn, "text");
    require(length, fn, "length");
    std::string rendered = metrics_text(w->worker);
    std::lock_guard lock(w->mutex);
    w->metrics = std::move(rendered);
    *text = w->metrics.c_str();
    *length = w->metrics.size();
  });
}

kvoffload_status_t kvoffload_worker_store_pressure(kvoffload_worker_t w, int* on) {
  return guard([&] {
    constexpr std::string_view fn = "kvoffload_worker_store_pressure";
    require(w, fn, "worker");
    require(on, fn, "on");
    *on = w->worker.store_pressure() ? 1 : 0;
  });
}

kvoffload_status_t kvoffload_worker_clear_tiers(kvoffload_worker_t w) {
  return guard([&] {
    require(w, "kvoffload_worker_clear_tiers", "worker");
    w->worker.clear_tiers();
  });
}
