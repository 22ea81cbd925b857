// One set of defaults: the C API's *_INIT macros must equal kvoffload's C++ config defaults
// (python/tests/test_config_defaults.py checks the Python dataclasses against the same).

#include <catch2/catch_test_macros.hpp>

#include <cstring>
#include <string>

#include "kvoffload/kvoffload.h"
#include "kvoffload/scheduler.hpp"
#include "kvoffload/worker.hpp"

using namespace kvoffload;

TEST_CASE("KVOFFLOAD_SCHEDULER_CONFIG_INIT has SchedulerConfig's defaults", "[config][c_api]") {
  const kvoffload_scheduler_config_t c = KVOFFLOAD_SCHEDULER_CONFIG_INIT;
  const SchedulerConfig cpp;
  CHECK(c.struct_size == sizeof(kvoffload_scheduler_config_t));
  CHECK(c.groups == nullptr);
  CHECK(c.num_groups == cpp.groups.size());
  CHECK(c.block_size_factor == cpp.block_size_factor);
  CHECK(c.hash_block_size == cpp.hash_block_size);
  CHECK(c.num_workers == cpp.num_workers);
  CHECK((c.prefix_caching != 0) == cpp.prefix_caching);
  CHECK(c.gpu_blocks == cpp.gpu_blocks);
  CHECK(c.host_blocks == cpp.manager.host_blocks);
  CHECK(c.policy == nullptr);  // NULL means the default policy
  CHECK(cpp.manager.policy == EvictionPolicyKind::lru);
  CHECK(c.store_threshold == cpp.manager.store_threshold);
  CHECK(c.block_bytes == cpp.manager.block_bytes);
  CHECK((c.enable_events != 0) == cpp.manager.enable_events);
  CHECK(c.threshold_tracker_keys == cpp.manager.threshold_tracker_keys);
}

TEST_CASE("KVOFFLOAD_WORKER_CONFIG_INIT has WorkerConfig's defaults", "[config][c_api]") {
  const kvoffload_worker_config_t c = KVOFFLOAD_WORKER_CONFIG_INIT;
  const WorkerConfig cpp;
  CHECK(c.struct_size == sizeof(kvoffload_worker_config_t));
  CHECK(c.num_tensors == cpp.tensors.size());
  CHECK(c.num_groups == cpp.groups.size());
  CHECK(c.scheduler == nullptr);  // the description: the caller sets it
  CHECK(cpp.tiers.empty());
  CHECK(static_cast<int>(c.backend) == static_cast<int>(cpp.backend));
  CHECK(c.threads == cpp.threads);
  CHECK(c.cuda_device == cpp.cuda_device);
  CHECK((c.defer_stores != 0) == cpp.defer_stores);
  CHECK((c.has_compute_stream != 0) == cpp.compute_stream.has_value());
  CHECK((c.loads_wait_for_compute != 0) == cpp.loads_wait_for_compute);
  CHECK(c.tp_rank == cpp.tp_rank);
  CHECK(c.max_store_bytes_in_flight == cpp.max_store_bytes_in_flight);
}

TEST_CASE(
    "The tier INIT macros have TierConfig's, DiskTierConfig's and SharedTierConfig's defaults",
    "[config][c_api]") {
  const kvoffload_tier_config_t t = KVOFFLOAD_TIER_CONFIG_INIT;
  const TierConfig tc;
  CHECK(t.struct_size == sizeof(kvoffload_tier_config_t));
  CHECK(parse_medium(t.medium, "medium") == tc.medium);
  CHECK(t.blocks == tc.blocks);
  CHECK(t.policy == nullptr);
  CHECK(tc.policy == EvictionPolicyKind::lru);
  CHECK(t.store_threshold == tc.store_threshold);
  CHECK(t.write_queue_blocks == tc.write_queue_blocks);
  CHECK((t.write_back != 0) == tc.write_back);
  CHECK(t.write_back_free_blocks == tc.write_back_free_blocks);
  const kvoffload_disk_tier_config_t d = KVOFFLOAD_DISK_TIER_CONFIG_INIT;
  const DiskTierConfig dc;
  CHECK(d.struct_size == sizeof(kvoffload_disk_tier_config_t));
  CHECK(d.path == nullptr);
  CHECK(dc.path.empty());
  CHECK(d.capacity_bytes == dc.capacity_bytes);
  CHECK(std::string(d.model) == dc.model);
  CHECK(std::string(d.dtype) == dc.dtype);
  CHECK(d.tp_rank == dc.tp_rank);
  CHECK(d.tp_size == dc.tp_size);
  CHECK(d.io == nullptr);
  CHECK(dc.io == DiskIo::automatic);
  CHECK(d.io_depth == dc.io_depth);
  CHECK(d.io_threads == dc.io_threads);
  CHECK((d.direct_io != 0) == dc.direct_io);
  CHECK(t.shared == nullptr);
  CHECK(t.disk == nullptr);
  CHECK(!tc.store.has_value());
  const kvoffload_shared_tier_config_t sh = KVOFFLOAD_SHARED_TIER_CONFIG_INIT;
  const SharedTierConfig shc;
  CHECK(sh.struct_size == sizeof(kvoffload_shared_tier_config_t));
  CHECK(sh.nodes == nullptr);
  CHECK(shc.nodes.empty());
  CHECK(sh.name == nullptr);
  CHECK(shc.name.empty());
  CHECK(sh.tp_rank == shc.tp_rank);
  CHECK(sh.tp_size == shc.tp_size);
  CHECK(sh.connect_timeout_ms == shc.connect_timeout_ms);
  CHECK(sh.reply_timeout_ms == shc.reply_timeout_ms);
  CHECK(sh.in_flight == shc.in_flight);
  CHECK(sh.secret_file == nullptr);
  CHECK(shc.secret_file.empty());
  CHECK(sh.secret_env == nullptr);  // NULL: the default name
  CHECK(shc.secret_env == "KVOFFLOAD_SHARED_SECRET");
  CHECK((sh.insecure != 0) == shc.insecure);
  // NULL strings are the C++ defaults: empty, or the default variable names.
  for (const char* s : {sh.username, sh.password_file, sh.tls_ca_file, sh.tls_cert_file,
                        sh.tls_key_file, sh.tls_server_name, sh.password_env}) {
    CHECK(s == nullptr);
  }
  CHECK(shc.username.empty());
  CHECK(shc.password_file.empty());
  CHECK(shc.password_env == "KVOFFLOAD_SHARED_PASSWORD");
  CHECK(shc.tls_ca_file.empty());
  CHECK(shc.tls_cert_file.empty());
  CHECK(shc.tls_key_file.empty());
  CHECK(shc.tls_server_name.empty());
  CHECK((sh.tls != 0) == shc.tls);
  CHECK(sh.ttl_seconds == shc.ttl_seconds);
  CHECK((sh.only_seeds != 0) == shc.only_seeds);
  const kvoffload_scheduler_config_t sc = KVOFFLOAD_SCHEDULER_CONFIG_INIT;
  CHECK(sc.tiers == nullptr);
  CHECK(sc.num_tiers == SchedulerConfig{}.tiers.size());
  CHECK(sc.weights == nullptr);
  CHECK(SchedulerConfig{}.weights.empty());
}

TEST_CASE("threshold_tracker_keys reaches the scheduler from the C API", "[config][c_api]") {
  kvoffload_group_config_t group = {KVOFFLOAD_FULL_ATTENTION, 16, 0};
  kvoffload_scheduler_config_t c = KVOFFLOAD_SCHEDULER_CONFIG_INIT;
  c.groups = &group;
  c.num_groups = 1;
  c.host_blocks = 8;
  c.store_threshold = 2;
  c.threshold_tracker_keys = -1;  // refused by validation: proves the field is read
  kvoffload_scheduler_t s = nullptr;
  CHECK(kvoffload_scheduler_create(&c, &s) == KVOFFLOAD_INVALID_ARGUMENT);
  CHECK(std::strstr(kvoffload_last_error(), "threshold_tracker_keys") != nullptr);
  c.threshold_tracker_keys = 4096;
  REQUIRE(kvoffload_scheduler_create(&c, &s) == KVOFFLOAD_SUCCESS);
  CHECK(kvoffload_scheduler_destroy(s) == KVOFFLOAD_SUCCESS);
}
