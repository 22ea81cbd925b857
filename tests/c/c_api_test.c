/* The C API from C99: one full lifecycle (store a prompt, load it back into other blocks and
 * compare the bytes) and every status a caller can provoke without a GPU. Exits non-zero with
 * the failing line on the first failed check. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "c_api_support.h"

/* Exported by the library for this test, not declared in kvoffload.h: raises the C++ exception
   of a status's row of error.hpp's table inside the library. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_internal_raise_for_test(int status,
                                                                     const char* message);

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
  CHECK(kvoffload_scheduler_limit_stores(s, "a", -1) == KVOFFLOAD_INVALID_ARGUMENT);
  CHECK(kvoffload_scheduler_limit_stores(s, "nobody", 0) == KVOFFLOAD_INVALID_ARGUMENT);
  OK(kvoffload_scheduler_limit_stores(s, "a", 1 << 20));
  CHECK(kvoffload_scheduler_limit_loads(s, "nobody", 0) == KVOFFLOAD_INVALID_ARGUMENT);
  OK(kvoffload_scheduler_limit_loads(s, "a", -1));
  CHECK(kvoffload_scheduler_hint_continues(s, "nobody", 1) == KVOFFLOAD_INVALID_ARGUMENT);
  CHECK(kvoffload_scheduler_hint_continues(s, "a", 2) == KVOFFLOAD_INVALID_ARGUMENT);
  OK(kvoffload_scheduler_hint_continues(s, "a", 1));
  CHECK(kvoffload_scheduler_set_time(s, -1.0) == KVOFFLOAD_INVALID_ARGUMENT);
  OK(kvoffload_scheduler_set_time(s, 12.5));
  CHECK(kvoffload_scheduler_limit_state_stores(s, "a", -1) == KVOFFLOAD_INVALID_ARGUMENT);
  CHECK(kvoffload_scheduler_limit_state_stores(s, "nobody", 0) == KVOFFLOAD_INVALID_ARGUMENT);
  OK(kvoffload_scheduler_limit_state_stores(s, "a", 64));
  OK(kvoffload_scheduler_on_finished(s, "a"));
  OK(kvoffload_scheduler_take_events(s, &events, &n_events));
  CHECK(n_events == 1 && events[0].removed == 0 && events[0].num_keys == 2);
  CHECK(events[0].keys[0].hash.size == 16 && events[0].keys[0].hash.bytes[0] == 2);

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
  /* A caller built against 0.5.0 (its struct ended before pressure_skips) gets its fields and
   * nothing is written past them. */
  stats.struct_size = offsetof(kvoffload_scheduler_stats_t, pressure_skips);
  stats.pressure_skips = 777;
  stats.blocks_total = -1;
  OK(kvoffload_scheduler_get_stats(s, &stats));
  CHECK(stats.blocks_total > 0 && stats.pressure_skips == 777);
  CHECK(stats.struct_size == offsetof(kvoffload_scheduler_stats_t, pressure_skips));
  stats.struct_size = sizeof(stats);
  OK(kvoffload_scheduler_set_store_pressure(s, 1));
  FAILS_WITH(kvoffload_scheduler_set_store_pressure(NULL, 1), KVOFFLOAD_INVALID_ARGUMENT,
             "scheduler");
  OK(kvoffload_scheduler_set_store_pressure(s, 0));
  {
    const kvoffload_block_id_t copied[2] = {5, 6};
    OK(kvoffload_scheduler_handed_out(s, copied, 2));
    OK(kvoffload_scheduler_handed_out(s, NULL, 0));
    FAILS_WITH(kvoffload_scheduler_handed_out(s, NULL, 2), KVOFFLOAD_INVALID_ARGUMENT, "block_ids");
    FAILS_WITH(kvoffload_scheduler_handed_out(NULL, copied, 2), KVOFFLOAD_INVALID_ARGUMENT,
               "scheduler");
    OK(kvoffload_scheduler_get_stats(s, &stats));
    CHECK(stats.reused_sub_blocks == 0 && stats.unsafe_skips == 0);
  }
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
  FAILS_WITH(kvoffload_worker_create(&wc, &w), KVOFFLOAD_INVALID_ARGUMENT,
             "too large for policy arc"); /* ARC numbers two ghosts a block: at most 2^30 */
  sc.policy = "lru";
  FAILS_WITH(kvoffload_worker_create(&wc, &w), KVOFFLOAD_OUT_OF_MEMORY, "cannot map");
  sc.policy = "arc";
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
  wc.has_compute_stream = 0;
  /* 0.3 moved the worker config's fields: a struct of another header's size is refused, never
   * read at the wrong offsets (0.2's was 128 bytes on LP64, with block_size_factor where the
   * scheduler pointer is now). */
  wc.struct_size = sizeof(wc) + 40;
  FAILS_WITH(kvoffload_worker_create(&wc, &w), KVOFFLOAD_INVALID_ARGUMENT,
             "rebuild against its header");
  CHECK(w == NULL);
  wc.struct_size = offsetof(kvoffload_worker_config_t, has_compute_stream);
  FAILS_WITH(kvoffload_worker_create(&wc, &w), KVOFFLOAD_INVALID_ARGUMENT, "struct_size");
  wc.struct_size = sizeof(wc);
  OK(kvoffload_worker_create(&wc, &w));
  OK(kvoffload_worker_destroy(w));
  /* 0.5.0's struct ended at tp_rank: still accepted (no bound on store bytes). */
  wc.struct_size = offsetof(kvoffload_worker_config_t, max_store_bytes_in_flight);
  OK(kvoffload_worker_create(&wc, &w));
  {
    int on = 1;
    OK(kvoffload_worker_store_pressure(w, &on));
    CHECK(on == 0);
    FAILS_WITH(kvoffload_worker_store_pressure(w, NULL), KVOFFLOAD_INVALID_ARGUMENT, "on");
  }
  OK(kvoffload_worker_destroy(w));
  wc.struct_size = sizeof(wc);
  {
    /* An array of tiers is read with this header's stride: elements of an older, shorter size
     * are refused (one alone is read field by field). */
    kvoffload_tier_config_t two[2] = {KVOFFLOAD_TIER_CONFIG_INIT, KVOFFLOAD_TIER_CONFIG_INIT};
    kvoffload_scheduler_t s2 = NULL;
    two[0].blocks = 8;
    two[1].blocks = 8;
    two[0].struct_size = offsetof(kvoffload_tier_config_t, shared);
    sc.tiers = two;
    sc.num_tiers = 2;
    FAILS_WITH(kvoffload_scheduler_create(&sc, &s2), KVOFFLOAD_INVALID_ARGUMENT,
               "config->tiers[0].struct_size is");
    sc.num_tiers = 1;               /* one older element: its fields up to struct_size are read */
    two[0].promote_timeout_ms = -1; /* past its end: not read (the default) */
    OK(kvoffload_scheduler_create(&sc, &s2));
    OK(kvoffload_scheduler_destroy(s2));
    two[0].struct_size = sizeof(two[0]);
    FAILS_WITH(kvoffload_scheduler_create(&sc, &s2), KVOFFLOAD_INVALID_ARGUMENT,
               "tiers[0].promote_timeout_ms must be 0 (5000) to 3600000");
    two[0].promote_timeout_ms = 0;
    sc.num_tiers = 2;
    OK(kvoffload_scheduler_create(&sc, &s2));
    OK(kvoffload_scheduler_destroy(s2));
    sc.tiers = NULL;
    sc.num_tiers = 0;
  }
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
