// kvoffload-bench: measures kvoffload's parts against the limit each can approach, in one run,
// as ratios, and writes the numbers as JSON (--json FILE). Subcommands are the scenarios.

#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>

#include "bench_common.hpp"
#include "kvoffload/error.hpp"
#include "scenarios.hpp"

int main(int argc, char** argv) {
  CLI::App app{"kvoffload-bench: kvoffload's benchmarks, each side by side with its baseline"};
  kvbench::Options opt;
  app.add_flag("--quick", opt.quick, "small sizes and few runs (CI smoke test)");
  app.add_option("--runs", opt.runs, "repetitions per measurement (default per scenario)");
  app.add_option("--json", opt.json_path, "write the results to this JSON file");
  app.require_subcommand(1);

  std::string pool_size = "8GiB";
  auto* pool = app.add_subcommand("pool", "host pool allocation time: 1 thread vs all cores");
  pool->add_option("--size", pool_size, "pool size (e.g. 8GiB)");

  CLI11_PARSE(app, argc, argv);
  if (opt.quick && pool_size == "8GiB") pool_size = "512MiB";

  nlohmann::json doc;
  doc["machine"] = kvbench::machine_json();
  try {
    if (*pool) doc["pool"] = kvbench::run_pool(opt, pool_size);
  } catch (const kvoffload::error& e) {
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
