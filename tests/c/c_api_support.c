/* The C API tests' shared helpers (c_api_support.h). */
#define _POSIX_C_SOURCE 200809L
#include "c_api_support.h"

#include <stdlib.h>

int failures = 0;

unsigned char gpu[GPU_BLOCKS * PAGE];

kvoffload_block_hash_t hash_of(int i) {
  kvoffload_block_hash_t h;
  memset(&h, 0, sizeof(h));
  h.size = 16; /* what a shared tier needs at least */
  h.bytes[0] = (unsigned char)(i + 1);
  h.bytes[15] = 0x5a;
  return h;
}

void fill_page(int block, int label) {
  int i;
  for (i = 0; i < PAGE; ++i) gpu[block * PAGE + i] = (unsigned char)(label * 31 + i);
}

int page_has(int block, int label) {
  int i;
  for (i = 0; i < PAGE; ++i) {
    if (gpu[block * PAGE + i] != (unsigned char)(label * 31 + i)) return 0;
  }
  return 1;
}

/* A worker config over `gpu`: one tensor, one group using whole pages. */
void one_tensor_worker(kvoffload_worker_config_t* wc, kvoffload_kv_tensor_t* tensor,
                       kvoffload_group_tensor_t* gt, kvoffload_group_tensors_t* gts) {
  tensor->base = (uintptr_t)gpu;
  tensor->num_blocks = GPU_BLOCKS;
  tensor->page_bytes = PAGE;
  tensor->block_stride_bytes = PAGE;
  gt->tensor = 0;
  gt->page_bytes = PAGE;
  gts->tensors = gt;
  gts->num_tensors = 1;
  wc->tensors = tensor;
  wc->num_tensors = 1;
  wc->groups = gts;
  wc->num_groups = 1;
}

/* With `disk_dir`, the worker gets a disk tier there and the scheduler a tier of its slots,
 * restored from the worker's scan. */
const char* tiered_weights = NULL;

void make_tiered(kvoffload_scheduler_t* s, kvoffload_worker_t* w, const char* disk_dir) {
  kvoffload_group_config_t group = KVOFFLOAD_GROUP_CONFIG_INIT;
  kvoffload_scheduler_config_t sc = KVOFFLOAD_SCHEDULER_CONFIG_INIT;
  kvoffload_kv_tensor_t tensor;
  kvoffload_group_tensor_t gt;
  kvoffload_group_tensors_t gts;
  kvoffload_worker_config_t wc = KVOFFLOAD_WORKER_CONFIG_INIT;

  kvoffload_disk_tier_config_t disk = KVOFFLOAD_DISK_TIER_CONFIG_INIT;
  kvoffload_tier_config_t tier = KVOFFLOAD_TIER_CONFIG_INIT;
  const kvoffload_key_t* keys = NULL;
  const uint8_t* present = NULL;
  size_t num_slots = 0;
  int64_t restored = -1;

  /* One description, the scheduler's config; the worker derives its factor, pool and tiers
   * from it. A disk tier's blocks are the worker's slots, known once it has opened them. */
  group.gpu_block_size = BLOCK_TOKENS;
  sc.groups = &group;
  sc.num_groups = 1;
  sc.block_size_factor = F;
  sc.host_blocks = 8;
  sc.weights = tiered_weights;
  if (disk_dir != NULL) {
    disk.path = disk_dir;
    disk.capacity_bytes = 16 * (4096 + 4096);
    disk.model = "c-api-test";
    tier.blocks = 1;
    tier.disk = &disk;
    sc.tiers = &tier;
    sc.num_tiers = 1;
  }
  one_tensor_worker(&wc, &tensor, &gt, &gts);
  wc.scheduler = &sc;
  wc.threads = 1;
  OK(kvoffload_worker_create(&wc, w));
  if (disk_dir != NULL) {
    OK(kvoffload_worker_tier_scan(*w, 0, &keys, &present, &num_slots));
    CHECK(num_slots == 16);
    tier.blocks = (int64_t)num_slots;
  }
  OK(kvoffload_scheduler_create(&sc, s));
  if (disk_dir != NULL) {
    OK(kvoffload_scheduler_restore_tier(*s, 0, keys, present, num_slots, &restored));
    CHECK(restored >= 0);
    /* Restored: the scan is freed, and reading it again finds nothing. */
    OK(kvoffload_worker_tier_scan_release(*w, 0));
    OK(kvoffload_worker_tier_scan(*w, 0, &keys, &present, &num_slots));
    CHECK(num_slots == 0);
    CHECK(kvoffload_worker_tier_scan_release(*w, 1) == KVOFFLOAD_INVALID_ARGUMENT);
  }
}

void make(kvoffload_scheduler_t* s, kvoffload_worker_t* w) {
  make_tiered(s, w, NULL);
}

/* Runs every job of the step on the worker, waits, and reports them to the scheduler. */
void run_step(kvoffload_scheduler_t s, kvoffload_worker_t w, kvoffload_step_t step, size_t* loads,
              size_t* stores) {
  kvoffload_job_report_t reports[16];
  kvoffload_completed_job_t done[16];
  kvoffload_job_id_t ids[16];
  kvoffload_finished_transfer_t fin[16];
  size_t n_reports = 0, n_done = 0, n_fin = 0, got = 0, n_tier = 0, i, k;
  int kind;
  for (kind = 0; kind < 2; ++kind) {
    size_t n = 0;
    OK(kvoffload_step_num_jobs(step, (kvoffload_job_kind_t)kind, &n));
    if (kind == KVOFFLOAD_JOB_LOAD)
      *loads = n;
    else
      *stores = n;
    for (i = 0; i < n; ++i) {
      kvoffload_job_t job;
      OK(kvoffload_step_get_job(step, (kvoffload_job_kind_t)kind, i, &job));
      CHECK(job.num_groups == 1 && job.group_sizes[0] == (int64_t)job.num_gpu_block_ids);
      OK(kvoffload_worker_submit(w, &job));
      ids[n_reports] = job.id;
      reports[n_reports].job = job.id;
      reports[n_reports].count = 1;
      reports[n_reports].ok = 1;
      n_reports++;
    }
  }
  {
    size_t n = 0;
    OK(kvoffload_step_num_tier_jobs(step, &n));
    for (i = 0; i < n; ++i) {
      kvoffload_tier_job_t job;
      OK(kvoffload_step_get_tier_job(step, i, &job));
      OK(kvoffload_worker_submit_tier(w, &job));
      ids[n_reports] = job.id;
      reports[n_reports].job = job.id;
      reports[n_reports].count = 1;
      reports[n_reports].ok = 1;
      n_reports++;
      n_tier++;
    }
  }
  OK(kvoffload_worker_wait(w, ids, n_reports));
  for (i = 0; got < n_reports; ++i) {
    CHECK(i < 10000); /* bounded: a finished record lost would spin here */
    /* capacity 1: the rest must wait for the next call, none lost */
    OK(kvoffload_worker_get_finished(w, fin + got, 1, &n_fin));
    CHECK(n_fin <= 1);
    for (k = 0; k < n_fin; ++k) CHECK(fin[got + k].ok == 1 && fin[got + k].error[0] == '\0');
    got += n_fin;
    if (n_fin == 0) OK(kvoffload_worker_wait(w, ids, n_reports));
  }
  OK(kvoffload_scheduler_on_completed(s, reports, n_reports, done, 16, &n_done));
  CHECK(n_done == n_reports - n_tier); /* tier jobs complete no request */
}

/* One request's step: `blocks` allocated for the whole prompt, `hit` tokens of it from the
   cache (loaded), the rest scheduled (stored), every job run on the worker. */
void allocate_and_step(kvoffload_scheduler_t s, kvoffload_worker_t w, const char* id,
                       kvoffload_block_id_t* blocks, int64_t hit, size_t* loads, size_t* stores) {
  const kvoffload_block_id_t* lists[1];
  size_t counts[1] = {4};
  kvoffload_scheduled_request_t req;
  kvoffload_allocated_group_t alloc;
  kvoffload_step_t step = NULL;
  alloc.block_ids = blocks;
  alloc.num_block_ids = 4;
  alloc.num_computed_blocks = 0;
  OK(kvoffload_scheduler_on_allocated(s, id, &alloc, 1, hit));
  lists[0] = blocks;
  memset(&req, 0, sizeof(req));
  req.request_id = id;
  req.num_computed_tokens = hit;
  req.num_scheduled_tokens = TOKENS - hit;
  req.new_block_ids = lists;
  req.num_new_block_ids = counts;
  req.num_groups = 1;
  OK(kvoffload_scheduler_build_step(s, &req, 1, NULL, 0, &step));
  run_step(s, w, step, loads, stores);
  OK(kvoffload_step_destroy(step));
}
