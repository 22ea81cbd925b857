// kvoffload-demo: a synthetic serving engine on the GPU-less HostBackend. Requests with shared
// prefixes are scheduled, their KV blocks stored to a small host pool (so blocks are evicted),
// loaded back for later requests, and every loaded byte is checked against what the request
// would have computed.

#include <cstdio>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "kvoffload/byte_size.hpp"
#include "sim/synthetic_engine.hpp"

int main(int argc, char** argv) {
  CLI::App app{"kvoffload-demo: scheduler + host cache + transfer engine end to end, verified"};
  kvsim::SimConfig c;
  app.add_option("--steps", c.steps, "engine steps")->capture_default_str();
  app.add_option("--seed", c.seed, "random seed")->capture_default_str();
  app.add_option("--host-blocks", c.host_blocks, "host cache size in blocks")
      ->capture_default_str();
  app.add_option("--policy", c.policy, "eviction policy: lru or arc")->capture_default_str();
  app.add_option("--factor", c.block_size_factor, "GPU blocks per host block")
      ->capture_default_str();
  bool no_verify = false;
  app.add_flag("--no-verify", no_verify, "skip the byte comparison (for timing)");
  app.add_option("--max-running", c.max_running, "requests running at once")->capture_default_str();
  // Fault injection (a FaultyBackend around the HostBackend) and the reliability invariants.
  app.add_option("--fail", c.faults.fail, "probability that a transfer fails halfway")
      ->capture_default_str();
  app.add_option("--delay", c.faults.delay, "probability that a completion is held back")
      ->capture_default_str();
  app.add_flag("--reorder", c.faults.reorder, "complete transfers in random order");
  app.add_flag("--check-invariants", c.check_invariants,
               "check the cache against the worker's successful stores after every step, and "
               "drain at the end");
  std::string disk_capacity = "64MiB";
  app.add_option("--disk", c.disk_dir,
                 "directory of a disk tier below the host cache (kept across runs: a second "
                 "run with the same seed finds the blocks again)");
  app.add_option("--disk-capacity", disk_capacity, "disk tier capacity, e.g. 64MiB or 2GiB")
      ->capture_default_str();
  app.add_option("--disk-threshold", c.disk_store_threshold,
                 "disk admission: write a block once it was looked up N times (0: always)")
      ->capture_default_str();
  app.add_flag("--disk-write-back", c.disk_write_back,
               "write blocks to the disk when the host cache evicts them (default: after each "
               "store)");
  app.add_option("--shared", c.shared_nodes,
                 "HOST:PORT[,...] of a Valkey cluster: a shared tier below the host cache (and "
                 "the disk tier); another run with the same seed, on any machine, hits the "
                 "blocks this one stored (scripts/valkey-cluster start gives one)");
  app.add_option("--shared-name", c.shared_name,
                 "the shared tier's namespace: runs share blocks only under the same name")
      ->capture_default_str();
  app.add_option("--shared-secret-file", c.shared_secret_file,
                 "a file holding the fleet secret (16 bytes or more; every engine of the fleet "
                 "the same); without it, the environment variable KVOFFLOAD_SHARED_SECRET");
  app.add_option("--shared-user", c.shared_username,
                 "the shared tier's ACL user (its password: --shared-password-file, else the "
                 "environment variable KVOFFLOAD_SHARED_PASSWORD)");
  app.add_option("--shared-password-file", c.shared_password_file,
                 "a file holding the ACL user's password");
  app.add_option("--shared-tls-ca", c.shared_tls_ca_file,
                 "TLS to the cluster, its certificates verified against this CA file");
  app.add_option("--shared-tls-server-name", c.shared_tls_server_name,
                 "the name the cluster's certificates must carry (default: the host connected to)");
  app.add_flag("--shared-insecure", c.shared_insecure,
               "run the shared tier without a fleet secret (anyone who can write to the "
               "cluster can forge values): for a trusted, private cluster only");
  app.add_option("--shared-threshold", c.shared_store_threshold,
                 "shared tier admission: write a block once it was looked up N times (0: "
                 "always; a huge N: read only)")
      ->capture_default_str();
  app.add_flag("--lockstep", c.lockstep,
               "every job and shared-tier check finishes in the step that starts it, so runs "
               "with the same seed and tier contents repeat exactly (for comparing runs)");
  CLI11_PARSE(app, argc, argv);
  try {
    c.disk_capacity = kvoffload::parse_bytes(disk_capacity, "--disk-capacity");
  } catch (const std::exception& e) {
    std::cerr << "kvoffload-demo: " << e.what() << "\n";
    return 2;
  }
  c.verify = !no_verify;
  c.faulty = c.faults.fail > 0 || c.faults.delay > 0 || c.faults.reorder;
  c.faults.seed = c.seed;

  std::printf(
      "kvoffload-demo: %lld steps, 3 groups (full attention, sliding window 128, mamba), "
      "factor %lld, %lld host blocks (%s policy), seed %llu\n",
      static_cast<long long>(c.steps), static_cast<long long>(c.block_size_factor),
      static_cast<long long>(c.host_blocks), c.policy.c_str(),
      static_cast<unsigned long long>(c.seed));
  auto line = [](const kvsim::SimReport& r) {
    std::printf(
        "step %6lld: %5lld requests done, %6lld stores, %5lld loads (%lld hits), "
        "%7lld blocks verified, %llu evictions, %lld mismatches, %.1f s\n",
        static_cast<long long>(r.steps), static_cast<long long>(r.requests_finished),
        static_cast<long long>(r.store_jobs), static_cast<long long>(r.load_jobs),
        static_cast<long long>(r.lookup_hits), static_cast<long long>(r.blocks_verified),
        static_cast<unsigned long long>(r.evictions), static_cast<long long>(r.mismatches),
        r.seconds);
    std::fflush(stdout);
  };
  try {
    kvsim::SyntheticEngine engine(c);
    const kvsim::SimReport r = engine.run(line, std::max<std::int64_t>(1, c.steps / 10));
    std::printf(
        "stored %s, loaded %s; %lld preemptions\n", kvoffload::format_bytes(r.bytes_stored).c_str(),
        kvoffload::format_bytes(r.bytes_loaded).c_str(), static_cast<long long>(r.preemptions));
    if (!c.disk_dir.empty()) {
      std::printf(
          "disk tier: %lld slots, %lld blocks found at start, %llu written (%llu failed), %llu "
          "promoted into host memory (%llu failed), %llu evicted\n",
          static_cast<long long>(r.disk_slots), static_cast<long long>(r.disk_restored),
          static_cast<unsigned long long>(r.disk_blocks_written),
          static_cast<unsigned long long>(r.disk_failed_writes),
          static_cast<unsigned long long>(r.disk_promotions),
          static_cast<unsigned long long>(r.disk_failed_promotions),
          static_cast<unsigned long long>(r.disk_evictions));
    }
    if (!c.shared_nodes.empty()) {
      std::printf(
          "shared tier: %llu existence checks found %llu keys; %llu blocks promoted into host "
          "memory (%llu failed: %llu bad values, %llu read errors), %llu written (%llu "
          "failed)\n",
          static_cast<unsigned long long>(r.shared_checks),
          static_cast<unsigned long long>(r.shared_found),
          static_cast<unsigned long long>(r.shared_promotions),
          static_cast<unsigned long long>(r.shared_failed_promotions),
          static_cast<unsigned long long>(r.shared_bad_values),
          static_cast<unsigned long long>(r.shared_read_errors),
          static_cast<unsigned long long>(r.shared_blocks_written),
          static_cast<unsigned long long>(r.shared_failed_writes));
    }
    if (c.faulty || c.check_invariants) {
      std::printf(
          "faults: %llu transfers failed, %llu completions delayed; %lld failed loads reported, "
          "%lld failed stores; %llu store attempts found the cache full; %lld invariant checks, "
          "%lld violations%s\n",
          static_cast<unsigned long long>(r.injected_failures),
          static_cast<unsigned long long>(r.delayed_results),
          static_cast<long long>(r.failed_loads_reported), static_cast<long long>(r.failed_stores),
          static_cast<unsigned long long>(r.stores_without_room),
          static_cast<long long>(r.invariant_checks),
          static_cast<long long>(r.invariant_violations), r.drained ? ", drained clean" : "");
    }
    if (r.mismatches != 0) {
      std::printf("FAILED: %lld mismatching pages, first at %s\n",
                  static_cast<long long>(r.mismatches), r.first_mismatch.c_str());
      return 1;
    }
    if (r.invariant_violations != 0) {
      std::printf("FAILED: %lld invariant violations, first at %s\n",
                  static_cast<long long>(r.invariant_violations), r.first_violation.c_str());
      return 1;
    }
    std::printf("OK: every loaded block matched what was stored\n");
  } catch (const std::exception& e) {
    std::cerr << "kvoffload-demo: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
