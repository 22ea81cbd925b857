// metrics_text: the scheduler's and the worker's statistics in the Prometheus text format,
// read back by a strict parser of that format (families declared once and written whole,
// counters named ..._total, labels escaped), and compared with the stats they render.

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "kvoffload/error.hpp"
#include "kvoffload/metrics_text.hpp"
#include "kvoffload/scheduler.hpp"
#include "kvoffload/worker.hpp"
#include "support/scheduler_fixture.hpp"

using namespace kvoffload;
using Catch::Matchers::ContainsSubstring;

namespace {

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

/// Parses the text format strictly; any deviation fails the test with the line.
std::vector<Sample> parse(const std::string& text) {
  std::vector<Sample> out;
  std::map<std::string, std::string> types;  // family -> counter|gauge
  std::string current;                       // the family being written
  std::size_t pos = 0;
  REQUIRE((text.empty() || text.back() == '\n'));
  while (pos < text.size()) {
    const std::size_t end = text.find('\n', pos);
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    INFO("line: " << line);
    if (line.starts_with("# TYPE ")) {
      const std::string rest = line.substr(7);
      const std::size_t sp = rest.find(' ');
      REQUIRE(sp != std::string::npos);
      const std::string name = rest.substr(0, sp), type = rest.substr(sp + 1);
      REQUIRE((type == "counter" || type == "gauge"));
      REQUIRE(types.count(name) == 0);  // each family declared once
      if (type == "counter") REQUIRE(name.ends_with("_total"));
      types[name] = type;
      current = name;
      continue;
    }
    REQUIRE_FALSE(line.empty());
    Sample s;
    std::size_t i = 0;
    while (i < line.size() &&
           (std::isalnum(static_cast<unsigned char>(line[i])) || line[i] == '_')) {
      s.name += line[i++];
    }
    REQUIRE(s.name == current);  // a sample of the family just declared
    if (line[i] == '{') {
      ++i;
      while (line[i] != '}') {
        std::string key;
        while (line[i] != '=') key += line[i++];
        REQUIRE(line.substr(i, 2) == "=\"");
        i += 2;
        std::string value;
        while (line[i] != '"') {
          if (line[i] == '\\') {
            ++i;
            REQUIRE((line[i] == '\\' || line[i] == '"' || line[i] == 'n'));
            value += line[i] == 'n' ? '\n' : line[i];
          } else {
            value += line[i];
          }
          ++i;
        }
        ++i;
        REQUIRE(s.labels.count(key) == 0);
        s.labels[key] = value;
        if (line[i] == ',') ++i;
      }
      ++i;
    }
    REQUIRE(line[i] == ' ');
    std::size_t used = 0;
    s.value = std::stod(line.substr(i + 1), &used);
    REQUIRE(i + 1 + used == line.size());
    out.push_back(std::move(s));
  }
  return out;
}

double value_of(const std::vector<Sample>& samples, const std::string& name,
                const std::map<std::string, std::string>& labels = {}) {
  int found = 0;
  double v = -1;
  for (const Sample& s : samples) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [k, want] : labels)
      match = match && s.labels.count(k) && s.labels.at(k) == want;
    if (match) {
      ++found;
      v = s.value;
    }
  }
  INFO(name);
  REQUIRE(found == 1);
  return v;
}

}  // namespace

TEST_CASE("metrics_text renders the scheduler's stats and each tier's", "[metrics]") {
  SchedulerConfig c = kvtest::make_config({kvtest::full()}, 1, 8);
  TierConfig disk;
  disk.medium = Medium::disk;
  disk.blocks = 32;
  c.tiers = {disk};
  c.weights = "metrics-test";
  c.manager.block_bytes = 4096;
  kvtest::Harness h(c);
  const auto hashes = kvtest::chain_hashes("m", 4);
  REQUIRE(h.lookup("a", hashes, 64) == 0);
  h.alloc_none("a");
  const StepResult step = h.step("a", 0, 64, {kvtest::ids(1, 4)});
  REQUIRE(step.store_jobs.size() == 1);
  h.complete(step.store_jobs[0].id);
  REQUIRE(h.lookup("b", hashes, 64).value_or(0) > 0);

  const std::vector<MetricLabel> labels{{"engine", "llama \"8b\"\\n\new"}};
  const auto samples = parse(metrics_text(h.s, labels));
  const CacheStats cs = h.s.cache_stats();
  CHECK(cs.hits > 0);
  CHECK(value_of(samples, "kvoffload_hits_total") == static_cast<double>(cs.hits));
  CHECK(value_of(samples, "kvoffload_blocks_stored_total") == 4);
  CHECK(value_of(samples, "kvoffload_bytes_stored_total") == 4 * 4096);
  CHECK(value_of(samples, "kvoffload_hit_tokens_total") == static_cast<double>(cs.hit_tokens));
  CHECK(value_of(samples, "kvoffload_blocks_used") == 4);      // a gauge: no _total
  CHECK(value_of(samples, "kvoffload_blocks_capacity") == 8);  // a gauge named not ..._total
  const TierStats ts = h.s.tier_stats(0);
  CHECK(value_of(samples, "kvoffload_tier_blocks_capacity", {{"tier", "0"}, {"medium", "disk"}}) ==
        32);
  CHECK(value_of(samples, "kvoffload_tier_misses_total", {{"tier", "0"}}) ==
        static_cast<double>(ts.misses));
  for (const Sample& s : samples) {
    INFO(s.name);
    CHECK(s.labels.at("engine") == "llama \"8b\"\\n\new");  // escaped and read back
    CHECK(s.name.starts_with("kvoffload_"));
  }
  CHECK(samples.size() > 40);
}

TEST_CASE("metrics_text refuses labels that are not the caller's", "[metrics]") {
  const Scheduler s(kvtest::make_config({kvtest::full()}, 1, 8));
  CHECK(parse(metrics_text(s)).size() == 27);  // every CacheStats field, no labels
  for (const char* bad : {"", "9lives", "__name", "tier", "medium", "a-b", "é"}) {
    const std::vector<MetricLabel> labels{{bad, "x"}};
    CHECK_THROWS_WITH(metrics_text(s, labels), ContainsSubstring("metrics label"));
  }
  const std::vector<MetricLabel> twice{{"engine", "a"}, {"engine", "b"}};
  CHECK_THROWS_WITH(metrics_text(s, twice), ContainsSubstring("given twice"));
}

TEST_CASE("metrics_text renders a worker's copies", "[metrics]") {
  std::vector<std::uint8_t> gpu(8 * 256, 7);
  WorkerConfig wc;
  wc.tensors = {{reinterpret_cast<std::uintptr_t>(gpu.data()), 8, 256, 256}};
  wc.groups = {{{0, 256}}};
  wc.host_blocks = 4;
  wc.threads = 1;
  Worker w(wc);
  TransferJob job;
  job.id = 1;
  job.gpu = {{1, 2}, {2}, {0}};
  job.keys = {Key{BlockHash::from_hex("0a"), 0}, Key{BlockHash::from_hex("0b"), 0}};
  job.host_block_ids = {0, 1};
  w.submit(job);
  w.wait(std::vector<JobId>{1});
  REQUIRE(w.get_finished().size() == 1);
  const auto samples = parse(metrics_text(w));
  CHECK(value_of(samples, "kvoffload_worker_store_jobs_total") == 1);
  CHECK(value_of(samples, "kvoffload_worker_bytes_stored_total") == 512);
  CHECK(value_of(samples, "kvoffload_worker_load_jobs_total") == 0);
  CHECK(value_of(samples, "kvoffload_worker_store_seconds_total") > 0);
}
