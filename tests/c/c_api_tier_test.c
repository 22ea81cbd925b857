/* The C API's tiers from C99: a disk tier's round trip and restart, the shared tier on a real
 * cluster (--shared) and on an unreachable one. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stddef.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "c_api_support.h"

/* A disk tier through the C API: a store is written through; after a "restart" (new worker
 * and scheduler on the same directory) the scan finds it, a lookup promotes it and the load
 * brings the same bytes into other GPU blocks. */
void disk_tier(void) {
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
  CHECK(ts.promotions_overdue == 0);
  {
    /* A caller built before promotions_overdue: filled up to its struct's end, no further. */
    kvoffload_tier_stats_t old = KVOFFLOAD_TIER_STATS_INIT;
    old.struct_size = offsetof(kvoffload_tier_stats_t, promotions_overdue);
    old.promotions_overdue = 77;
    OK(kvoffload_scheduler_get_tier_stats(s, 0, &old));
    CHECK(old.blocks_written == 2 && old.promotions_overdue == 77);
    old.struct_size = offsetof(kvoffload_tier_stats_t, presence_errors);
    FAILS_WITH(kvoffload_scheduler_get_tier_stats(s, 0, &old), KVOFFLOAD_INVALID_ARGUMENT,
               "struct_size");
  }
  {
    /* The same numbers as Prometheus text, for an engine's /metrics. */
    const char* text = NULL;
    size_t length = 0;
    OK(kvoffload_scheduler_metrics_text(s, &text, &length));
    CHECK(text != NULL && strlen(text) == length);
    CHECK(strstr(text,
                 "# TYPE kvoffload_blocks_stored_total counter\n"
                 "kvoffload_blocks_stored_total 2\n") != NULL);
    CHECK(strstr(text, "kvoffload_tier_blocks_written_total{tier=\"0\",medium=\"disk\"} 2\n") !=
          NULL);
    CHECK(strstr(text, "# TYPE kvoffload_blocks_used gauge\n") != NULL);
    OK(kvoffload_worker_metrics_text(w, &text, &length));
    CHECK(strstr(text, "kvoffload_worker_store_jobs_total 1\n") != NULL);
    CHECK(strstr(text, "kvoffload_worker_tier_writes_total{tier=\"0\",medium=\"disk\"} 2\n") !=
          NULL);
    FAILS_WITH(kvoffload_scheduler_metrics_text(s, NULL, &length), KVOFFLOAD_INVALID_ARGUMENT,
               "text");
  }
  {
    const kvoffload_event_t* events = NULL;
    const char* const* media = NULL;
    size_t n_events = 0, n_media = 0;
    OK(kvoffload_scheduler_take_events(s, &events, &n_events));
    OK(kvoffload_scheduler_event_media(s, &media, &n_media));
    CHECK(n_events == 2 && n_media == 2); /* stored in host memory, then on disk */
    CHECK(n_media == 2 && strcmp(media[0], "host") == 0 && strcmp(media[1], "disk") == 0);
  }
  {
    /* Hand-made tier jobs the scheduler never builds are refused before any I/O: two blocks
       promoted into one host block, or one slot written twice (the I/Os would race). */
    kvoffload_key_t keys[2];
    int32_t hosts[2] = {0, 0};
    int64_t slots[2] = {0, 1};
    kvoffload_tier_job_t job;
    memset(&job, 0, sizeof job);
    keys[0].hash = hash_of(90);
    keys[0].group = 0;
    keys[1].hash = hash_of(91);
    keys[1].group = 0;
    job.id = 9001;
    job.kind = KVOFFLOAD_JOB_TIER_PROMOTE;
    job.request_id = "";
    job.keys = keys;
    job.host_block_ids = hosts;
    job.slots = slots;
    job.num_blocks = 2;
    FAILS_WITH(kvoffload_worker_submit_tier(w, &job), KVOFFLOAD_INVALID_ARGUMENT,
               "both promoted into host block 0");
    job.kind = KVOFFLOAD_JOB_TIER_WRITE;
    hosts[1] = 1;
    slots[1] = 0;
    FAILS_WITH(kvoffload_worker_submit_tier(w, &job), KVOFFLOAD_INVALID_ARGUMENT,
               "both written to slot 0");
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
  /* New weights: from this call on nothing stored under the old ones is found. */
  FAILS_WITH(kvoffload_scheduler_reset_weights(s, NULL), KVOFFLOAD_INVALID_ARGUMENT, "weights");
  FAILS_WITH(kvoffload_scheduler_reset_weights(s, ""), KVOFFLOAD_INVALID_ARGUMENT,
             "weights is empty");
  /* Without an identity the tiers' blocks would outlive the reset: refused with tiers. */
  FAILS_WITH(kvoffload_scheduler_reset_cache(s), KVOFFLOAD_INVALID_ARGUMENT,
             "kvoffload_scheduler_reset_weights");
  OK(kvoffload_scheduler_reset_weights(s, "c-api-test weights 2"));
  OK(kvoffload_scheduler_update_request(s, "c", TOKENS, hashes, 4, 0));
  OK(kvoffload_scheduler_lookup(s, "c", 0, &hit));
  CHECK(hit == 0);
  OK(kvoffload_worker_destroy(w));
  OK(kvoffload_scheduler_destroy(s));
  /* A restart under the new weights (nothing was cleared) restores none of the old slots. */
  tiered_weights = "c-api-test weights 2";
  make_tiered(&s, &w, dir);
  OK(kvoffload_scheduler_update_request(s, "d", TOKENS, hashes, 4, 0));
  OK(kvoffload_scheduler_lookup(s, "d", 0, &hit));
  CHECK(hit == 0);
  OK(kvoffload_worker_destroy(w));
  OK(kvoffload_scheduler_destroy(s));
  tiered_weights = NULL;
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
void shared_tier_round_trip(const char* port) {
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

/* A shared tier whose cluster does not answer (nothing listens on port 1): the lookup says
 * retry later while its existence check runs, then answers a miss; bad configs are named. */
void shared_tier_unreachable(void) {
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
  shared.insecure = 1; /* no fleet secret in this test's environment: the public one */
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
             "config->tiers[0].shared is NULL: a shared tier needs its cluster");
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
