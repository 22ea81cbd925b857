// kvoffload-bench: measures kvoffload's parts against the limit each can approach, in one run,
// as ratios, and writes the numbers as JSON (--json FILE). Subcommands are the scenarios;
// `all` runs every one (with --quick: the CI smoke test).

#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>

#include "bench_common.hpp"
#include "kvoffload/byte_size.hpp"
#include "kvoffload/error.hpp"
#include "scenarios.hpp"
#include "trace_bench.hpp"

int main(int argc, char** argv) {
  CLI::App app{"kvoffload-bench: kvoffload's benchmarks, each side by side with its baseline"};
  kvbench::Options opt;
  app.add_flag("--quick", opt.quick, "small sizes and few runs (CI smoke test)");
  app.add_option("--runs", opt.runs, "repetitions per measurement (default per scenario)");
  app.add_option("--json", opt.json_path, "write the results to this JSON file");
  app.require_subcommand(1);

  std::string preset = "all";
  auto* scheduler = app.add_subcommand("scheduler", "build_step and lookup cost");
  scheduler
      ->add_option("--preset", preset,
                   "reference (the issue's workload), requests (the running-requests sweep) or all")
      ->check(CLI::IsMember({"reference", "requests", "all"}));
  auto* manager = app.add_subcommand("manager", "host block manager throughput, LRU and ARC");
  std::string index_blocks = "1M,10M";
  std::size_t index_hash_bytes = 32;
  auto* index = app.add_subcommand(
      "index", "heap per stored block and lookup p99 of the block index (host and tiers) at scale");
  index->add_option("--blocks", index_blocks, "capacities to measure (quick: 64K)")
      ->capture_default_str();
  index->add_option("--hash-bytes", index_hash_bytes, "bytes per block hash (vLLM: 32)")
      ->capture_default_str();
  std::string backend = "host";
  auto* copy = app.add_subcommand("copy", "copy bandwidth over piece sizes vs one large copy");
  copy->add_option("--backend", backend, "host or cuda")->check(CLI::IsMember({"host", "cuda"}));
  std::string copy_total, copy_piece_max;
  copy->add_option("--total", copy_total, "cuda: bytes moved per run (default 1GiB)");
  copy->add_option("--max-piece", copy_piece_max, "cuda: the largest piece size (default 16MiB)");
  copy->add_option("--ctas", opt.copy_ctas, "cuda: kernel CTA counts to sweep (kernel, staged)")
      ->delimiter(',');
  std::string copy_host = "malloc";
  copy->add_option("--host", copy_host, "cuda: host memory: malloc (cudaMallocHost) or pool")
      ->check(CLI::IsMember({"malloc", "pool"}));
  auto* calibrate =
      app.add_subcommand("calibrate", "measure the automatic copy mode's threshold (GPU)");
  auto* compact =
      app.add_subcommand("compact", "null block id compaction, CPU (Thrust) and GPU (CUB)");
  compact->add_option("--max-ids", opt.compact_max_ids, "largest id count (default 16M)");
  auto* source_order = app.add_subcommand(
      "source-order",
      "batched loads (pinned host to GPU, many pieces): source order any vs stream (GPU)");
  source_order->add_option("--total", copy_total, "bytes per run (default 256MiB)");
  source_order->add_option("--max-piece", copy_piece_max, "the largest piece size (default 1MiB)");
  std::string pool_size = "8GiB";
  auto* pool = app.add_subcommand("pool", "host pool allocation time: 1 thread vs all cores");
  pool->add_option("--size", pool_size, "pool size (e.g. 8GiB)");
  auto* e2e = app.add_subcommand("e2e", "steps per second of the end-to-end loop");
  std::int64_t soak_steps = 1000000, soak_samples = 50;
  auto* soak = app.add_subcommand(
      "soak", "a long verified end-to-end run sampling resident memory (not part of all)");
  soak->add_option("--steps", soak_steps, "engine steps")->capture_default_str();
  soak->add_option("--samples", soak_samples, "memory samples along the run")
      ->capture_default_str();
  std::string disk_dir = ".", disk_size = "1GiB";
  auto* disk = app.add_subcommand(
      "disk", "disk tier throughput vs fio (block sizes x queue depths), disk vs host hit");
  disk->add_option("--dir", disk_dir, "a directory on the file system to measure")
      ->capture_default_str();
  disk->add_option("--size", disk_size, "bytes per measurement (default 1GiB, quick 32MiB)");
  disk->add_option("--io", opt.disk_io, "the tier's I/O engine: auto, io_uring or threads")
      ->check(CLI::IsMember({"auto", "io_uring", "threads"}))
      ->capture_default_str();
  std::string restart_dir = ".", restart_slots = "1M";
  auto* disk_restart = app.add_subcommand(
      "disk-restart", "disk tier restart: header scan and index rebuild vs reading the headers");
  disk_restart->add_option("--dir", restart_dir, "a directory on the file system to measure")
      ->capture_default_str();
  disk_restart
      ->add_option("--slots", restart_slots,
                   "slot counts (4 KiB of headers each on disk: 10M needs 40 GiB; quick: 8K)")
      ->capture_default_str();
  std::string shared_nodes, shared_size = "512MiB";
  auto* shared = app.add_subcommand(
      "shared",
      "shared tier put/get throughput vs valkey-benchmark (block sizes x blocks in flight), "
      "shared vs host hit (needs a cluster: scripts/valkey-cluster start; not part of all)");
  shared->add_option("--nodes", shared_nodes, "HOST:PORT[,...] of the cluster")->required();
  shared->add_option("--size", shared_size, "bytes per measurement (default 512MiB, quick 32MiB)");
  kvbench::SharedAccess shared_access;
  shared->add_option("--tls-ca", shared_access.tls_ca_file,
                     "TLS to the cluster (the tier and the baseline), verified with this CA");
  shared->add_option("--user", shared_access.user, "the ACL user (AUTH)");
  shared->add_option("--password-file", shared_access.password_file, "the user's password");
  std::string loads_dir = ".";
  auto* loads = app.add_subcommand(
      "loads", "load latency behind a flood of stores vs idle: host, simulated device, disk");
  loads->add_option("--dir", loads_dir, "where the disk tier part writes")->capture_default_str();
  kvbench::TraceOptions trace_opt;
  std::string trace_format = "mooncake";
  auto* trace = app.add_subcommand("trace",
                                   "a production trace through the real scheduler, host cache, "
                                   "disk and shared tiers: hit ratios "
                                   "against the never-evicting bound (not part of all)");
  trace->add_option("file", trace_opt.file, "the trace, JSON lines (- for standard input)")
      ->required();
  trace->add_option("--format", trace_format, "the trace's format")
      ->check(CLI::IsMember({"mooncake"}))
      ->capture_default_str();
  trace->add_option("--block-tokens", trace_opt.block_tokens, "tokens per hash id")
      ->capture_default_str();
  trace->add_option("--host-tokens", trace_opt.host_tokens, "host cache capacity in tokens")
      ->capture_default_str();
  trace->add_option("--disk-tokens", trace_opt.disk_tokens,
                    "a disk tier of this many tokens below the host cache (needs --disk)");
  trace->add_option("--disk", trace_opt.disk_dir, "the disk tier's directory");
  trace->add_option("--policy", trace_opt.policy, "lru, arc or reuse")
      ->check(CLI::IsMember({"lru", "arc", "reuse"}))
      ->capture_default_str();
  trace->add_option("--store-threshold", trace_opt.store_threshold,
                    "lookups before a block is stored (0: off)");
  trace
      ->add_option("--block-bytes", trace_opt.block_bytes,
                   "bytes moved per block (scaled down from a real model's)")
      ->capture_default_str();
  trace->add_option("--requests", trace_opt.limit, "replay only the first N requests");
  trace
      ->add_option("--model-bytes-per-token", trace_opt.model_bytes_per_token,
                   "KV bytes per token at full size (default: Llama-3-8B bf16)")
      ->capture_default_str();
  trace->add_option("--shared", trace_opt.shared_nodes,
                    "HOST:PORT[,...]: a shared tier on this Valkey cluster (needs --shared-name)");
  trace->add_option("--shared-name", trace_opt.shared_name,
                    "the fleet's name: engines that share KV give the same");
  trace->add_option("--shared-secret-file", trace_opt.shared_secret_file,
                    "the fleet secret (else $KVOFFLOAD_SHARED_SECRET)");
  trace
      ->add_option("--shared-tokens", trace_opt.shared_tokens,
                   "tokens this engine's index of the cluster's keys may name")
      ->capture_default_str();
  trace->add_option(
      "--pace", trace_opt.pace,
      "keep arrival times, sped up this many times (0.1 or more; 0: as fast as it goes)");
  trace->add_option("--start-at", trace_opt.start_at_ms,
                    "start the clock at this Unix time in ms (a fleet's processes in step)");
  trace->add_option("--origin-ms", trace_opt.origin_ms,
                    "the trace time (ms) the clock starts at (default: the first request's)");
  trace->add_flag("--latency-samples", trace_opt.latency_samples,
                  "keep every request's lookup-to-loaded time in the JSON");
  trace
      ->add_option("--hint-accuracy", trace_opt.hint_accuracy,
                   "give each request a 'conversation continues' hint (for policy reuse) drawn "
                   "from the trace's future, right with this probability (0: none)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  trace->add_option("--hint-seed", trace_opt.hint_seed, "the hints' seed")->capture_default_str();
  auto* all = app.add_subcommand("all", "every scenario");

  CLI11_PARSE(app, argc, argv);
  if (opt.quick && index_blocks == "1M,10M") index_blocks = "64K";
  if (opt.quick && pool_size == "8GiB") pool_size = "256MiB";
  if (opt.quick && restart_slots == "1M") restart_slots = "8K";  // two scan threads
  if (opt.quick && disk_size == "1GiB") disk_size = "32MiB";
  if (opt.quick && shared_size == "512MiB") shared_size = "32MiB";
  opt.copy_host_pool = copy_host == "pool";
  try {
    if (!copy_total.empty()) opt.copy_total = kvoffload::parse_bytes(copy_total, "--total");
    if (!copy_piece_max.empty()) {
      opt.copy_piece_max = kvoffload::parse_bytes(copy_piece_max, "--max-piece");
    }
  } catch (const std::exception& e) {
    std::cerr << "kvoffload-bench: " << e.what() << "\n";
    return 2;
  }

  nlohmann::json doc;
  doc["machine"] = kvbench::machine_json();
  doc["quick"] = opt.quick;
  try {
    const bool every = all->parsed();
    if (scheduler->parsed() || every)
      doc["scheduler"] = kvbench::run_scheduler(opt, every ? "all" : preset);
    if (manager->parsed() || every) doc["manager"] = kvbench::run_manager(opt);
    if (index->parsed() || every) {
      doc["index"] = kvbench::run_index(opt, index_blocks, index_hash_bytes);
    }
    if ((copy->parsed() && backend == "host") || every)
      doc["copy_host"] = kvbench::run_copy_host(opt);
    if ((copy->parsed() && backend == "cuda") || every)
      doc["copy_cuda"] = kvbench::run_copy_cuda(opt);
    if (calibrate->parsed() || every) doc["calibrate"] = kvbench::run_calibrate(opt);
    if (compact->parsed() || every) doc["compact"] = kvbench::run_compact(opt);
    if (source_order->parsed() || every) doc["source_order"] = kvbench::run_source_order(opt);
    if (pool->parsed() || every) doc["pool"] = kvbench::run_pool(opt, pool_size);
    if (e2e->parsed() || every) doc["e2e"] = kvbench::run_e2e(opt);
    if (disk->parsed() || every) doc["disk"] = kvbench::run_disk(opt, disk_dir, disk_size);
    if (disk_restart->parsed() || every) {
      doc["disk_restart"] = kvbench::run_disk_restart(opt, restart_dir, restart_slots);
    }
    if (loads->parsed() || every) doc["loads"] = kvbench::run_loads(opt, loads_dir);
    if (shared->parsed()) {
      doc["shared"] = kvbench::run_shared(opt, shared_nodes, shared_size, shared_access);
    }
    if (soak->parsed()) doc["soak"] = kvbench::run_soak(opt, soak_steps, soak_samples);
    if (trace->parsed()) doc["trace"] = kvbench::run_trace(opt, trace_opt);
  } catch (const std::exception& e) {
    std::cerr << "kvoffload-bench: " << e.what() << "\n";
    return 1;
  }
  std::cout << doc.dump(2) << "\n";
  if (!opt.json_path.empty()) {
    std::ofstream out(opt.json_path);
    out << doc.dump(2) << "\n";
    if (!out) {
      std::cerr << "kvoffload-bench: cannot write " << opt.json_path << "\n";
      return 1;
    }
  }
  return 0;
}
