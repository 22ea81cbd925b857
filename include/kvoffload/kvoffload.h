/*
 * kvoffload C API: a stable interface for serving engines written in C or other languages.
 *
 * Conventions (in the style of NCCL's header):
 *  - Objects are opaque handles created by kvoffload_*_create and freed by *_destroy.
 *  - Every function returns a kvoffload_status_t and never lets an exception or a crash
 *    escape for bad input: null handles, null arrays with a non-zero length, ids out of range
 *    and contract violations all return a status. kvoffload_last_error() then gives this
 *    thread's message, which names the request, job, group or field.
 *  - Configuration structs start with `struct_size`, set by their *_INIT macro: a library
 *    built with a newer header accepts older structs (fields past struct_size take their
 *    defaults), except where a struct says otherwise (the worker config, since 0.3), so set
 *    fields by name after initializing with the macro.
 *  - Arrays returned by the library stay valid until the documented call that replaces them
 *    (usually the next call of the same function, or the handle's destruction).
 *  - Threads: a scheduler handle is used by one thread at a time; a worker handle may be used
 *    from several threads (calls are serialized inside).
 *
 * The header compiles as C99 and as C++.
 */
#ifndef KVOFFLOAD_KVOFFLOAD_H
#define KVOFFLOAD_KVOFFLOAD_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define KVOFFLOAD_C_API
#else
#define KVOFFLOAD_C_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* KVOFFLOAD_VERSION_MAJOR, _MINOR, _PATCH and _STRING, generated from CMakeLists.txt. */
#include "kvoffload/version.h"
/* major * 10000 + minor * 100 + patch */
#define KVOFFLOAD_VERSION_CODE \
  (KVOFFLOAD_VERSION_MAJOR * 10000 + KVOFFLOAD_VERSION_MINOR * 100 + KVOFFLOAD_VERSION_PATCH)

typedef enum kvoffload_status {
  KVOFFLOAD_SUCCESS = 0,
  KVOFFLOAD_INVALID_ARGUMENT = 1, /* bad input; the object is unchanged */
  KVOFFLOAD_OUT_OF_MEMORY = 2,    /* host or device memory could not be allocated */
  KVOFFLOAD_CUDA_ERROR = 3,       /* a CUDA call failed */
  KVOFFLOAD_UNSUPPORTED = 4,      /* not available in this build (e.g. CUDA without a GPU) */
  KVOFFLOAD_INTERNAL_ERROR = 5,   /* a bug in kvoffload: please report the message */
  KVOFFLOAD_IO_ERROR = 6,         /* the system refused a file or directory (a disk tier's) */
  /* Statuses may be added: a library newer than this header can return one at or past
     KVOFFLOAD_NUM_STATUSES (treat it as an error; kvoffload_status_string names it). */
  KVOFFLOAD_NUM_STATUSES = 7
} kvoffload_status_t;

/* A constant description of a status ("invalid argument", ...); never null. */
KVOFFLOAD_C_API const char* kvoffload_status_string(kvoffload_status_t status);
/* The message of the last failed call on this thread ("" if none). Valid until this thread's
 * next kvoffload call. */
KVOFFLOAD_C_API const char* kvoffload_last_error(void);
/* The library's KVOFFLOAD_VERSION_CODE (it may be newer than the header's). */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_get_version(int* version);

/* ---- common types ------------------------------------------------------------------------ */

typedef int32_t kvoffload_block_id_t; /* GPU block id; 0 is the null block */
typedef int64_t kvoffload_job_id_t;

#define KVOFFLOAD_HASH_MAX_BYTES 32
/* An engine block hash: 1 to 32 bytes. */
typedef struct kvoffload_block_hash {
  uint8_t bytes[KVOFFLOAD_HASH_MAX_BYTES];
  uint32_t size;
} kvoffload_block_hash_t;

/* A host-cache key: a block hash tagged with its KV-cache group. */
typedef struct kvoffload_key {
  kvoffload_block_hash_t hash;
  uint32_t group;
} kvoffload_key_t;

typedef enum kvoffload_group_kind {
  KVOFFLOAD_FULL_ATTENTION = 0,
  KVOFFLOAD_SLIDING_WINDOW = 1,
  KVOFFLOAD_MAMBA = 2
} kvoffload_group_kind_t;

/* Every job the scheduler emits, in one vocabulary: transfers (kvoffload_job_t) load or store,
 * tier jobs (kvoffload_tier_job_t, kvoffload_worker_submit_tier) promote or write. (Before
 * 0.2 a tier job's kind was a kvoffload_tier_job_kind_t, 0 promote, 1 write.) */
typedef enum kvoffload_job_kind {
  KVOFFLOAD_JOB_LOAD = 0,
  KVOFFLOAD_JOB_STORE = 1,
  KVOFFLOAD_JOB_TIER_PROMOTE = 2, /* slots into host blocks */
  KVOFFLOAD_JOB_TIER_WRITE = 3    /* host blocks into slots */
} kvoffload_job_kind_t;

/* ---- scheduler --------------------------------------------------------------------------- */

typedef struct kvoffload_scheduler_s* kvoffload_scheduler_t;

typedef struct kvoffload_group_config {
  kvoffload_group_kind_t kind;
  int64_t gpu_block_size; /* tokens per GPU block */
  int64_t sliding_window; /* tokens; sliding-window groups only */
} kvoffload_group_config_t;
#define KVOFFLOAD_GROUP_CONFIG_INIT \
  { KVOFFLOAD_FULL_ATTENTION, 16, 0 }

/* A shared tier on a Valkey (or Redis 7) cluster (docs/semantics.md section 11.1), as a worker
 * runs it and as the scheduler checks it (kvoffload::SharedTierConfig). */
typedef struct kvoffload_shared_tier_config {
  size_t struct_size;
  const char* nodes; /* seed nodes, "host:port[,host:port...]" */
  const char* name;  /* the namespace, with tp_size and the block size factor: model,
                        revision, dtype, block size (engines that share blocks give the same) */
  int tp_rank;
  int tp_size;
  int connect_timeout_ms;
  int reply_timeout_ms; /* for every reply */
  int in_flight;        /* blocks per pipelined batch */
  /* The fleet secret (keys' names, values' MACs): a file holding it, else the environment
   * variable secret_env names (NULL: KVOFFLOAD_SHARED_SECRET). Without one the tier refuses
   * to start unless insecure is 1 (a public secret: no protection against other writers). */
  const char* secret_file;
  const char* secret_env;
  int insecure;
  /* AUTH: password from password_file, else the environment variable password_env names
   * (NULL: KVOFFLOAD_SHARED_PASSWORD); neither set: no AUTH. username NULL: "default". */
  const char* username;
  const char* password_file;
  const char* password_env;
  /* tls 1: TLS to every node, verified against tls_ca_file (NULL: the system's CAs) and
   * tls_server_name (NULL: the host connected to); tls_cert_file/tls_key_file: a client
   * certificate, if the servers ask for one. */
  int tls;
  const char* tls_ca_file;
  const char* tls_cert_file;
  const char* tls_key_file;
  const char* tls_server_name;
  int ttl_seconds; /* values expire after this many seconds (0: never) */
  int only_seeds;  /* 1: connect to the listed nodes only (redirects elsewhere fail) */
} kvoffload_shared_tier_config_t;
/* kvoffload::SharedTierConfig's defaults (tests/scheduler/config_defaults_test.cpp checks them). */
#define KVOFFLOAD_SHARED_TIER_CONFIG_INIT                                     \
  {                                                                           \
    sizeof(kvoffload_shared_tier_config_t), /* struct_size */                 \
        NULL,                               /* nodes: the caller sets them */ \
        NULL,                               /* name: the caller sets it */    \
        0,                                  /* tp_rank */                     \
        1,                                  /* tp_size */                     \
        200,                                /* connect_timeout_ms */          \
        1000,                               /* reply_timeout_ms */            \
        8,                                  /* in_flight */                   \
        NULL,                               /* secret_file: none */           \
        NULL,                               /* secret_env: the default */     \
        0,                                  /* insecure: no */                \
        NULL,                               /* username: "default" */         \
        NULL,                               /* password_file: none */         \
        NULL,                               /* password_env: the default */   \
        0,                                  /* tls: no */                     \
        NULL,                               /* tls_ca_file: the system's */   \
        NULL,                               /* tls_cert_file: none */         \
        NULL,                               /* tls_key_file: none */          \
        NULL,                               /* tls_server_name: the host */   \
        0,                                  /* ttl_seconds: none */           \
        0                                   /* only_seeds: no */              \
  }

/* A disk tier's store, as a worker runs it: its own rows, in files of its own rank
 * (kvoffload::DiskTierConfig). */
typedef struct kvoffload_disk_tier_config {
  size_t struct_size;
  const char* path;        /* root directory */
  uint64_t capacity_bytes; /* bound on this worker's files */
  const char* model;       /* with dtype and the rank, names the layout's directory */
  const char* dtype;
  int tp_rank;
  int tp_size;
  const char* io; /* "auto" (io_uring, else threads), "io_uring" or "threads"; NULL: "auto" */
  int io_depth;   /* io_uring: operations in flight */
  int io_threads; /* threads: pread/pwrite threads */
  int direct_io;  /* 1: O_DIRECT where the file system allows it */
} kvoffload_disk_tier_config_t;
/* kvoffload::DiskTierConfig's defaults (tests/scheduler/config_defaults_test.cpp checks them). */
#define KVOFFLOAD_DISK_TIER_CONFIG_INIT                                            \
  {                                                                                \
    sizeof(kvoffload_disk_tier_config_t), /* struct_size */                        \
        NULL,                             /* path: the caller sets it */           \
        0,                                /* capacity_bytes: the caller sets it */ \
        "",                               /* model */                              \
        "",                               /* dtype */                              \
        0,                                /* tp_rank */                            \
        1,                                /* tp_size */                            \
        NULL,                             /* io: "auto" */                         \
        32,                               /* io_depth */                           \
        4,                                /* io_threads */                         \
        1                                 /* direct_io */                          \
  }

/* A tier below the host cache (docs/semantics.md section 11), described once for both sides:
 * the scheduler keeps its index (medium to write_back_free_blocks), the workers run its store
 * (disk or shared). One array of these serves the scheduler (kvoffload_scheduler_config_t's
 * tiers) and, through it, every worker (kvoffload_worker_config_t's scheduler). */
typedef struct kvoffload_tier_config {
  size_t struct_size;
  const char* medium;             /* "disk" or "shared"; NULL: "disk" */
  int64_t blocks;                 /* capacity in slots (kvoffload_worker_tier_scan's num_slots) */
  const char* policy;             /* "lru", "arc" or "reuse"; NULL: "lru" */
  int64_t store_threshold;        /* 0 or N >= 2 lookups before a key is written to the tier */
  int64_t write_queue_blocks;     /* blocks queued for tier writes at most (0: 1024) */
  int write_back;                 /* 1: write blocks when evicted instead of after each store */
  int64_t write_back_free_blocks; /* write-back keeps this many host blocks free (0: 1/16) */
  /* medium "shared": its cluster, which the workers read and write and whose existence checks
   * the scheduler asks (blocks then bound the keys it remembers as present). NULL otherwise. */
  const kvoffload_shared_tier_config_t* shared;
  /* medium "disk": its files, for the workers (a scheduler alone may leave it NULL). NULL
   * otherwise. */
  const kvoffload_disk_tier_config_t* disk;
  /* How long lookups wait for a promotion from this tier, in ms (0: 5000; at most 3600000).
   * Past it the promotion's keys are misses (promotions_overdue) and its host blocks stay out
   * of use until the workers report the job. Read only when struct_size covers it. */
  int64_t promote_timeout_ms;
} kvoffload_tier_config_t;
/* kvoffload::TierConfig's defaults (tests/scheduler/config_defaults_test.cpp checks them). */
#define KVOFFLOAD_TIER_CONFIG_INIT                                      \
  {                                                                     \
    sizeof(kvoffload_tier_config_t), /* struct_size */                  \
        "disk",                      /* medium */                       \
        0,                           /* blocks: the caller sets it */   \
        NULL,                        /* policy: "lru" */                \
        0,                           /* store_threshold: off */         \
        0,                           /* write_queue_blocks: 1024 */     \
        0,                           /* write_back: off */              \
        0,                           /* write_back_free_blocks: 1/16 */ \
        NULL,                        /* shared: none */                 \
        NULL,                        /* disk: none */                   \
        0                            /* promote_timeout_ms: 5000 */     \
  }

typedef struct kvoffload_scheduler_config {
  size_t struct_size;
  const kvoffload_group_config_t* groups;
  size_t num_groups;
  int64_t block_size_factor; /* GPU blocks per host block */
  int64_t hash_block_size;   /* tokens per engine block hash */
  int64_t num_workers;       /* worker reports that complete a job */
  int prefix_caching;        /* 1: defer lookups of keys being loaded */
  int64_t gpu_blocks;        /* the engine's GPU block count if known, else 0 */
  int64_t host_blocks;       /* host cache capacity in host blocks */
  const char* policy;        /* "lru", "arc" or "reuse"; NULL: "lru" */
  int64_t store_threshold;   /* 0 or N >= 2 lookups before a key is stored */
  int64_t block_bytes;       /* bytes of a host block, for statistics (0: unknown) */
  int enable_events;         /* 1: record stored/removed events */
  /* Read only when struct_size covers it: structs compiled before it existed get 0. */
  int64_t threshold_tracker_keys;       /* keys the store-threshold tracker remembers (0: 4 x
                                           host_blocks, at least 1024) */
  const kvoffload_tier_config_t* tiers; /* tiers below the host cache, nearest first */
  size_t num_tiers;
  /* The model weights' identity (a checkpoint digest, a training step); NULL: none. Every tier
   * keys blocks by it: blocks of other weights are never found, nor restored from disk. */
  const char* weights;
} kvoffload_scheduler_config_t;
/* kvoffload::SchedulerConfig's defaults (tests/scheduler/config_defaults_test.cpp checks them). */
#define KVOFFLOAD_SCHEDULER_CONFIG_INIT                                            \
  {                                                                                \
    sizeof(kvoffload_scheduler_config_t), /* struct_size */                        \
        NULL,                             /* groups: none, the caller sets them */ \
        0,                                /* num_groups */                         \
        1,                                /* block_size_factor */                  \
        16,                               /* hash_block_size */                    \
        1,                                /* num_workers */                        \
        1,                                /* prefix_caching */                     \
        0,                                /* gpu_blocks: unknown */                \
        0,                                /* host_blocks: the caller sets it */    \
        NULL,                             /* policy: "lru" */                      \
        0,                                /* store_threshold: off */               \
        0,                                /* block_bytes: unknown */               \
        1,                                /* enable_events */                      \
        0,                                /* threshold_tracker_keys: automatic */  \
        NULL,                             /* tiers: none */                        \
        0,                                /* num_tiers */                          \
        NULL                              /* weights: none */                      \
  }

/* lookup's answer when keys are being stored or loaded right now: ask again later. */
#define KVOFFLOAD_RETRY_LATER (-1)

typedef struct kvoffload_allocated_group {
  const kvoffload_block_id_t* block_ids; /* the request's blocks of this group, nulls included */
  size_t num_block_ids;
  int64_t num_computed_blocks; /* leading blocks that need no load */
} kvoffload_allocated_group_t;

typedef struct kvoffload_scheduled_request {
  const char* request_id;
  int64_t num_computed_tokens;
  int64_t num_scheduled_tokens;
  /* One list per group: new_block_ids[g] has num_new_block_ids[g] ids (NULL if 0). */
  const kvoffload_block_id_t* const* new_block_ids;
  const size_t* num_new_block_ids;
  size_t num_groups;
  int resumed; /* 1: resumed after preemption, its block lists start over */
} kvoffload_scheduled_request_t;

/* A job as the scheduler emitted it: a view into a step (valid until the step is destroyed). */
typedef struct kvoffload_job {
  kvoffload_job_id_t id;
  kvoffload_job_kind_t kind;
  const char* request_id;
  const kvoffload_key_t* keys; /* num_host_blocks keys, group-major */
  const int32_t* host_block_ids;
  size_t num_host_blocks;
  const kvoffload_block_id_t* gpu_block_ids; /* group-major, no nulls */
  size_t num_gpu_block_ids;
  const int64_t* group_sizes;   /* num_groups entries; their sum is num_gpu_block_ids */
  const int64_t* block_indices; /* num_groups entries */
  size_t num_groups;
} kvoffload_job_t;

/* A tier job as the scheduler emitted it: a view into a step (valid until it is destroyed). */
typedef struct kvoffload_tier_job {
  kvoffload_job_id_t id;
  kvoffload_job_kind_t kind; /* KVOFFLOAD_JOB_TIER_PROMOTE or _TIER_WRITE */
  uint32_t tier;             /* index into the scheduler's tiers (and the worker's) */
  const char* request_id;    /* promotions: the request whose lookup started it; writes: "" */
  const kvoffload_key_t* keys;
  const int32_t* host_block_ids;
  const int64_t* slots;
  size_t num_blocks;
  uint64_t epoch; /* the weights' epoch it stores and finds blocks under: pass it on as is */
} kvoffload_tier_job_t;

typedef struct kvoffload_tier_stats {
  size_t struct_size;
  int64_t blocks_total, blocks_used, blocks_writing, blocks_being_read;
  uint64_t hits, misses, promotions, failed_promotions, promotions_without_room;
  uint64_t blocks_written, failed_writes, writes_skipped, writes_queue_full, writes_without_room;
  uint64_t evictions, promote_jobs, write_jobs;
  uint64_t presence_checks, presence_hits, presence_misses, presence_failures;
  uint64_t writes_partial; /* not written: stored without leading sub-blocks (host only) */
  /* Keys whose existence check got no usable answer (the cluster down, a timeout, AUTH or TLS
   * refused): an outage, apart from presence_misses. Read only when struct_size covers it. */
  uint64_t presence_errors;
  /* Blocks of promotions past the tier's promote_timeout_ms (their keys were misses). Written
   * only when struct_size covers it. */
  uint64_t promotions_overdue;
} kvoffload_tier_stats_t;
#define KVOFFLOAD_TIER_STATS_INIT                                                                  \
  {                                                                                                \
    sizeof(kvoffload_tier_stats_t), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, \
        0, 0, 0                                                                                    \
  }

/* The result of one build_step; free it with kvoffload_step_destroy. */
typedef struct kvoffload_step_s* kvoffload_step_t;

typedef struct kvoffload_job_report {
  kvoffload_job_id_t job;
  int64_t count; /* reports this entry stands for (usually 1) */
  int ok;        /* 0: the transfer failed */
} kvoffload_job_report_t;

typedef struct kvoffload_completed_job {
  kvoffload_job_id_t job;
  kvoffload_job_kind_t kind;
  const char* request_id; /* valid until the next on_completed call on this scheduler */
  int ok;                 /* a failed load means the engine must recompute those tokens */
} kvoffload_completed_job_t;

typedef struct kvoffload_event {
  int removed; /* 0: the keys were stored, 1: they were evicted */
  const kvoffload_key_t* keys;
  size_t num_keys;
} kvoffload_event_t;

typedef struct kvoffload_scheduler_stats {
  size_t struct_size;
  int64_t blocks_total, blocks_used, blocks_free, blocks_writing, blocks_being_read;
  uint64_t hits, misses, deferrals, evictions, stores_skipped, stores_without_room;
  uint64_t blocks_stored, blocks_loaded, bytes_stored, bytes_loaded;
  uint64_t lookups, hit_tokens, load_jobs, store_jobs, failed_loads, failed_stores;
  /* Blocks stored without their leading (null) sub-blocks, and key lookups that found such a
   * block but missed because the answer needed an unwritten sub-block (never loaded). */
  uint64_t partial_stores, partial_misses;
  /* Added after 0.5.0: blocks not stored because the workers reported store back-pressure
   * (kvoffload_scheduler_set_store_pressure). A caller built against 0.5.0 passes the smaller
   * struct_size and gets the fields it knows. */
  uint64_t pressure_skips;
  /* Added after 0.5.0 too: GPU blocks left out of stores because the engine had freed them and
   * handed them out again before the store was built, and blocks not stored because what was
   * written of them could never be served (a full-attention block with a hole). */
  uint64_t reused_sub_blocks, unsafe_skips;
  /* Added after 0.5.0 too: mamba blocks not stored because they end past the tokens the engine
   * finalised (kvoffload_scheduler_limit_state_stores). */
  uint64_t unfinal_state_skips;
} kvoffload_scheduler_stats_t;
#define KVOFFLOAD_SCHEDULER_STATS_INIT                                                            \
  {                                                                                               \
    sizeof(kvoffload_scheduler_stats_t), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, \
        0, 0, 0, 0, 0, 0, 0, 0                                                                    \
  }

KVOFFLOAD_C_API kvoffload_status_t kvoffload_scheduler_create(
    const kvoffload_scheduler_config_t* config, kvoffload_scheduler_t* scheduler);
/* Destroying NULL is a no-op. Steps built by the scheduler stay valid. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_scheduler_destroy(kvoffload_scheduler_t scheduler);

/* The request's token count and all its block hashes so far (extending the previous list). */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_scheduler_update_request(
    kvoffload_scheduler_t scheduler, const char* request_id, int64_t num_tokens,
    const kvoffload_block_hash_t* hashes, size_t num_hashes, int remote_decode);
/* Like update_request, with only the hashes that are new since the last call. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_scheduler_extend_request(
    kvoffload_scheduler_t scheduler, const char* request_id, int64_t num_tokens,
    const kvoffload_block_hash_t* new_hashes, size_t num_new_hashes);
/* *hit_tokens: tokens loadable from host memory (0: none), or KVOFFLOAD_RETRY_LATER. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_scheduler_lookup(kvoffload_scheduler_t scheduler,
                                                              const char* request_id,
                                                              int64_t num_computed_tokens,
                                                              int64_t* hit_tokens);
KVOFFLOAD_C_API kvoffload_status_t kvoffload_scheduler_on_allocated(
    kvoffload_scheduler_t scheduler, const char* request_id,
    const kvoffload_allocated_group_t* groups, size_t num_groups, int64_t num_external_tokens);
/* Builds the step's jobs into a new *step. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_scheduler_build_step(
    kvoffload_scheduler_t scheduler, const kvoffload_scheduled_request_t* requests,
    size_t num_requests, const char* const* preempted, size_t num_preempted,
    kvoffload_step_t* step);
/* Applies worker reports. The jobs that completed are written to completed[0..*num_completed)
 * (at most num_reports of them, so a capacity of num_reports always suffices). */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_scheduler_on_completed(
    kvoffload_scheduler_t scheduler, const kvoffload_job_report_t* reports, size_t num_reports,
    kvoffload_completed_job_t* completed, size_t capacity, size_t* num_completed);
/* Unknown or already finished requests are ignored. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_scheduler_on_finished(kvoffload_scheduler_t scheduler,
                                                                   const char* request_id);
/* Stores none of the request's tokens past the first max_tokens (0: nothing of it), as vLLM's
 * per-request max_offload_tokens; blocks already stored stay. KVOFFLOAD_INVALID_ARGUMENT for
 * an unknown request or a negative limit. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_scheduler_limit_stores(kvoffload_scheduler_t scheduler,
                                                                    const char* request_id,
                                                                    int64_t max_tokens);
/* Mamba groups store no block of the request ending past its first final_tokens tokens, those
 * whose states the engine finalised as a prefill computes them (past them: decode-time and
 * draft-advanced states); counted in unfinal_state_skips. No limit until called.
 * KVOFFLOAD_INVALID_ARGUMENT for an unknown request or a negative count. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_scheduler_limit_state_stores(
    kvoffload_scheduler_t scheduler, const char* request_id, int64_t final_tokens);
/* Its lookups load at most max_tokens beyond the computed ones, ending at an offloaded block,
 * every group checked at that end (vLLM 0.33's max_load_tokens); negative: no limit.
 * KVOFFLOAD_INVALID_ARGUMENT for an unknown request. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_scheduler_limit_loads(kvoffload_scheduler_t scheduler,
                                                                   const char* request_id,
                                                                   int64_t max_tokens);
/* The engine's hint that the request's conversation will go on (continues 1) or not (0): policy
 * "reuse" keeps its blocks longer or gives them up first; other policies ignore it.
 * KVOFFLOAD_INVALID_ARGUMENT for an unknown request or continues other than 0 or 1. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_scheduler_hint_continues(
    kvoffload_scheduler_t scheduler, const char* request_id, int continues);
/* The clock, in seconds, policy "reuse" ages requests by (a replay's trace time); never going
 * back. Without a call: seconds since the scheduler was made. KVOFFLOAD_INVALID_ARGUMENT for a
 * negative or non-finite time. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_scheduler_set_time(kvoffload_scheduler_t scheduler,
                                                                double seconds);
/* Drops the host cache. Refused (KVOFFLOAD_INVALID_ARGUMENT) for a scheduler with tiers: their
 * blocks outlive it, so use kvoffload_scheduler_reset_weights. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_scheduler_reset_cache(kvoffload_scheduler_t scheduler);
/* kvoffload_scheduler_reset_cache for new weights, also with tiers: every tier's old blocks are
 * unreachable from this call on; blocks stored from now on are keyed by `weights` (neither
 * NULL nor empty), found by every engine that gives the same identity and restored from disk
 * by a restart that does. */
KVOFFLOAD_C_API kvoffload_status_t
kvoffload_scheduler_reset_weights(kvoffload_scheduler_t scheduler, const char* weights);
/* Events since the last call, oldest first; the array is valid until the next call. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_scheduler_take_events(kvoffload_scheduler_t scheduler,
                                                                   const kvoffload_event_t** events,
                                                                   size_t* num_events);
/* The medium of each event the last kvoffload_scheduler_take_events returned ("host", or a
 * tier's: "disk"), in the same order; valid as long as those events. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_scheduler_event_media(kvoffload_scheduler_t scheduler,
                                                                   const char* const** media,
                                                                   size_t* num_events);
/* stats->struct_size must be set (KVOFFLOAD_SCHEDULER_STATS_INIT). */
KVOFFLOAD_C_API kvoffload_status_t
kvoffload_scheduler_get_stats(kvoffload_scheduler_t scheduler, kvoffload_scheduler_stats_t* stats);
/* Back-pressure (Scheduler::set_store_pressure): while `on` is non-zero, steps build no store
 * jobs and count the blocks they skip in pressure_skips. Set it before each build_step from the
 * workers' latest kvoffload_worker_store_pressure (any worker's). */
KVOFFLOAD_C_API kvoffload_status_t
kvoffload_scheduler_set_store_pressure(kvoffload_scheduler_t scheduler, int on);
/* Scheduler::handed_out (semantics 6.9): GPU blocks the engine hands out or overwrites this step
 * without listing them in any request's new block ids (copy-on-write destinations, say). Stores
 * built from now on leave them out of every request that held them before in a window or mamba
 * group, and stores still reading them are flushed first. Call before the step's build_step. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_scheduler_handed_out(
    kvoffload_scheduler_t scheduler, const kvoffload_block_id_t* block_ids, size_t num_block_ids);

KVOFFLOAD_C_API kvoffload_status_t kvoffload_step_num_jobs(kvoffload_step_t step,
                                                           kvoffload_job_kind_t kind,
                                                           size_t* num_jobs);
/* The index-th load or store job of the step (store jobs in the order of the requests). */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_step_get_job(kvoffload_step_t step,
                                                          kvoffload_job_kind_t kind, size_t index,
                                                          kvoffload_job_t* job);
/* In-flight stores that must finish before this step's compute, ascending. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_step_get_flush(kvoffload_step_t step,
                                                            const kvoffload_job_id_t** jobs,
                                                            size_t* num_jobs);
KVOFFLOAD_C_API kvoffload_status_t kvoffload_step_destroy(kvoffload_step_t step);
/* The step's tier jobs (promotions and writes); run them with kvoffload_worker_submit_tier. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_step_num_tier_jobs(kvoffload_step_t step,
                                                                size_t* num_jobs);
KVOFFLOAD_C_API kvoffload_status_t kvoffload_step_get_tier_job(kvoffload_step_t step, size_t index,
                                                               kvoffload_tier_job_t* job);
/* After a restart: rebuilds tier `tier`'s index from the workers' scan (slot i holds keys[i]
 * where present[i] is 1; see kvoffload_worker_tier_scan). */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_scheduler_restore_tier(
    kvoffload_scheduler_t scheduler, size_t tier, const kvoffload_key_t* keys,
    const uint8_t* present, size_t num_slots, int64_t* restored);
/* stats->struct_size must be set (KVOFFLOAD_TIER_STATS_INIT). */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_scheduler_get_tier_stats(
    kvoffload_scheduler_t scheduler, size_t tier, kvoffload_tier_stats_t* stats);
/* The scheduler's statistics in the Prometheus text format, for a /metrics endpoint
 * (kvoffload/metrics_text.hpp: the host cache's counters and gauges, each tier's; no
 * constant labels from C): NUL-terminated, `*length` bytes, valid until the next call of this
 * function on this scheduler. Call it where the scheduler's other calls are made (it reads
 * the scheduler's state, which is not locked): copy the text to serve it from another
 * thread. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_scheduler_metrics_text(kvoffload_scheduler_t scheduler,
                                                                    const char** text,
                                                                    size_t* length);

/* ---- worker ------------------------------------------------------------------------------ */

typedef struct kvoffload_worker_s* kvoffload_worker_t;

/* One KV tensor of the engine's cache: num_blocks pages, page i at base + i * stride. */
typedef struct kvoffload_kv_tensor {
  uintptr_t base;
  int64_t num_blocks;
  int64_t page_bytes;
  int64_t block_stride_bytes;
} kvoffload_kv_tensor_t;

/* A tensor a group owns and the bytes of each page that hold data (<= the tensor's page). */
typedef struct kvoffload_group_tensor {
  int32_t tensor;
  int64_t page_bytes;
} kvoffload_group_tensor_t;

typedef struct kvoffload_group_tensors {
  const kvoffload_group_tensor_t* tensors;
  size_t num_tensors;
} kvoffload_group_tensors_t;

typedef enum kvoffload_backend_kind {
  KVOFFLOAD_BACKEND_HOST = 0, /* memcpy threads; the KV tensors are in host memory */
  KVOFFLOAD_BACKEND_CUDA = 1  /* CUDA copies; the KV tensors are device memory */
} kvoffload_backend_kind_t;

/* Since 0.3: struct_size must be this header's sizeof (0.2's struct had other fields at the
 * same offsets, so no shorter or longer one is accepted). */
typedef struct kvoffload_worker_config {
  size_t struct_size;
  /* The description the worker shares with its scheduler, given once: the block size factor,
   * host_blocks (the host pool, allocated by the worker) and the tiers, in order, each with its
   * disk or shared store. The scheduler's own config, or an equal one in another process. */
  const kvoffload_scheduler_config_t* scheduler;
  const kvoffload_kv_tensor_t* tensors;
  size_t num_tensors;
  const kvoffload_group_tensors_t* groups; /* the scheduler's groups, in order */
  size_t num_groups;
  kvoffload_backend_kind_t backend;
  int threads;      /* host backend copy threads (0: all cores) */
  int cuda_device;  /* CUDA backend device */
  int defer_stores; /* 1: a step's stores start at the next kvoffload_worker_start_step */
  /* CUDA backend: the engine's compute stream. With has_compute_stream = 1, stores (and loads,
   * unless loads_wait_for_compute is 0) wait on the device for the work queued on
   * compute_stream when they are submitted. compute_stream is a cudaStream_t's value; 0 is the
   * legacy default stream (PyTorch's default). cudaStreamPerThread is refused. Without it,
   * nothing is waited for: only right if the engine synchronizes before submitting. This is
   * the stream at creation only: an engine whose current stream can change (micro-batching,
   * dual-batch overlap, a side stream) calls kvoffload_worker_set_compute_stream each step
   * before submitting that step's jobs. */
  int has_compute_stream;
  uintptr_t compute_stream;
  int loads_wait_for_compute; /* default 1 */
  int tp_rank; /* this worker's tensor-parallel rank: its tiers' stores run as that rank */
  /* Added after 0.5.0 (a struct ending at tp_rank is still accepted): back-pressure, the bytes
   * of stores held at once (0: no bound). A store past it is not copied and finishes failed;
   * kvoffload_worker_store_pressure turns on at half of it. */
  uint64_t max_store_bytes_in_flight;
} kvoffload_worker_config_t;
/* kvoffload::WorkerConfig's defaults (tests/scheduler/config_defaults_test.cpp checks them). */
#define KVOFFLOAD_WORKER_CONFIG_INIT                                       \
  {                                                                        \
    sizeof(kvoffload_worker_config_t), /* struct_size */                   \
        NULL,                          /* scheduler: the caller sets it */ \
        NULL,                          /* tensors: the caller sets them */ \
        0,                             /* num_tensors */                   \
        NULL,                          /* groups: the caller sets them */  \
        0,                             /* num_groups */                    \
        KVOFFLOAD_BACKEND_HOST,        /* backend */                       \
        0,                             /* threads: all cores */            \
        0,                             /* cuda_device */                   \
        0,                             /* defer_stores */                  \
        0,                             /* has_compute_stream */            \
        0,                             /* compute_stream */                \
        1,                             /* loads_wait_for_compute */        \
        0,                             /* tp_rank */                       \
        0                              /* max_store_bytes_in_flight */     \
  }

typedef struct kvoffload_finished_transfer {
  kvoffload_job_id_t job;
  kvoffload_job_kind_t kind; /* tier jobs: KVOFFLOAD_JOB_TIER_PROMOTE or _TIER_WRITE */
  int ok;
  const char* error; /* "" when ok; valid until the next get_finished call */
  uint64_t bytes;
} kvoffload_finished_transfer_t;

KVOFFLOAD_C_API kvoffload_status_t kvoffload_worker_create(const kvoffload_worker_config_t* config,
                                                           kvoffload_worker_t* worker);
/* Cancels transfers that have not run and frees the pool. Destroying NULL is a no-op. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_worker_destroy(kvoffload_worker_t worker);
/* Starts a job (load or store, as job->kind says). A job that breaks the invariants or points
 * outside the layout is refused with KVOFFLOAD_INVALID_ARGUMENT and nothing is copied. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_worker_submit(kvoffload_worker_t worker,
                                                           const kvoffload_job_t* job);
/* Changes the compute stream for jobs submitted from now on (see kvoffload_worker_config_t);
 * has_stream = 0 turns every wait off, those for earlier streams included.
 * KVOFFLOAD_INVALID_ARGUMENT for a host-backend worker or cudaStreamPerThread. An engine whose
 * current stream can change calls this each step, before submitting the step's jobs, with the
 * stream the step's forward pass runs on. Jobs started after a switch also wait for the work queued
 * on the old stream up to the switch (until it is done), so deferred stores of the old stream's
 * pass stay ordered whether kvoffload_worker_start_step comes before or after this call. Cheap when
 * the stream is unchanged. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_worker_set_compute_stream(kvoffload_worker_t worker,
                                                                       int has_stream,
                                                                       uintptr_t stream);
/* Starts the stores deferred from the previous step (defer_stores). */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_worker_start_step(kvoffload_worker_t worker);
/* Jobs finished since the last call (never blocks). At most `capacity` are returned; the rest
 * wait for the next call. */
KVOFFLOAD_C_API kvoffload_status_t
kvoffload_worker_get_finished(kvoffload_worker_t worker, kvoffload_finished_transfer_t* finished,
                              size_t capacity, size_t* num_finished);
/* Blocks until these jobs (a step's flush set) have finished. Unknown ids are ignored. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_worker_wait(kvoffload_worker_t worker,
                                                         const kvoffload_job_id_t* jobs,
                                                         size_t num_jobs);
/* Starts a tier job of a step (kvoffload_step_get_tier_job); it finishes through
 * kvoffload_worker_get_finished with kind KVOFFLOAD_JOB_TIER_PROMOTE or _TIER_WRITE. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_worker_submit_tier(kvoffload_worker_t worker,
                                                                const kvoffload_tier_job_t* job);
/* What the worker's tier `tier` found when it opened: per slot, present[i] = 1 and keys[i], or
 * 0 (a shared tier has no slots of its own: num_slots 0). Valid until the next call on this
 * worker. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_worker_tier_scan(kvoffload_worker_t worker,
                                                              size_t tier,
                                                              const kvoffload_key_t** keys,
                                                              const uint8_t** present,
                                                              size_t* num_slots);
/* Frees tier `tier`'s start-up scan once kvoffload_scheduler_restore_tier has read it (a disk
 * tier otherwise keeps a key per slot for the worker's life), and the handle's copy from the
 * last kvoffload_worker_tier_scan (of whichever tier: read every tier's scan first). A later
 * kvoffload_worker_tier_scan of that tier gives num_slots 0, so read num_slots (the tier's
 * capacity) before. Nothing to free for a shared tier. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_worker_tier_scan_release(kvoffload_worker_t worker,
                                                                      size_t tier);
/* *on = 1 while the stores the worker holds reach half of max_store_bytes_in_flight: pass it
 * (any worker's) to kvoffload_scheduler_set_store_pressure before the next build_step. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_worker_store_pressure(kvoffload_worker_t worker,
                                                                   int* on);
/* Empties the worker's disk tiers: after kvoffload_scheduler_reset_cache, once the flush set
 * has finished, so the old cache's blocks do not come back after a restart. Never waits for
 * tier jobs issued before the reset (a slow disk): their writes are skipped, or erased once
 * they land. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_worker_clear_tiers(kvoffload_worker_t worker);
/* The host pool: the address of host block `block` and the bytes of each block. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_worker_host_block(kvoffload_worker_t worker,
                                                               int32_t block, void** data,
                                                               size_t* block_bytes);
/* The worker's statistics in the Prometheus text format (its copies and its tiers' I/O),
 * thread-safe to render; the text is valid until the next such call on this worker, so
 * callers on several threads must not overlap (or copy it at once). */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_worker_metrics_text(kvoffload_worker_t worker,
                                                                 const char** text, size_t* length);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVOFFLOAD_KVOFFLOAD_H */
