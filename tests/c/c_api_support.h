/* Shared by the C API tests (c_api_test.c, c_api_tier_test.c), C99: the checks, a "GPU" of
 * host memory, and a scheduler and worker over it. */
#ifndef KVOFFLOAD_TESTS_C_API_SUPPORT_H
#define KVOFFLOAD_TESTS_C_API_SUPPORT_H

#include <stdio.h>
#include <string.h>

#include "kvoffload/kvoffload.h"

extern int failures;

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

extern unsigned char gpu[GPU_BLOCKS * PAGE];

kvoffload_block_hash_t hash_of(int i);
void fill_page(int block, int label);
int page_has(int block, int label);
void one_tensor_worker(kvoffload_worker_config_t* wc, kvoffload_kv_tensor_t* tensor,
                       kvoffload_group_tensor_t* gt, kvoffload_group_tensors_t* gts);
/* The weights make_tiered's scheduler gives (SchedulerConfig::weights); NULL: none. */
extern const char* tiered_weights;
void make_tiered(kvoffload_scheduler_t* s, kvoffload_worker_t* w, const char* disk_dir);
void make(kvoffload_scheduler_t* s, kvoffload_worker_t* w);
void run_step(kvoffload_scheduler_t s, kvoffload_worker_t w, kvoffload_step_t step, size_t* loads,
              size_t* stores);
void allocate_and_step(kvoffload_scheduler_t s, kvoffload_worker_t w, const char* id,
                       kvoffload_block_id_t* blocks, int64_t hit, size_t* loads, size_t* stores);

/* c_api_tier_test.c */
void disk_tier(void);
void shared_tier_round_trip(const char* port);
void shared_tier_unreachable(void);

#endif
