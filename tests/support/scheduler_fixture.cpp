#include "support/scheduler_fixture.hpp"
#include "kvoffload/detail/flat_hash_map.hpp"

#include <array>
#include <cstring>
#include <stdexcept>

namespace kvtest {
namespace {

// The same finalizer the library's hash tables use.
std::uint64_t mix(std::uint64_t x) {
  return kvoffload::detail::mix64(x);
}

std::uint64_t seed_of(std::string_view seed) {
  std::uint64_t h = 1469598103934665603ULL;
  for (const char c : seed) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  return h;
}

BlockHash hash_of(std::uint64_t a, std::uint64_t b) {
  std::array<std::uint8_t, 16> bytes{};
  const std::uint64_t x = mix(a), y = mix(b ^ x);
  std::memcpy(bytes.data(), &x, 8);
  std::memcpy(bytes.data() + 8, &y, 8);
  return BlockHash::from_bytes(bytes);
}

}  // namespace

std::vector<BlockHash> chain_hashes(std::string_view seed, std::size_t count) {
  return extend_hashes({}, seed, count);
}

std::vector<BlockHash> extend_hashes(std::vector<BlockHash> prefix, std::string_view seed,
                                     std::size_t count) {
  const std::uint64_t s = seed_of(seed);
  for (std::size_t i = prefix.size(); i < count; ++i) {
    std::uint64_t parent = 0;
    if (!prefix.empty()) std::memcpy(&parent, prefix.back().data(), 8);
    prefix.push_back(hash_of(parent ^ s, i + 1));
  }
  return prefix;
}

GroupConfig full(std::int64_t gpu_block_size) {
  return GroupConfig{GroupKind::full_attention, gpu_block_size, 0};
}
GroupConfig window(std::int64_t sliding_window, std::int64_t gpu_block_size) {
  return GroupConfig{GroupKind::sliding_window, gpu_block_size, sliding_window};
}
GroupConfig mamba(std::int64_t gpu_block_size) {
  return GroupConfig{GroupKind::mamba, gpu_block_size, 0};
}

SchedulerConfig make_config(std::vector<GroupConfig> groups, std::int64_t f,
                            std::int64_t host_blocks, std::int64_t hash_block_size,
                            std::int64_t num_workers) {
  SchedulerConfig c;
  c.groups = std::move(groups);
  c.block_size_factor = f;
  c.hash_block_size = hash_block_size;
  c.num_workers = num_workers;
  c.manager.host_blocks = host_blocks;
  return c;
}

std::vector<GpuBlockId> ids(GpuBlockId first, std::int64_t count, std::int64_t nulls) {
  std::vector<GpuBlockId> out(static_cast<std::size_t>(nulls), null_block);
  for (std::int64_t i = 0; i < count; ++i) out.push_back(first + static_cast<GpuBlockId>(i));
  return out;
}

nlohmann::json to_json(const StepResult& step) {
  auto job_json = [](const TransferJob& j) {
    nlohmann::json keys = nlohmann::json::array();
    for (const Key& k : j.keys) keys.push_back({k.hash.to_hex(), k.group});
    return nlohmann::json{{"job", j.id},
                          {"req", j.request_id},
                          {"keys", keys},
                          {"gpu",
                           {{"block_ids", j.gpu.block_ids},
                            {"group_sizes", j.gpu.group_sizes},
                            {"block_indices", j.gpu.block_indices}}},
                          {"host", j.host_block_ids}};
  };
  nlohmann::json loads = nlohmann::json::array(), stores = nlohmann::json::array();
  for (const auto& j : step.load_jobs) loads.push_back(job_json(j));
  for (const auto& j : step.store_jobs) stores.push_back(job_json(j));
  return {{"load_jobs", loads}, {"store_jobs", stores}, {"flush", step.flush}};
}

nlohmann::json to_json(const std::vector<ManagerEvent>& events) {
  nlohmann::json out = nlohmann::json::array();
  for (const ManagerEvent& e : events) {
    nlohmann::json keys = nlohmann::json::array();
    for (const Key& k : e.keys) keys.push_back({k.hash.to_hex(), k.group});
    out.push_back({{"removed", e.removed}, {"keys", keys}});
  }
  return out;
}

std::optional<std::int64_t> Harness::lookup(const std::string& req,
                                            const std::vector<BlockHash>& hashes,
                                            std::int64_t num_tokens, std::int64_t computed) {
  s.update_request(req, num_tokens, hashes);
  return s.lookup(req, computed);
}

void Harness::alloc_none(const std::string& req) {
  std::vector<AllocatedGroup> groups(s.layouts().size());
  s.on_allocated(req, groups, 0);
}

StepResult Harness::step(const std::string& req, std::int64_t computed, std::int64_t scheduled,
                         std::vector<std::vector<GpuBlockId>> new_ids, bool resumed) {
  std::vector<ScheduledRequest> entries(1);
  entries[0].request_id = req;
  entries[0].num_computed_tokens = computed;
  entries[0].num_scheduled_tokens = scheduled;
  entries[0].new_block_ids = std::move(new_ids);
  entries[0].resumed = resumed;
  return s.build_step(entries);
}

std::vector<CompletedJob> Harness::complete(JobId job, bool ok) {
  std::vector<JobReport> reports;
  for (std::int64_t w = 0; w < s.config().num_workers; ++w) reports.push_back({job, 1, ok});
  return s.on_completed(reports);
}

JobId Harness::place(const std::vector<BlockHash>& hashes, std::size_t group, std::size_t index,
                     bool ready) {
  const GroupLayout& layout = s.layouts().at(group);
  if (s.config().block_size_factor != 1) {
    throw std::logic_error("Harness::place needs block_size_factor 1");
  }
  const std::string req = "donor" + std::to_string(donors++);
  const auto blocks = static_cast<std::ptrdiff_t>(index + 1);
  const std::vector<BlockHash> prefix(hashes.begin(), hashes.begin() + blocks * layout.hash_factor);
  const std::int64_t tokens = blocks * layout.offloaded_block_size;
  s.update_request(req, tokens, prefix);
  (void)s.lookup(req, tokens);  // nothing to load: everything is "computed"
  std::vector<std::vector<GpuBlockId>> new_ids;
  for (std::size_t g = 0; g < s.layouts().size(); ++g) {
    const std::int64_t n = tokens / s.layouts()[g].gpu_block_size;
    std::vector<GpuBlockId> v(static_cast<std::size_t>(n), null_block);
    if (g == group) v.back() = next_gpu_id++;
    new_ids.push_back(std::move(v));
  }
  const StepResult r = step(req, 0, tokens, new_ids);
  if (r.store_jobs.size() != 1 || r.store_jobs[0].keys.size() != 1) {
    throw std::logic_error("Harness::place: the donor did not store exactly one key");
  }
  const JobId job = r.store_jobs[0].id;
  if (ready) complete(job);
  s.on_finished(req);
  return job;
}

}  // namespace kvtest
