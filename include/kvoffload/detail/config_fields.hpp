#pragma once

// Internal to kvoffload's front ends: the configuration fields every front end maps, once.
// The C API (same-named fields of its structs), the Python binding (same-named attributes of
// its dataclasses) and the replay tool (same-named keys of a trace's config, defaults from
// the C++ structs) each apply X(name) to these lists, so a field added to a config and here
// reaches all of them under one name. Fields outside the lists are named where they differ.

// ManagerConfig's (SchedulerConfig::manager; flat in the front ends' scheduler configs).
#define KVOFFLOAD_MANAGER_CONFIG_FIELDS(X) \
  X(host_blocks)                           \
  X(policy)                                \
  X(store_threshold)                       \
  X(threshold_tracker_keys)                \
  X(block_bytes)                           \
  X(enable_events)

// SchedulerConfig's own scalars (groups, manager and tiers are lists or structs of their own).
#define KVOFFLOAD_SCHEDULER_CONFIG_FIELDS(X) \
  X(block_size_factor)                       \
  X(hash_block_size)                         \
  X(num_workers)                             \
  X(prefix_caching)                          \
  X(gpu_blocks)                              \
  X(weights)

// GroupConfig's.
#define KVOFFLOAD_GROUP_CONFIG_FIELDS(X) \
  X(kind)                                \
  X(gpu_block_size)                      \
  X(sliding_window)

// TierConfig's index fields (its store is a DiskTierConfig or a SharedTierConfig).
#define KVOFFLOAD_TIER_CONFIG_FIELDS(X) \
  X(medium)                             \
  X(blocks)                             \
  X(policy)                             \
  X(store_threshold)                    \
  X(write_queue_blocks)                 \
  X(write_back)                         \
  X(write_back_free_blocks)             \
  X(promote_timeout_ms)

// DiskTierConfig's (verify_payloads_on_scan is C++ only).
#define KVOFFLOAD_DISK_TIER_CONFIG_FIELDS(X) \
  X(path)                                    \
  X(capacity_bytes)                          \
  X(model)                                   \
  X(dtype)                                   \
  X(tp_rank)                                 \
  X(tp_size)                                 \
  X(io)                                      \
  X(io_depth)                                \
  X(io_threads)                              \
  X(direct_io)

// SharedTierConfig's.
#define KVOFFLOAD_SHARED_TIER_CONFIG_FIELDS(X) \
  X(nodes)                                     \
  X(name)                                      \
  X(tp_rank)                                   \
  X(tp_size)                                   \
  X(connect_timeout_ms)                        \
  X(reply_timeout_ms)                          \
  X(in_flight)                                 \
  X(secret_file)                               \
  X(secret_env)                                \
  X(insecure)                                  \
  X(username)                                  \
  X(password_file)                             \
  X(password_env)                              \
  X(tls)                                       \
  X(tls_ca_file)                               \
  X(tls_cert_file)                             \
  X(tls_key_file)                              \
  X(tls_server_name)                           \
  X(ttl_seconds)                               \
  X(only_seeds)

// WorkerConfig's scalars as the Python binding maps them (the C struct takes the factor and the
// pool's size from its scheduler config and names its backend by number: it maps its own).
#define KVOFFLOAD_WORKER_CONFIG_FIELDS(X) \
  X(host_blocks)                          \
  X(block_size_factor)                    \
  X(backend)                              \
  X(threads)                              \
  X(cuda_device)                          \
  X(defer_stores)                         \
  X(max_store_bytes_in_flight)            \
  X(loads_wait_for_compute)               \
  X(copy_mode)                            \
  X(tp_rank)                              \
  X(weights)                              \
  X(layout_note)
