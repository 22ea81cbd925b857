/* The C API from C99: one full lifecycle (store a prompt, load it back into other blocks and
 * compare the bytes) and every status a caller can provoke without a GPU. Exits non-zero with
 * the failing line on the first failed check. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvoffload/kvoffload.h"

static int failures = 0;

/* Exported by the library for this test, not declared in kvoffload.h: raises the C++ exception
   of a status's row of error.hpp's table inside the library. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_internal_raise_for_test(int status,
                                                                     const char* message);

#define CHECK(cond)                                                                            \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "%s:%d: CHECK(%s) failed (last error: %s)\n", __FILE__, __LINE__, #cond, \
              kvoffload_last_error());                                                         \
      failures++;                                                                              \
      return;                                                                                  \
    }                                                                                          \
  } while (0)

#define OK(call) CHECK((call) == KVOFFLOAD_SUCCESS)
#define FAILS_WITH(call, status, needle)                     \
  do {                                                       \
    CHECK((call) == (status));                               \
    CHECK(strstr(kvoffload_last_error(), (needle)) != NULL); \
  } while (0)

enum { GPU_BLOCKS = 64, PAGE = 256, F = 2, TOKENS = 64, BLOCK_TOKENS = 16 };

static unsigned char gpu[GPU_BLOCKS * PAGE];

static kvoffload_block_hash_t hash_of(int i) {
  kvoffload_block_hash_t h;
  memset(&h, 0, sizeof(h));
  h.size = 8;
  h.bytes[0] = (unsigned char)(i + 1);
  h.bytes[7] = 0x5a;
  return h;
}

static void fill_page(int block, int label) {
  int i;
  for (i = 0; i < PAGE; ++i) gpu[block * PAGE + i] = (unsigned char)(label * 31 + i);
}

static int page_has(int block, int label) {
  int i;
  for (i = 0; i < PAGE; ++i) {
    if (gpu[block * PAGE + i] != (unsigned char)(label * 31 + i)) return 0;
  }
  return 1;
}

/* A worker config over `gpu`: one tensor, one group using whole pages. */
static void one_tensor_worker(kvoffload_worker_config_t* wc, kvoffload_kv_tensor_t* tensor,
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
static void make_tiered(kvoffload_scheduler_t* s, kvoffload_worker_t* w, const char* disk_dir) {
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
  }
}

static void make(kvoffload_scheduler_t* s, kvoffload_worker_t* w) {
  make_tiered(s, w, NULL);
}

/* Runs every job of the step on the worker, waits, and reports them to the scheduler. */
static void run_step(kvoffload_scheduler_t s, kvoffload_worker_t w, kvoffload_step_t step,
                     size_t* loads, size_t* stores) {
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
static void allocate_and_step(kvoffload_scheduler_t s, kvoffload_worker_t w, const char* id,
                              kvoffload_block_id_t* blocks, int64_t hit, size_t* loads,
                              size_t* stores) {
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

static void lifecycle(void) {
  kvoffload_scheduler_t s = NULL;
  kvoffload_worker_t w = NULL;
  kvoffload_block_hash_t hashes[TOKENS / BLOCK_TOKENS];
  kvoffload_block_id_t first[4] = {1, 2, 3, 4}, second[4] = {9, 10, 11, 12};
  const kvoffload_block_id_t* lists[1];
  size_t counts[1] = {4};
  kvoffload_scheduled_request_t req;
  kvoffload_allocated_group_t alloc;
  kvoffload_step_t step = NULL;
  kvoffload_scheduler_stats_t stats = KVOFFLOAD_SCHEDULER_STATS_INIT;
  const kvoffload_event_t* events = NULL;
  size_t n_events = 0, loads = 0, stores = 0;
  int64_t hit = -7;
  int i, version = 0;

  OK(kvoffload_get_version(&version));
  CHECK(version == KVOFFLOAD_VERSION_CODE);
  make(&s, &w);
  CHECK(s != NULL && w != NULL);
  for (i = 0; i < TOKENS / BLOCK_TOKENS; ++i) hashes[i] = hash_of(i);
  for (i = 0; i < 4; ++i) fill_page(first[i], 100 + i);

  /* Request a: a miss, computed, stored (two host blocks of two GPU blocks). */
  OK(kvoffload_scheduler_update_request(s, "a", TOKENS, hashes, 4, 0));
  OK(kvoffload_scheduler_lookup(s, "a", 0, &hit));
  CHECK(hit == 0);
  alloc.block_ids = first;
  alloc.num_block_ids = 4;
  alloc.num_computed_blocks = 0;
  OK(kvoffload_scheduler_on_allocated(s, "a", &alloc, 1, 0));
  lists[0] = first;
  memset(&req, 0, sizeof(req));
  req.request_id = "a";
  req.num_scheduled_tokens = TOKENS;
  req.new_block_ids = lists;
  req.num_new_block_ids = counts;
  req.num_groups = 1;
  OK(kvoffload_scheduler_build_step(s, &req, 1, NULL, 0, &step));
  run_step(s, w, step, &loads, &stores);
  CHECK(loads == 0 && stores == 1);
  OK(kvoffload_step_destroy(step));
  OK(kvoffload_scheduler_on_finished(s, "a"));
  OK(kvoffload_scheduler_take_events(s, &events, &n_events));
  CHECK(n_events == 1 && events[0].removed == 0 && events[0].num_keys == 2);
  CHECK(events[0].keys[0].hash.size == 8 && events[0].keys[0].hash.bytes[0] == 2);

  /* Request b, same prompt: all 64 tokens hit (minus the last, recomputed) and are loaded into
   * other blocks. */
  OK(kvoffload_scheduler_update_request(s, "b", TOKENS, hashes, 4, 0));
  OK(kvoffload_scheduler_lookup(s, "b", 0, &hit));
  CHECK(hit == TOKENS - 2 * BLOCK_TOKENS || hit == TOKENS);
  alloc.block_ids = second;
  OK(kvoffload_scheduler_on_allocated(s, "b", &alloc, 1, hit));
  lists[0] = second;
  req.request_id = "b";
  req.num_computed_tokens = hit;
  req.num_scheduled_tokens = TOKENS - hit;
  counts[0] = 4;
  OK(kvoffload_scheduler_build_step(s, &req, 1, NULL, 0, &step));
  run_step(s, w, step, &loads, &stores);
  CHECK(loads == 1);
  OK(kvoffload_step_destroy(step));
  for (i = 0; i < hit / BLOCK_TOKENS; ++i) CHECK(page_has(second[i], 100 + i));
  OK(kvoffload_scheduler_get_stats(s, &stats));
  CHECK(stats.blocks_stored == 2 && stats.load_jobs == 1 && stats.store_jobs >= 1);
  CHECK(stats.blocks_total == 8 && stats.blocks_used == 2);
  OK(kvoffload_scheduler_reset_cache(s));
  OK(kvoffload_scheduler_get_stats(s, &stats));
  CHECK(stats.blocks_used == 0);
  OK(kvoffload_worker_destroy(w));
  OK(kvoffload_scheduler_destroy(s));
}

/* A disk tier through the C API: a store is written through; after a "restart" (new worker
 * and scheduler on the same directory) the scan finds it, a lookup promotes it and the load
 * brings the same bytes into other GPU blocks. */
static void disk_tier(void) {
  char dir[] = "/tmp/kvoffload-c-api-XXXXXX";
  char cleanup[64];
  kvoffload_scheduler_t s = NULL;
  kvoffload_worker_t w = NULL;
  kvoffload_block_hash_t hashes[TOKENS / BLOCK_TOKENS];
  kvoffload_block_id_t first[4] = {21, 22, 23, 24}, second[4] = {31, 32, 33, 34};
  kvoffload_step_t step = NULL;
  kvoffload_tier_stats_t ts = KVOFFLOAD_TIER_STATS_INIT;
  size_t loads = 0, stores = 0, n_tier = 0;
  int64_t hit = -7;
  int i;

  CHECK(mkdtemp(dir) != NULL);
  make_tiered(&s, &w, dir);
  for (i = 0; i < TOKENS / BLOCK_TOKENS; ++i) hashes[i] = hash_of(40 + i);
  for (i = 0; i < 4; ++i) fill_page(first[i], 60 + i);
  OK(kvoffload_scheduler_update_request(s, "a", TOKENS, hashes, 4, 0));
  OK(kvoffload_scheduler_lookup(s, "a", 0, &hit));
  CHECK(hit == 0);
  allocate_and_step(s, w, "a", first, 0, &loads, &stores);
  CHECK(stores == 1);
  /* The next step writes the stored blocks to the disk. */
  OK(kvoffload_scheduler_build_step(s, NULL, 0, NULL, 0, &step));
  OK(kvoffload_step_num_tier_jobs(step, &n_tier));
  CHECK(n_tier == 1);
  run_step(s, w, step, &loads, &stores);
  OK(kvoffload_step_destroy(step));
  OK(kvoffload_scheduler_get_tier_stats(s, 0, &ts));
  CHECK(ts.blocks_written == 2 && ts.blocks_used == 2 && ts.write_jobs == 1);
  {
    const kvoffload_event_t* events = NULL;
    const char* const* media = NULL;
    size_t n_events = 0, n_media = 0;
    OK(kvoffload_scheduler_take_events(s, &events, &n_events));
    OK(kvoffload_scheduler_event_media(s, &media, &n_media));
    CHECK(n_events == 2 && n_media == 2); /* stored in host memory, then on disk */
    CHECK(n_media == 2 && strcmp(media[0], "host") == 0 && strcmp(media[1], "disk") == 0);
  }
  OK(kvoffload_worker_destroy(w));
  OK(kvoffload_scheduler_destroy(s));

  /* Restart: the host cache is empty, the disk has both blocks. */
  make_tiered(&s, &w, dir);
  for (i = 0; i < 4; ++i) fill_page(second[i], 0);
  OK(kvoffload_scheduler_update_request(s, "b", TOKENS, hashes, 4, 0));
  OK(kvoffload_scheduler_lookup(s, "b", 0, &hit));
  CHECK(hit == KVOFFLOAD_RETRY_LATER);
  OK(kvoffload_scheduler_build_step(s, NULL, 0, NULL, 0, &step));
  OK(kvoffload_step_num_tier_jobs(step, &n_tier));
  CHECK(n_tier == 1);
  run_step(s, w, step, &loads, &stores);
  OK(kvoffload_step_destroy(step));
  OK(kvoffload_scheduler_lookup(s, "b", 0, &hit));
  CHECK(hit == TOKENS);
  allocate_and_step(s, w, "b", second, hit, &loads, &stores);
  CHECK(loads == 1);
  for (i = 0; i < 4; ++i) CHECK(page_has(second[i], 60 + i));
  OK(kvoffload_scheduler_get_tier_stats(s, 0, &ts));
  CHECK(ts.promotions == 2 && ts.hits == 2);
  FAILS_WITH(kvoffload_scheduler_get_tier_stats(s, 1, &ts), KVOFFLOAD_INVALID_ARGUMENT,
             "tier 1 is not configured");
  OK(kvoffload_worker_destroy(w));
  OK(kvoffload_scheduler_destroy(s));
  {
    /* A directory the system cannot create (under a regular file: refused even to root) is
       an I/O error, not a bug in kvoffload. */
    char file[96], under[128];
    kvoffload_worker_config_t wc = KVOFFLOAD_WORKER_CONFIG_INIT;
    kvoffload_scheduler_config_t sc = KVOFFLOAD_SCHEDULER_CONFIG_INIT;
    kvoffload_group_config_t group = KVOFFLOAD_GROUP_CONFIG_INIT;
    kvoffload_tier_config_t tier = KVOFFLOAD_TIER_CONFIG_INIT;
    kvoffload_disk_tier_config_t disk = KVOFFLOAD_DISK_TIER_CONFIG_INIT;
    kvoffload_kv_tensor_t tensor;
    kvoffload_group_tensor_t gt;
    kvoffload_group_tensors_t gts;
    FILE* f = NULL;
    snprintf(file, sizeof(file), "%s/a-file", dir);
    snprintf(under, sizeof(under), "%s/tier", file);
    f = fopen(file, "w");
    CHECK(f != NULL);
    fclose(f);
    one_tensor_worker(&wc, &tensor, &gt, &gts);
    group.gpu_block_size = BLOCK_TOKENS;
    sc.groups = &group;
    sc.num_groups = 1;
    sc.block_size_factor = F;
    sc.host_blocks = 8;
    tier.blocks = 16;
    tier.disk = &disk;
    sc.tiers = &tier;
    sc.num_tiers = 1;
    wc.scheduler = &sc;
    wc.threads = 1;
    disk.path = under;
    disk.capacity_bytes = 16 * (4096 + 4096);
    disk.model = "c-api-test";
    w = NULL;
    FAILS_WITH(kvoffload_worker_create(&wc, &w), KVOFFLOAD_IO_ERROR, "cannot create");
    CHECK(w == NULL);
  }
  snprintf(cleanup, sizeof(cleanup), "rm -rf %s", dir);
  CHECK(system(cleanup) == 0);
}

/* Scheduler and worker with one shared tier on the cluster at 127.0.0.1:`port`. */
static void make_shared(kvoffload_scheduler_t* s, kvoffload_worker_t* w,
                        kvoffload_shared_tier_config_t* shared) {
  static kvoffload_kv_tensor_t tensor;
  static kvoffload_group_tensor_t gt;
  static kvoffload_group_tensors_t gts;
  kvoffload_group_config_t group = KVOFFLOAD_GROUP_CONFIG_INIT;
  kvoffload_scheduler_config_t sc = KVOFFLOAD_SCHEDULER_CONFIG_INIT;
  kvoffload_worker_config_t wc = KVOFFLOAD_WORKER_CONFIG_INIT;
  kvoffload_tier_config_t tier = KVOFFLOAD_TIER_CONFIG_INIT;
  group.gpu_block_size = BLOCK_TOKENS;
  sc.groups = &group;
  sc.num_groups = 1;
  sc.block_size_factor = F;
  sc.host_blocks = 8;
  tier.medium = "shared";
  tier.blocks = 64;
  tier.shared = shared;
  sc.tiers = &tier;
  sc.num_tiers = 1;
  one_tensor_worker(&wc, &tensor, &gt, &gts);
  wc.scheduler = &sc;
  wc.threads = 1;
  OK(kvoffload_worker_create(&wc, w));
  OK(kvoffload_scheduler_create(&sc, s));
}

/* Looks up `id` until the shared tier's existence check and any promotion are done (empty
 * steps run the promotions): 500 x 10 ms at most. */
static void lookup_settled(kvoffload_scheduler_t s, kvoffload_worker_t w, const char* id,
                           int64_t* hit) {
  struct timespec pause = {0, 10 * 1000 * 1000};
  kvoffload_step_t step = NULL;
  size_t loads = 0, stores = 0;
  int i;
  OK(kvoffload_scheduler_lookup(s, id, 0, hit));
  for (i = 0; i < 500 && *hit == KVOFFLOAD_RETRY_LATER; ++i) {
    OK(kvoffload_scheduler_build_step(s, NULL, 0, NULL, 0, &step));
    run_step(s, w, step, &loads, &stores);
    OK(kvoffload_step_destroy(step));
    nanosleep(&pause, NULL);
    OK(kvoffload_scheduler_lookup(s, id, 0, hit));
  }
}

/* A shared tier through the C API, against a real cluster (ctest's valkey fixture; the port in
   KVOFFLOAD_VALKEY_PORT): one engine stores a prompt and writes it to the cluster; a second
   engine with an empty host cache finds it there, promotes it and loads the same bytes. */
static void shared_tier_round_trip(const char* port) {
  char nodes[64], name[64];
  kvoffload_shared_tier_config_t shared = KVOFFLOAD_SHARED_TIER_CONFIG_INIT;
  kvoffload_scheduler_t s = NULL;
  kvoffload_worker_t w = NULL;
  kvoffload_block_hash_t hashes[TOKENS / BLOCK_TOKENS];
  kvoffload_block_id_t first[4] = {41, 42, 43, 44}, second[4] = {51, 52, 53, 54};
  kvoffload_step_t step = NULL;
  kvoffload_tier_stats_t ts = KVOFFLOAD_TIER_STATS_INIT;
  size_t loads = 0, stores = 0, n_tier = 0;
  int64_t hit = -7;
  int i;

  snprintf(nodes, sizeof(nodes), "127.0.0.1:%s", port);
  {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now); /* a namespace of this run only */
    snprintf(name, sizeof(name), "c-api-round-trip-%ld-%ld-%ld", (long)getpid(), (long)now.tv_sec,
             (long)now.tv_nsec);
  }
  shared.nodes = nodes;
  shared.name = name;
  make_shared(&s, &w, &shared);
  for (i = 0; i < TOKENS / BLOCK_TOKENS; ++i) hashes[i] = hash_of(90 + i);
  for (i = 0; i < 4; ++i) fill_page(first[i], 80 + i);
  OK(kvoffload_scheduler_update_request(s, "a", TOKENS, hashes, 4, 0));
  lookup_settled(s, w, "a", &hit);
  CHECK(hit == 0); /* a new namespace: nothing there yet */
  allocate_and_step(s, w, "a", first, 0, &loads, &stores);
  CHECK(stores == 1);
  /* The next step writes the stored blocks to the cluster (a shared-tier job from C). */
  OK(kvoffload_scheduler_build_step(s, NULL, 0, NULL, 0, &step));
  OK(kvoffload_step_num_tier_jobs(step, &n_tier));
  CHECK(n_tier == 1);
  run_step(s, w, step, &loads, &stores);
  OK(kvoffload_step_destroy(step));
  OK(kvoffload_scheduler_get_tier_stats(s, 0, &ts));
  CHECK(ts.blocks_written == 2 && ts.write_jobs == 1);
  OK(kvoffload_scheduler_on_finished(s, "a"));
  OK(kvoffload_worker_destroy(w));
  OK(kvoffload_scheduler_destroy(s));

  /* Another engine: an empty host cache, the same cluster and namespace. */
  make_shared(&s, &w, &shared);
  for (i = 0; i < 4; ++i) fill_page(second[i], 0);
  OK(kvoffload_scheduler_update_request(s, "b", TOKENS, hashes, 4, 0));
  lookup_settled(s, w, "b", &hit);
  CHECK(hit == TOKENS);
  allocate_and_step(s, w, "b", second, hit, &loads, &stores);
  CHECK(loads == 1);
  for (i = 0; i < 4; ++i) CHECK(page_has(second[i], 80 + i));
  OK(kvoffload_scheduler_get_tier_stats(s, 0, &ts));
  CHECK(ts.promotions == 2 && ts.hits == 2);
  OK(kvoffload_worker_destroy(w));
  OK(kvoffload_scheduler_destroy(s));
}

static void errors(void) {
  kvoffload_scheduler_t s = NULL;
  kvoffload_worker_t w = NULL;
  kvoffload_scheduler_config_t sc = KVOFFLOAD_SCHEDULER_CONFIG_INIT;
  kvoffload_group_config_t group = KVOFFLOAD_GROUP_CONFIG_INIT;
  kvoffload_worker_config_t wc = KVOFFLOAD_WORKER_CONFIG_INIT;
  kvoffload_kv_tensor_t tensor;
  kvoffload_group_tensor_t gt = {0, PAGE};
  kvoffload_group_tensors_t gts;
  kvoffload_block_hash_t bad = hash_of(0);
  kvoffload_scheduled_request_t req;
  kvoffload_step_t step = NULL;
  kvoffload_job_t job;
  kvoffload_job_report_t report = {12345, 1, 1};
  kvoffload_completed_job_t done[1];
  kvoffload_scheduler_stats_t stats = KVOFFLOAD_SCHEDULER_STATS_INIT;
  kvoffload_block_id_t ids[2] = {1, 2};
  size_t n = 0;
  int64_t hit = 0;
  void* data = NULL;
  int st;

  for (st = 0; st < KVOFFLOAD_NUM_STATUSES; ++st) {
    int other;
    const char* text = kvoffload_status_string((kvoffload_status_t)st);
    CHECK(text != NULL && text[0] != '\0');
    for (other = 0; other < st; ++other) {
      CHECK(strcmp(text, kvoffload_status_string((kvoffload_status_t)other)) != 0);
    }
  }

  /* error.hpp's table, row by row: the C++ exception of each status comes out as that status
     with its message. */
  for (st = KVOFFLOAD_INVALID_ARGUMENT; st < KVOFFLOAD_NUM_STATUSES; ++st) {
    CHECK(kvoffload_internal_raise_for_test(st, "row message") == (kvoffload_status_t)st);
    CHECK(strstr(kvoffload_last_error(), "row message") != NULL);
  }
  CHECK(kvoffload_internal_raise_for_test(KVOFFLOAD_SUCCESS, "") == KVOFFLOAD_SUCCESS);
  CHECK(kvoffload_last_error()[0] == '\0');

  /* Null handles and outputs. */
  FAILS_WITH(kvoffload_scheduler_lookup(NULL, "a", 0, &hit), KVOFFLOAD_INVALID_ARGUMENT,
             "scheduler is NULL");
  FAILS_WITH(kvoffload_scheduler_create(NULL, &s), KVOFFLOAD_INVALID_ARGUMENT, "config is NULL");
  FAILS_WITH(kvoffload_worker_submit(NULL, NULL), KVOFFLOAD_INVALID_ARGUMENT, "worker is NULL");
  FAILS_WITH(kvoffload_step_num_jobs(NULL, KVOFFLOAD_JOB_LOAD, &n), KVOFFLOAD_INVALID_ARGUMENT,
             "step is NULL");
  OK(kvoffload_scheduler_destroy(NULL));
  OK(kvoffload_worker_destroy(NULL));
  OK(kvoffload_step_destroy(NULL));
  CHECK(kvoffload_last_error()[0] == '\0'); /* a successful call clears the message */
  FAILS_WITH(kvoffload_get_version(NULL), KVOFFLOAD_INVALID_ARGUMENT, "version is NULL");

  /* Bad configurations name the field. */
  sc.struct_size = 8;
  FAILS_WITH(kvoffload_scheduler_create(&sc, &s), KVOFFLOAD_INVALID_ARGUMENT, "struct_size");
  CHECK(s == NULL);
  sc.struct_size = sizeof(sc);
  sc.num_groups = 1; /* groups still NULL */
  FAILS_WITH(kvoffload_scheduler_create(&sc, &s), KVOFFLOAD_INVALID_ARGUMENT,
             "config->groups is NULL but its length is 1");
  sc.groups = &group;
  sc.host_blocks = 4;
  sc.policy = "fifo";
  FAILS_WITH(kvoffload_scheduler_create(&sc, &s), KVOFFLOAD_INVALID_ARGUMENT, "fifo");
  sc.policy = "arc";
  group.kind = (kvoffload_group_kind_t)7;
  FAILS_WITH(kvoffload_scheduler_create(&sc, &s), KVOFFLOAD_INVALID_ARGUMENT, "groups[0].kind");
  group.kind = KVOFFLOAD_SLIDING_WINDOW; /* without a window */
  FAILS_WITH(kvoffload_scheduler_create(&sc, &s), KVOFFLOAD_INVALID_ARGUMENT, "sliding_window");
  group.kind = KVOFFLOAD_FULL_ATTENTION;
  OK(kvoffload_scheduler_create(&sc, &s));

  /* Bad calls name the request and leave the scheduler usable. */
  FAILS_WITH(kvoffload_scheduler_lookup(s, "nobody", 0, &hit), KVOFFLOAD_INVALID_ARGUMENT,
             "nobody");
  FAILS_WITH(kvoffload_scheduler_update_request(s, "a", 16, NULL, 3, 0), KVOFFLOAD_INVALID_ARGUMENT,
             "hashes is NULL");
  bad.size = 40;
  FAILS_WITH(kvoffload_scheduler_update_request(s, "a", 16, &bad, 1, 0), KVOFFLOAD_INVALID_ARGUMENT,
             "hash 0 has size 40");
  FAILS_WITH(kvoffload_scheduler_update_request(s, NULL, 16, NULL, 0, 0),
             KVOFFLOAD_INVALID_ARGUMENT, "request_id is NULL");
  bad = hash_of(0);
  OK(kvoffload_scheduler_update_request(s, "a", 16, &bad, 1, 0));
  OK(kvoffload_scheduler_lookup(s, "a", 0, &hit));
  FAILS_WITH(kvoffload_scheduler_lookup(s, "a", -1, &hit), KVOFFLOAD_INVALID_ARGUMENT, "negative");
  memset(&req, 0, sizeof(req));
  req.request_id = "a";
  req.num_scheduled_tokens = 16;
  req.num_groups = 1; /* arrays NULL */
  FAILS_WITH(kvoffload_scheduler_build_step(s, &req, 1, NULL, 0, &step), KVOFFLOAD_INVALID_ARGUMENT,
             "new_block_ids or num_new_block_ids is NULL");
  CHECK(step == NULL);
  FAILS_WITH(kvoffload_scheduler_build_step(s, NULL, 2, NULL, 0, &step), KVOFFLOAD_INVALID_ARGUMENT,
             "requests is NULL but its length is 2");
  OK(kvoffload_scheduler_build_step(s, NULL, 0, NULL, 0, &step));
  FAILS_WITH(kvoffload_step_get_job(step, KVOFFLOAD_JOB_STORE, 3, &job), KVOFFLOAD_INVALID_ARGUMENT,
             "index 3 is out of range");
  FAILS_WITH(kvoffload_step_num_jobs(step, (kvoffload_job_kind_t)9, &n), KVOFFLOAD_INVALID_ARGUMENT,
             "kind is 9");
  OK(kvoffload_step_destroy(step));
  FAILS_WITH(kvoffload_scheduler_on_completed(s, &report, 1, done, 1, &n),
             KVOFFLOAD_INVALID_ARGUMENT, "unknown job 12345");
  CHECK(n == 0);
  FAILS_WITH(kvoffload_scheduler_on_completed(s, &report, 1, done, 0, &n),
             KVOFFLOAD_INVALID_ARGUMENT, "capacity 0 is less than num_reports 1");
  stats.struct_size = 4;
  FAILS_WITH(kvoffload_scheduler_get_stats(s, &stats), KVOFFLOAD_INVALID_ARGUMENT,
             "KVOFFLOAD_SCHEDULER_STATS_INIT");
  OK(kvoffload_scheduler_destroy(s));

  /* Worker: bad layouts, jobs outside it, the CUDA backend without CUDA, a pool too large. */
  one_tensor_worker(&wc, &tensor, &gt, &gts);
  FAILS_WITH(kvoffload_worker_create(&wc, &w), KVOFFLOAD_INVALID_ARGUMENT,
             "config->scheduler is NULL");
  wc.scheduler = &sc;
  sc.host_blocks = 0;
  FAILS_WITH(kvoffload_worker_create(&wc, &w), KVOFFLOAD_INVALID_ARGUMENT, "host_blocks");
  sc.host_blocks = 4;
  tensor.block_stride_bytes = PAGE / 2;
  FAILS_WITH(kvoffload_worker_create(&wc, &w), KVOFFLOAD_INVALID_ARGUMENT, "tensor");
  tensor.block_stride_bytes = PAGE;
  wc.backend = KVOFFLOAD_BACKEND_CUDA;
  st = kvoffload_worker_create(&wc, &w);
  if (st == KVOFFLOAD_SUCCESS) { /* a GPU machine: the backend exists */
    OK(kvoffload_worker_destroy(w));
  } else {
    /* No CUDA build or no device: not available here, which is not a CUDA call failing. */
    CHECK(st == KVOFFLOAD_UNSUPPORTED);
    CHECK(strstr(kvoffload_last_error(), "CUDA") != NULL);
  }
  wc.backend = KVOFFLOAD_BACKEND_HOST;
  tensor.page_bytes = 1 << 20;
  tensor.block_stride_bytes = 1 << 20;
  gt.page_bytes = 1 << 20;
  sc.host_blocks = 2147483646; /* 2 PiB: more than the address space */
  FAILS_WITH(kvoffload_worker_create(&wc, &w), KVOFFLOAD_OUT_OF_MEMORY, "cannot map");
  tensor.page_bytes = PAGE;
  tensor.block_stride_bytes = PAGE;
  gt.page_bytes = PAGE;
  sc.host_blocks = 4;
  OK(kvoffload_worker_create(&wc, &w));
  memset(&job, 0, sizeof(job));
  job.id = 5;
  job.kind = KVOFFLOAD_JOB_STORE;
  job.num_gpu_block_ids = 2; /* gpu_block_ids NULL */
  FAILS_WITH(kvoffload_worker_submit(w, &job), KVOFFLOAD_INVALID_ARGUMENT,
             "job 5 gpu_block_ids is NULL");
  job.gpu_block_ids = ids;
  FAILS_WITH(kvoffload_worker_submit(w, &job), KVOFFLOAD_INVALID_ARGUMENT, "job 5");
  FAILS_WITH(kvoffload_worker_host_block(w, 4, &data, &n), KVOFFLOAD_INVALID_ARGUMENT,
             "host block 4 is out of range");
  OK(kvoffload_worker_host_block(w, 3, &data, &n));
  CHECK(data != NULL && n >= PAGE);
  FAILS_WITH(kvoffload_worker_set_compute_stream(w, 1, 0), KVOFFLOAD_INVALID_ARGUMENT,
             "needs the CUDA backend");
  FAILS_WITH(kvoffload_worker_set_compute_stream(NULL, 1, 0), KVOFFLOAD_INVALID_ARGUMENT,
             "worker is NULL");
  OK(kvoffload_worker_destroy(w));

  /* The compute stream: only for the CUDA backend, never cudaStreamPerThread (0x2). */
  wc.has_compute_stream = 1;
  wc.compute_stream = 0;
  FAILS_WITH(kvoffload_worker_create(&wc, &w), KVOFFLOAD_INVALID_ARGUMENT,
             "compute_stream is set but the backend is the host backend");
  wc.compute_stream = 2;
  FAILS_WITH(kvoffload_worker_create(&wc, &w), KVOFFLOAD_INVALID_ARGUMENT, "cudaStreamPerThread");
  /* A struct from before the compute-stream fields: accepted, they take their defaults. */
  wc.struct_size = offsetof(kvoffload_worker_config_t, has_compute_stream);
  OK(kvoffload_worker_create(&wc, &w));
  OK(kvoffload_worker_destroy(w));
  wc.struct_size = offsetof(kvoffload_worker_config_t, has_compute_stream) - 1;
  FAILS_WITH(kvoffload_worker_create(&wc, &w), KVOFFLOAD_INVALID_ARGUMENT, "struct_size");
  wc.struct_size = sizeof(wc);
  wc.has_compute_stream = 0;
}

/* A shared tier whose cluster does not answer (nothing listens on port 1): the lookup says
 * retry later while its existence check runs, then answers a miss; bad configs are named. */
static void shared_tier_unreachable(void) {
  kvoffload_group_config_t group = KVOFFLOAD_GROUP_CONFIG_INIT;
  kvoffload_scheduler_config_t sc = KVOFFLOAD_SCHEDULER_CONFIG_INIT;
  kvoffload_worker_config_t wc = KVOFFLOAD_WORKER_CONFIG_INIT;
  kvoffload_shared_tier_config_t shared = KVOFFLOAD_SHARED_TIER_CONFIG_INIT;
  kvoffload_tier_config_t tier = KVOFFLOAD_TIER_CONFIG_INIT;
  kvoffload_kv_tensor_t tensor;
  kvoffload_group_tensor_t gt;
  kvoffload_group_tensors_t gts;
  kvoffload_scheduler_t s = NULL;
  kvoffload_worker_t w = NULL;
  kvoffload_block_hash_t hashes[TOKENS / BLOCK_TOKENS];
  kvoffload_tier_stats_t ts = KVOFFLOAD_TIER_STATS_INIT;
  struct timespec pause = {0, 10 * 1000 * 1000};
  int64_t hit = -7;
  int i;

  shared.nodes = "127.0.0.1:1";
  shared.name = "c-api-test";
  group.gpu_block_size = BLOCK_TOKENS;
  sc.groups = &group;
  sc.num_groups = 1;
  sc.block_size_factor = F;
  sc.host_blocks = 8;
  tier.medium = "shared";
  tier.blocks = 64;
  sc.tiers = &tier;
  sc.num_tiers = 1;
  one_tensor_worker(&wc, &tensor, &gt, &gts);
  wc.scheduler = &sc;
  wc.threads = 1;
  /* A shared tier needs its cluster, for the scheduler's checks and the worker's store. */
  FAILS_WITH(kvoffload_scheduler_create(&sc, &s), KVOFFLOAD_INVALID_ARGUMENT,
             "tiers[0].store: a shared tier's presence checks need its cluster");
  FAILS_WITH(kvoffload_worker_create(&wc, &w), KVOFFLOAD_INVALID_ARGUMENT,
             "config->scheduler->tiers[0].shared is NULL");
  tier.shared = &shared;
  shared.name = NULL;
  FAILS_WITH(kvoffload_scheduler_create(&sc, &s), KVOFFLOAD_INVALID_ARGUMENT,
             "config->tiers[0].shared.name");
  FAILS_WITH(kvoffload_worker_create(&wc, &w), KVOFFLOAD_INVALID_ARGUMENT,
             "config->scheduler->tiers[0].shared.name");
  shared.name = "c-api-test";
  /* A store of the other medium is named. */
  tier.medium = "disk";
  FAILS_WITH(kvoffload_scheduler_create(&sc, &s), KVOFFLOAD_INVALID_ARGUMENT,
             "config->tiers[0].shared is set but the medium is disk");
  tier.medium = "shared";
  OK(kvoffload_worker_create(&wc, &w));
  OK(kvoffload_scheduler_create(&sc, &s));

  for (i = 0; i < TOKENS / BLOCK_TOKENS; ++i) hashes[i] = hash_of(70 + i);
  OK(kvoffload_scheduler_update_request(s, "a", TOKENS, hashes, 4, 0));
  OK(kvoffload_scheduler_lookup(s, "a", 0, &hit));
  CHECK(hit == KVOFFLOAD_RETRY_LATER);
  /* Bounded: the check fails within the connect timeout; 500 x 10 ms at most. */
  for (i = 0; i < 500 && hit == KVOFFLOAD_RETRY_LATER; ++i) {
    nanosleep(&pause, NULL);
    OK(kvoffload_scheduler_lookup(s, "a", 0, &hit));
  }
  CHECK(hit == 0);
  OK(kvoffload_scheduler_get_tier_stats(s, 0, &ts));
  CHECK(ts.presence_checks == 1);
  CHECK(ts.presence_misses == 2 && ts.presence_hits == 0);
  OK(kvoffload_scheduler_destroy(s));
  OK(kvoffload_worker_destroy(w));

  shared.nodes = "no-port";
  FAILS_WITH(kvoffload_worker_create(&wc, &w), KVOFFLOAD_INVALID_ARGUMENT, "nodes");
}

int main(int argc, char** argv) {
  if (argc == 2 && strcmp(argv[1], "--shared") == 0) {
    const char* port = getenv("KVOFFLOAD_VALKEY_PORT");
    if (port == NULL) {
      fprintf(stderr, "--shared needs KVOFFLOAD_VALKEY_PORT (a cluster on 127.0.0.1)\n");
      return 1;
    }
    shared_tier_round_trip(port);
    if (failures != 0) {
      fprintf(stderr, "%d check(s) failed\n", failures);
      return 1;
    }
    printf("C API: shared tier round trip OK\n");
    return 0;
  }
  lifecycle();
  disk_tier();
  shared_tier_unreachable();
  errors();
  if (failures != 0) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("C API: lifecycle and error statuses OK\n");
  return 0;
}
