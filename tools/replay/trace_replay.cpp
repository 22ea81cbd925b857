#include "replay/trace_replay.hpp"

#include <algorithm>
#include <cstdint>
#include <istream>
#include <limits>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvoffload/detail/config_fields.hpp"
#include "kvoffload/detail/stats_fields.hpp"
#include "kvoffload/error.hpp"
#include "kvoffload/scheduler.hpp"

namespace kvoffload::replay {
namespace {

/// A tier index from a trace; a negative one is the library's to reject like any unknown tier.
std::size_t tier_of(std::int64_t tier) {
  if (tier < 0)
    throw kvoffload::invalid_argument("tier " + std::to_string(tier) + " is not configured");
  return static_cast<std::size_t>(tier);
}

using json = nlohmann::json;
using ordered = nlohmann::ordered_json;

/// A malformed line: exit status 2.
struct FormatError {
  std::string message;
};

[[noreturn]] void fail(std::string message) {
  throw FormatError{std::move(message)};
}

const json& field(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end()) fail(std::string("missing field \"") + name + "\"");
  return *it;
}

std::int64_t as_int(const json& v, const std::string& what) {
  if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<std::int64_t>();
  if (v.is_number_unsigned() &&
      v.get<std::uint64_t>() <=
          static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return static_cast<std::int64_t>(v.get<std::uint64_t>());
  }
  fail(what + " must be an integer");
}

std::int64_t get_int(const json& obj, const char* name) {
  return as_int(field(obj, name), std::string("field \"") + name + "\"");
}

std::int64_t get_int_or(const json& obj, const char* name, std::int64_t fallback) {
  return obj.contains(name) ? get_int(obj, name) : fallback;
}

bool get_bool_or(const json& obj, const char* name, bool fallback) {
  auto it = obj.find(name);
  if (it == obj.end()) return fallback;
  if (!it->is_boolean()) fail(std::string("field \"") + name + "\" must be a boolean");
  return it->get<bool>();
}

std::string get_string(const json& obj, const char* name) {
  const json& v = field(obj, name);
  if (!v.is_string()) fail(std::string("field \"") + name + "\" must be a string");
  return v.get<std::string>();
}

const json& get_array(const json& obj, const char* name) {
  const json& v = field(obj, name);
  if (!v.is_array()) fail(std::string("field \"") + name + "\" must be an array");
  return v;
}

const json& get_object(const json& v, const std::string& what) {
  if (!v.is_object()) fail(what + " must be an object");
  return v;
}

std::vector<GpuBlockId> get_block_ids(const json& arr, const std::string& what) {
  if (!arr.is_array()) fail(what + " must be an array of block ids");
  std::vector<GpuBlockId> ids;
  ids.reserve(arr.size());
  for (const json& v : arr) {
    const std::int64_t id = as_int(v, what + " entries");
    if (id < std::numeric_limits<GpuBlockId>::min() ||
        id > std::numeric_limits<GpuBlockId>::max()) {
      fail(what + " entries must be 32-bit integers");
    }
    ids.push_back(static_cast<GpuBlockId>(id));
  }
  return ids;
}

std::vector<BlockHash> get_hashes(const json& obj) {
  const json& arr = get_array(obj, "block_hashes");
  std::vector<BlockHash> hashes;
  hashes.reserve(arr.size());
  for (std::size_t i = 0; i < arr.size(); ++i) {
    const json& v = arr[i];
    const std::string what = "block_hashes[" + std::to_string(i) + "]";
    if (!v.is_string()) fail(what + " must be a hex string");
    const auto& hex = v.get_ref<const std::string&>();
    bool lower_hex = hex.size() >= 2 && hex.size() <= 64 && hex.size() % 2 == 0;
    for (const char c : hex)
      lower_hex = lower_hex && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
    if (!lower_hex) fail(what + " must be 2 to 64 lowercase hex digits, an even count");
    hashes.push_back(BlockHash::from_hex(hex));
  }
  return hashes;
}

ordered key_json(const Key& key) {
  return ordered::array({key.hash.to_hex(), key.group});
}

ordered job_json(const TransferJob& job) {
  ordered keys = ordered::array();
  for (const Key& k : job.keys) keys.push_back(key_json(k));
  ordered j;
  j["job"] = job.id;
  j["req"] = job.request_id;
  j["keys"] = std::move(keys);
  j["gpu"] = ordered{{"block_ids", job.gpu.block_ids},
                     {"group_sizes", job.gpu.group_sizes},
                     {"block_indices", job.gpu.block_indices}};
  j["host"] = ordered{{"block_ids", job.host_block_ids}};
  return j;
}

// The medium is the scheduler's tier's (a job does not carry it: the worker knows its tiers).
ordered tier_job_json(const TierJob& job, const SchedulerConfig& config) {
  ordered keys = ordered::array();
  for (const Key& k : job.keys) keys.push_back(key_json(k));
  ordered j;
  j["job"] = job.id;
  j["kind"] = std::string(to_string(job.kind));
  j["tier"] = job.tier;
  j["medium"] = std::string(to_string(config.tiers.at(job.tier).medium));
  j["req"] = job.request_id;
  j["keys"] = std::move(keys);
  j["host"] = ordered{{"block_ids", job.host_block_ids}};
  j["slots"] = job.slots;
  return j;
}

Key parse_key(const json& v, const std::string& what) {
  if (!v.is_array() || v.size() != 2 || !v[0].is_string()) {
    fail(what + " must be a key [\"<hash hex>\", group]");
  }
  const auto& hex = v[0].get_ref<const std::string&>();
  bool lower_hex = hex.size() >= 2 && hex.size() <= 64 && hex.size() % 2 == 0;
  for (const char c : hex)
    lower_hex = lower_hex && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
  if (!lower_hex) fail(what + ": the hash must be 2 to 64 lowercase hex digits, an even count");
  const std::int64_t group = as_int(v[1], what + ": the group");
  if (group < 0 || group > 63) fail(what + ": the group must be 0 to 63");
  return Key{BlockHash::from_hex(hex), static_cast<std::uint32_t>(group)};
}

// An optional field of a trace's config, by the name config_fields.hpp lists: absent, the
// C++ struct's default stays.
void read_field(const json& obj, const char* name, std::int64_t& out, const std::string&) {
  out = get_int_or(obj, name, out);
}
void read_field(const json& obj, const char* name, bool& out, const std::string&) {
  out = get_bool_or(obj, name, out);
}
void read_field(const json& obj, const char* name, std::string& out, const std::string&) {
  if (obj.contains(name)) out = get_string(obj, name);
}
void read_field(const json& obj, const char* name, Medium& out, const std::string& what) {
  if (obj.contains(name)) out = parse_medium(get_string(obj, name), what + "." + name);
}
void read_field(const json& obj, const char* name, EvictionPolicyKind& out,
                const std::string& what) {
  if (obj.contains(name)) out = parse_eviction_policy(get_string(obj, name), what + "." + name);
}

SchedulerConfig parse_config(const json& line) {
  SchedulerConfig config;
  const json& groups = get_array(line, "groups");
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string what = "groups[" + std::to_string(g) + "]";
    const json& obj = get_object(groups[g], what);
    GroupConfig group;
    group.kind = parse_group_kind(get_string(obj, "kind"), what + ".kind");
    group.gpu_block_size = get_int(obj, "gpu_block_size");
    group.sliding_window = get_int_or(obj, "sliding_window", 0);
    config.groups.push_back(group);
  }
  // Required (trace-format.md), then every other listed field if the trace gives it.
  config.block_size_factor = get_int(line, "block_size_factor");
  config.hash_block_size = get_int(line, "hash_block_size");
  config.manager.host_blocks = get_int(line, "host_blocks");
#define KVOFFLOAD_READ(name) read_field(line, #name, config.name, "config");
  KVOFFLOAD_SCHEDULER_CONFIG_FIELDS(KVOFFLOAD_READ)
#undef KVOFFLOAD_READ
#define KVOFFLOAD_READ(name) read_field(line, #name, config.manager.name, "config");
  KVOFFLOAD_MANAGER_CONFIG_FIELDS(KVOFFLOAD_READ)
#undef KVOFFLOAD_READ
  if (line.contains("tiers")) {
    const json& tiers = get_array(line, "tiers");
    for (std::size_t t = 0; t < tiers.size(); ++t) {
      const std::string what = "tiers[" + std::to_string(t) + "]";
      const json& obj = get_object(tiers[t], what);
      TierConfig tier;
      tier.blocks = get_int(obj, "blocks");
#define KVOFFLOAD_READ(name) read_field(obj, #name, tier.name, what);
      KVOFFLOAD_TIER_CONFIG_FIELDS(KVOFFLOAD_READ)
#undef KVOFFLOAD_READ
      config.tiers.push_back(tier);
    }
  }
  return config;
}

class Replayer {
 public:
  Replayer(std::ostream& out, std::ostream& err) : out_(out), err_(err) {}

  void print_stats() const {
    if (!scheduler_) return;
    const CacheStats s = scheduler_->cache_stats();
    const ManagerStats& ms = scheduler_->manager().stats();
    err_ << "kvoffload-replay: " << s.lookups << " lookups (" << s.hit_tokens << " tokens hit, "
         << s.deferrals << " deferred), " << s.load_jobs << " load jobs, " << s.store_jobs
         << " store jobs (" << s.failed_stores << " failed, " << s.stores_without_room
         << " skipped for room)\n"
         << "kvoffload-replay: host cache " << s.blocks_used << "/" << s.blocks_total
         << " blocks used, " << s.blocks_stored << " blocks stored, " << s.blocks_loaded
         << " loaded, " << s.evictions << " evicted; key lookups " << s.hits << " hit, " << s.misses
         << " miss, " << ms.pending << " pending\n";
  }

  int run(std::istream& in) {
    std::string text;
    std::int64_t line_no = 0;
    while (std::getline(in, text)) {
      ++line_no;
      if (!text.empty() && text.back() == '\r') text.pop_back();
      try {
        const int status = line(text, line_no);
        if (status != 0) return status;
      } catch (const FormatError& e) {
        err_ << "kvoffload-replay: line " << line_no << ": " << e.message << "\n";
        return 2;
      }
    }
    if (line_no == 0) {
      err_ << "kvoffload-replay: line 1: the trace is empty (it must start with a config op)\n";
      return 2;
    }
    return 0;
  }

 private:
  int line(const std::string& text, std::int64_t line_no) {
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded()) fail("not valid JSON");
    if (!j.is_object()) fail("not a JSON object");
    const std::string op = get_string(j, "op");
    if (op == "config") {
      if (scheduler_) fail("a second config op");
      // Field types are checked before anything runs; values (an unknown group kind, a
      // factor of 0) are the library's to reject.
      return guarded(line_no, [&] { scheduler_.emplace(parse_config(j)); });
    }
    static const char* const known[] = {"request",  "lookup",     "alloc",       "step",
                                        "complete", "finish",     "reset_cache", "events",
                                        "stats",    "tier_stats", "tier_restore"};
    if (std::find(std::begin(known), std::end(known), op) == std::end(known)) {
      fail("unknown op \"" + op + "\"");
    }
    if (!scheduler_) fail("the first op must be config, got \"" + op + "\"");
    Scheduler& s = *scheduler_;

    if (op == "request") {
      const std::string req = get_string(j, "req");
      const std::int64_t num_tokens = get_int(j, "num_tokens");
      const std::vector<BlockHash> hashes = get_hashes(j);
      const bool remote_decode = get_bool_or(j, "remote_decode", false);
      return guarded(line_no, [&] { s.update_request(req, num_tokens, hashes, remote_decode); });
    }
    if (op == "lookup") {
      const std::string req = get_string(j, "req");
      const std::int64_t computed = get_int(j, "num_computed_tokens");
      return guarded(line_no, [&] {
        const std::optional<std::int64_t> hit = s.lookup(req, computed);
        ordered o;
        o["op"] = "lookup";
        o["req"] = req;
        o["hit_tokens"] = hit ? ordered(*hit) : ordered(nullptr);
        out_ << o.dump() << "\n";
      });
    }
    if (op == "alloc") {
      const std::string req = get_string(j, "req");
      const std::int64_t external = get_int(j, "num_external_tokens");
      const json& arr = get_array(j, "groups");
      std::vector<AllocatedGroup> groups;
      for (std::size_t g = 0; g < arr.size(); ++g) {
        const std::string what = "groups[" + std::to_string(g) + "]";
        const json& obj = get_object(arr[g], what);
        AllocatedGroup group;
        group.block_ids = get_block_ids(field(obj, "block_ids"), what + ".block_ids");
        group.num_computed_blocks = get_int(obj, "num_computed_blocks");
        groups.push_back(std::move(group));
      }
      return guarded(line_no, [&] { s.on_allocated(req, groups, external); });
    }
    if (op == "step") {
      std::vector<ScheduledRequest> scheduled;
      const json& arr = get_array(j, "requests");
      for (std::size_t i = 0; i < arr.size(); ++i) {
        const std::string what = "requests[" + std::to_string(i) + "]";
        const json& obj = get_object(arr[i], what);
        ScheduledRequest e;
        e.request_id = get_string(obj, "req");
        e.num_computed_tokens = get_int(obj, "num_computed_tokens");
        e.num_scheduled_tokens = get_int(obj, "num_scheduled_tokens");
        const json& groups = get_array(obj, "new_block_ids");
        for (std::size_t g = 0; g < groups.size(); ++g) {
          e.new_block_ids.push_back(
              get_block_ids(groups[g], what + ".new_block_ids[" + std::to_string(g) + "]"));
        }
        e.resumed = get_bool_or(obj, "resumed", false);
        scheduled.push_back(std::move(e));
      }
      std::vector<std::string> preempted;
      if (j.contains("preempted")) {
        for (const json& v : get_array(j, "preempted")) {
          if (!v.is_string()) fail("field \"preempted\" must be an array of request ids");
          preempted.push_back(v.get<std::string>());
        }
      }
      return guarded(line_no, [&] {
        const StepResult r = s.build_step(scheduled, preempted);
        ordered loads = ordered::array();
        for (const TransferJob& job : r.load_jobs) loads.push_back(job_json(job));
        ordered stores = ordered::array();
        for (const TransferJob& job : r.store_jobs) stores.push_back(job_json(job));
        ordered o;
        o["op"] = "step";
        o["load_jobs"] = std::move(loads);
        o["store_jobs"] = std::move(stores);
        o["flush"] = r.flush;
        if (!s.config().tiers.empty()) {
          ordered tier_jobs = ordered::array();
          for (const TierJob& job : r.tier_jobs)
            tier_jobs.push_back(tier_job_json(job, s.config()));
          o["tier_jobs"] = std::move(tier_jobs);
        }
        out_ << o.dump() << "\n";
      });
    }
    if (op == "complete") {
      std::vector<JobReport> reports;
      for (const json& v : get_array(j, "jobs")) {
        const json& obj = get_object(v, "each entry of \"jobs\"");
        JobReport report;
        report.job = get_int(obj, "job");
        report.count = get_int_or(obj, "count", 1);
        report.ok = get_bool_or(obj, "ok", true);
        reports.push_back(report);
      }
      return guarded(line_no, [&] { (void)s.on_completed(reports); });
    }
    if (op == "finish") {
      const std::string req = get_string(j, "req");
      return guarded(line_no, [&] { s.on_finished(req); });
    }
    if (op == "reset_cache") {
      if (!j.contains("weights")) return guarded(line_no, [&] { s.reset_cache(); });
      const std::string weights = get_string(j, "weights");
      return guarded(line_no, [&] { s.reset_cache(weights); });
    }
    if (op == "stats") {
      return guarded(line_no, [&] {
        const CacheStats c = s.cache_stats();
        ordered o;
        o["op"] = "stats";
#define KVOFFLOAD_JSON_FIELD(name) o[#name] = c.name;
        KVOFFLOAD_CACHE_STATS_FIELDS(KVOFFLOAD_JSON_FIELD)
#undef KVOFFLOAD_JSON_FIELD
        out_ << o.dump() << "\n";
      });
    }
    if (op == "tier_stats") {
      const std::int64_t tier = get_int(j, "tier");
      return guarded(line_no, [&] {
        const TierStats t = s.tier_stats(tier_of(tier));
        ordered o;
        o["op"] = "tier_stats";
        o["tier"] = tier;
#define KVOFFLOAD_JSON_FIELD(name) o[#name] = t.name;
        KVOFFLOAD_TIER_STATS_FIELDS(KVOFFLOAD_JSON_FIELD)
#undef KVOFFLOAD_JSON_FIELD
        out_ << o.dump() << "\n";
      });
    }
    if (op == "tier_restore") {
      const std::int64_t tier = get_int(j, "tier");
      const json& arr = get_array(j, "slots");
      std::vector<std::optional<Key>> slots;
      for (std::size_t i = 0; i < arr.size(); ++i) {
        if (arr[i].is_null()) {
          slots.emplace_back();
        } else {
          slots.emplace_back(parse_key(arr[i], "slots[" + std::to_string(i) + "]"));
        }
      }
      return guarded(line_no, [&] { (void)s.restore_tier(tier_of(tier), slots); });
    }
    // events
    return guarded(line_no, [&] {
      ordered events = ordered::array();
      for (const ManagerEvent& e : s.take_events()) {
        ordered keys = ordered::array();
        for (const Key& k : e.keys) keys.push_back(key_json(k));
        ordered ev;
        ev["removed"] = e.removed;
        ev["keys"] = std::move(keys);
        if (!s.config().tiers.empty()) ev["medium"] = std::string(to_string(e.medium));
        events.push_back(std::move(ev));
      }
      ordered o;
      o["op"] = "events";
      o["events"] = std::move(events);
      out_ << o.dump() << "\n";
    });
  }

  /// Runs a library call; a rejection becomes an error line and exit status 1.
  template <class F>
  int guarded(std::int64_t line_no, F&& f) {
    try {
      f();
      return 0;
    } catch (const kvoffload::error& e) {
      ordered o;
      o["op"] = "error";
      o["line"] = line_no;
      o["message"] = e.what();
      out_ << o.dump() << "\n";
      return 1;
    }
  }

  std::ostream& out_;
  std::ostream& err_;
  std::optional<Scheduler> scheduler_;
};

}  // namespace

int run(std::istream& in, std::ostream& out, std::ostream& err, bool stats) {
  Replayer replayer(out, err);
  const int status = replayer.run(in);
  out.flush();
  if (stats) replayer.print_stats();
  return status;
}

}  // namespace kvoffload::replay
