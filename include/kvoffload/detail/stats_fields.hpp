#pragma once

// Internal to kvoffload's front ends: CacheStats's fields, in the order of the C API's
// kvoffload_scheduler_stats_t. The C API, the Python binding and the replay tool map a
// snapshot with this one list (X(name) for each field), so a field added to CacheStats and
// here reaches all of them, under the same name.
#define KVOFFLOAD_CACHE_STATS_FIELDS(X) \
  X(blocks_total)                       \
  X(blocks_used)                        \
  X(blocks_free)                        \
  X(blocks_writing)                     \
  X(blocks_being_read)                  \
  X(hits)                               \
  X(misses)                             \
  X(deferrals)                          \
  X(evictions)                          \
  X(stores_skipped)                     \
  X(stores_without_room)                \
  X(blocks_stored)                      \
  X(blocks_loaded)                      \
  X(bytes_stored)                       \
  X(bytes_loaded)                       \
  X(lookups)                            \
  X(hit_tokens)                         \
  X(load_jobs)                          \
  X(store_jobs)                         \
  X(failed_loads)                       \
  X(failed_stores)                      \
  X(partial_stores)                     \
  X(partial_misses)                     \
  X(pressure_skips)                     \
  X(reused_sub_blocks)                  \
  X(unsafe_skips)                       \
  X(unfinal_state_skips)

// TierStats's fields (Scheduler::tier_stats), for the front ends likewise.
#define KVOFFLOAD_TIER_STATS_FIELDS(X) \
  X(blocks_total)                      \
  X(blocks_used)                       \
  X(blocks_writing)                    \
  X(blocks_being_read)                 \
  X(hits)                              \
  X(misses)                            \
  X(promotions)                        \
  X(failed_promotions)                 \
  X(promotions_without_room)           \
  X(blocks_written)                    \
  X(failed_writes)                     \
  X(writes_skipped)                    \
  X(writes_queue_full)                 \
  X(writes_without_room)               \
  X(evictions)                         \
  X(promote_jobs)                      \
  X(write_jobs)                        \
  X(presence_checks)                   \
  X(presence_hits)                     \
  X(presence_misses)                   \
  X(presence_failures)                 \
  X(writes_partial)                    \
  X(presence_errors)                   \
  X(promotions_overdue)
