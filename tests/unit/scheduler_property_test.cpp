// Property test: a simulated engine drives the scheduler over random hybrid configurations
// (1-4 groups, factors 1-16, small host pools that force eviction, several workers, random
// failures, preemptions, GPU block reuse, reset_cache) and checks after every step:
//  - every job satisfies the SEMANTICS 6 invariants (check_job_invariants);
//  - job keys and host blocks agree with the manager (stores writing, loads ready and read);
//  - a key is a hit exactly when a store of it succeeded and it was not evicted since;
//  - a GPU block reused while a store still reads it has that store in the flush set;
//  - the data every load brings back equals what the request would have computed (the
//    simulator copies labels GPU -> host -> GPU exactly as a worker would).
// The seed is printed; KVOFFLOAD_TEST_SEED=N replays one.

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include <catch2/catch_test_macros.hpp>

#include "kvoffload/detail/flat_hash_map.hpp"
#include "support/scheduler_fixture.hpp"

using namespace kvtest;

namespace {

constexpr std::uint64_t kPartial = 0x8000000000000000ULL;
constexpr std::uint64_t kUnwritten = 0xffffffffffffffffULL;

// The same finalizer the library's hash tables use.
std::uint64_t mix(std::uint64_t x) {
  return kvoffload::detail::mix64(x);
}

struct KeyLess {
  bool operator()(const Key& a, const Key& b) const {
    if (a.group != b.group) return a.group < b.group;
    return std::lexicographical_compare(a.hash.data(), a.hash.data() + a.hash.size(), b.hash.data(),
                                        b.hash.data() + b.hash.size());
  }
};

enum class Phase { waiting, loading, running, done };

struct SimRequest {
  std::string id;
  std::uint64_t uid = 0;
  std::vector<BlockHash> hashes;  // for the whole final length
  std::int64_t prompt = 0, max_len = 0, num_tokens = 0, computed = 0;
  std::size_t hashes_sent = 0;
  Phase phase = Phase::waiting;
  std::vector<std::vector<GpuBlockId>> table;
  std::vector<std::size_t> sent;
  bool resumed = false;
  bool ever_ran = false;
  bool registered = false;
  // Blocks of a local prefix-cache hit: the sim gives them their data when the request is
  // first scheduled (they reach the scheduler, and its fence, with that step).
  std::vector<std::pair<GpuBlockId, std::uint64_t>> local_data;
  std::int64_t cached = 0;  // after a load
  JobId load = -1;
};

struct SimJob {
  TransferJob job;
  bool executed = false;
  std::int64_t reports_left = 0;
};

class Simulation {
 public:
  Simulation(std::uint64_t seed, std::int64_t steps, std::string policy)
      : rng_(seed), steps_(steps) {
    random_config();
    config_.manager.policy = parse_eviction_policy(policy, "policy");
    s_.emplace(config_);
    f_ = config_.block_size_factor;
    for (GpuBlockId id = 20000; id >= 1; --id) free_ids_.push_back(id);
  }

  void run() {
    for (std::int64_t t = 0; t < steps_; ++t) step(t);
  }

  std::string describe() const {
    std::string d = "groups:";
    for (const auto& g : config_.groups) {
      d += " " + std::string(to_string(g.kind)) + "/" + std::to_string(g.gpu_block_size);
      if (g.sliding_window) d += "/w" + std::to_string(g.sliding_window);
    }
    return d + " f=" + std::to_string(config_.block_size_factor) +
           " host_blocks=" + std::to_string(config_.manager.host_blocks) +
           " workers=" + std::to_string(config_.num_workers) +
           " prefix_caching=" + std::to_string(config_.prefix_caching) +
           " policy=" + std::string(to_string(config_.manager.policy)) +
           " store_threshold=" + std::to_string(config_.manager.store_threshold);
  }

  std::int64_t loads_verified = 0, stores_done = 0, hits = 0, flush_checks = 0, unwritten_reads = 0;

 private:
  std::int64_t rand(std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng_);
  }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

  void random_config() {
    const auto G = rand(1, 4);
    config_.hash_block_size = 16;
    config_.block_size_factor = chance(0.3) ? 1 : rand(1, 16);
    for (std::int64_t g = 0; g < G; ++g) {
      GroupConfig gc;
      const auto k = rand(0, 2);
      gc.kind = k == 0 ? GroupKind::full_attention
                       : (k == 1 ? GroupKind::sliding_window : GroupKind::mamba);
      gc.gpu_block_size = chance(0.7) ? 16 : 32;
      if (gc.kind == GroupKind::sliding_window) gc.sliding_window = rand(1, 4) * 16 * rand(1, 8);
      config_.groups.push_back(gc);
      max_obs_ = std::max(max_obs_, gc.gpu_block_size * config_.block_size_factor);
    }
    config_.num_workers = rand(1, 3);
    config_.prefix_caching = chance(0.7);
    config_.manager.host_blocks = rand(4, 48) * G;
    if (chance(0.2)) config_.manager.store_threshold = 2;
  }

  std::uint64_t label(const SimRequest& r, std::size_t g, std::int64_t k) const {
    const std::int64_t gbs = config_.groups[g].gpu_block_size;
    const std::int64_t h = config_.hash_block_size;
    const auto idx = static_cast<std::size_t>((k + 1) * gbs / h - 1);
    std::uint64_t fp = 0;
    std::memcpy(&fp, r.hashes[idx].data(), 8);
    return mix(fp ^ (g + 1) * 0x9e3779b97f4a7c15ULL) & ~kPartial;
  }

  // ---- engine actions --------------------------------------------------------------------

  void admit() {
    const int families = 3;
    SimRequest r;
    r.id = "r" + std::to_string(next_req_++);
    r.uid = static_cast<std::uint64_t>(next_req_);
    r.prompt = rand(1, 5) * max_obs_ + rand(0, max_obs_);
    r.max_len = r.prompt + rand(0, 2 * max_obs_);
    r.num_tokens = r.prompt;
    // Hashes: a family's shared prefix, then this request's own blocks.
    const auto family = "family" + std::to_string(rand(0, families - 1));
    const auto n_hashes = static_cast<std::size_t>(r.max_len / config_.hash_block_size + 1);
    const auto shared = static_cast<std::size_t>(rand(0, static_cast<std::int64_t>(n_hashes)));
    r.hashes = extend_hashes(chain_hashes(family, shared), r.id, n_hashes);
    r.table.resize(config_.groups.size());
    r.sent.assign(config_.groups.size(), 0);
    waiting_.push_back(r.id);
    requests_.emplace(r.id, std::move(r));
  }

  void send_hashes(SimRequest& r) {
    const auto want = static_cast<std::size_t>(r.num_tokens / config_.hash_block_size);
    if (!r.registered) {
      s_->update_request(r.id, r.num_tokens, std::span(r.hashes).first(want));
      r.registered = true;
    } else {
      s_->extend_request(r.id, r.num_tokens,
                         std::span(r.hashes).subspan(r.hashes_sent, want - r.hashes_sent));
    }
    r.hashes_sent = want;
  }

  GpuBlockId alloc_block() {
    REQUIRE(!free_ids_.empty());
    const GpuBlockId id = free_ids_.back();
    free_ids_.pop_back();
    return id;
  }

  void free_blocks(SimRequest& r) {
    for (auto& t : r.table) {
      for (GpuBlockId id : t) {
        if (id != null_block) free_ids_.push_back(id);
      }
      t.clear();
    }
  }

  /// Lookup + allocation for a waiting request. Returns true if it runs this step.
  bool try_start(SimRequest& r) {
    if (!r.registered) send_hashes(r);
    const std::int64_t gbs_max = 32;
    std::int64_t nct = 0;
    if (chance(0.2)) nct = rand(0, r.prompt / gbs_max) * gbs_max;  // local prefix-cache hit
    nct = std::min(nct, r.num_tokens - 1);
    nct -= nct % gbs_max;
    const auto hit = s_->lookup(r.id, nct);
    if (!hit) return false;
    std::int64_t h = *hit;
    if (h > 0) ++hits;
    const std::int64_t cached = nct + h;
    std::vector<AllocatedGroup> groups(config_.groups.size());
    const auto layouts = s_->layouts();
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const GroupLayout& L = layouts[g];
      const std::int64_t n_gpu = (cached + L.gpu_block_size - 1) / L.gpu_block_size;
      const std::int64_t n_off = (cached + L.offloaded_block_size - 1) / L.offloaded_block_size;
      std::int64_t local = nct / L.gpu_block_size;
      if (h > 0 && L.windowed()) local = std::max(local, (n_off - L.window_blocks) * f_);
      local = std::min(local, n_gpu);
      r.table[g].clear();
      for (std::int64_t k = 0; k < n_gpu; ++k) {
        // Blocks before the window are null; locally computed ones get their data once the
        // step's flushed stores have run (the block may be a reused one).
        const bool null = h > 0 && L.windowed() && k < local;
        r.table[g].push_back(null ? null_block : alloc_block());
        if (!null && k < nct / L.gpu_block_size) {
          r.local_data.emplace_back(r.table[g].back(), label(r, g, k));
        }
      }
      groups[g].block_ids = r.table[g];
      groups[g].num_computed_blocks = h > 0 ? local : 0;
    }
    s_->on_allocated(r.id, groups, h);
    r.sent.assign(groups.size(), 0);
    r.computed = nct;
    if (h > 0) {  // a load job is planned: every group has a block to load
      r.phase = Phase::loading;
      r.cached = cached;
      return false;
    }
    r.phase = Phase::running;
    return true;
  }

  void restart(SimRequest& r) {
    // Everything known so far is recomputed (vLLM's preemption by recompute).
    r.prompt = std::max(r.prompt, r.num_tokens - 1);
    free_blocks(r);
    r.local_data.clear();
    r.phase = Phase::waiting;
    r.computed = 0;
    r.resumed = true;
    r.load = -1;
    waiting_.push_back(r.id);
  }

  // ---- the step ------------------------------------------------------------------------

  void step(std::int64_t t) {
    if (chance(0.3) || running_.empty()) {
      if (requests_.size() < 40) admit();
    }
    // Start waiting requests (lookup + alloc) while there is room.
    std::vector<std::string> start_now;
    for (std::size_t n = waiting_.size();
         n > 0 && running_.size() + loading_.size() + start_now.size() < 6; --n) {
      const std::string id = waiting_.front();
      waiting_.pop_front();
      SimRequest& r = requests_.at(id);
      if (try_start(r)) {
        start_now.push_back(id);
      } else if (r.phase == Phase::waiting) {
        waiting_.push_back(id);
      } else {
        loading_.insert(id);
      }
    }
    running_.insert(running_.end(), start_now.begin(), start_now.end());

    // Preempt one running request now and then.
    std::vector<std::string> preempted;
    if (!running_.empty() && chance(0.02)) {
      const auto i =
          static_cast<std::size_t>(rand(0, static_cast<std::int64_t>(running_.size()) - 1));
      preempted.push_back(running_[i]);
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
    }

    // Schedule every running request.
    std::vector<ScheduledRequest> entries;
    const auto layouts = s_->layouts();
    for (const std::string& id : running_) {
      SimRequest& r = requests_.at(id);
      const std::int64_t left = r.prompt - r.computed;
      const std::int64_t nst = left > 0 ? std::min(left, rand(1, 2 * max_obs_)) : 1;
      ScheduledRequest e;
      e.request_id = id;
      e.num_computed_tokens = r.computed;
      e.num_scheduled_tokens = nst;
      e.resumed = r.resumed;
      for (std::size_t g = 0; g < layouts.size(); ++g) {
        const std::int64_t gbs = layouts[g].gpu_block_size;
        const auto need = static_cast<std::size_t>((r.computed + nst + gbs - 1) / gbs);
        while (r.table[g].size() < need) r.table[g].push_back(alloc_block());
        e.new_block_ids.emplace_back(r.table[g].begin() + static_cast<std::ptrdiff_t>(r.sent[g]),
                                     r.table[g].end());
        r.sent[g] = r.table[g].size();
      }
      r.resumed = false;
      r.ever_ran = true;
      entries.push_back(std::move(e));
    }

    if (chance(0.002)) {
      // reset_cache emits no per-key events: the engine that resets knows the cache is empty.
      apply_events();
      s_->reset_cache();
      model_.clear();
      reset_pending_ = true;
    }
    const StepResult out = s_->build_step(entries, preempted);
    check_step(out, blocks_written_this_step(entries, out));

    // The worker: flushed jobs run to completion before anything else, and every worker
    // reports them with this step's output (stale ones after reset_cache included).
    std::vector<JobReport> flushed;
    for (const JobId id : out.flush) {
      auto it = jobs_.find(id);
      if (it == jobs_.end()) continue;
      if (!it->second.executed) execute(it->second);
      if (it->second.reports_left > 0)
        flushed.push_back({id, it->second.reports_left, !chance(0.03)});
      it->second.reports_left = 0;
    }
    if (!flushed.empty()) handle_completions(s_->on_completed(flushed));
    if (reset_pending_) {
      // Jobs issued before reset_cache are stale: they ran (flushed) and their reports are
      // ignored; requests waiting for a load start over.
      for (auto& [id, job] : jobs_) REQUIRE(job.executed);
      jobs_.clear();
      for (const std::string& id : std::vector<std::string>(loading_.begin(), loading_.end())) {
        restart(requests_.at(id));
      }
      loading_.clear();
      reset_pending_ = false;
    }
    for (const std::string& id : preempted) restart(requests_.at(id));
    for (const ScheduledRequest& e : entries) {
      SimRequest& r = requests_.at(e.request_id);
      for (const auto& [id, value] : r.local_data) gpu_[id] = value;
      r.local_data.clear();
    }
    for (const TransferJob& job : out.load_jobs) add_job(job);

    // The forward pass writes the scheduled tokens' blocks.
    for (const ScheduledRequest& e : entries) {
      SimRequest& r = requests_.at(e.request_id);
      const std::int64_t end = e.num_computed_tokens + e.num_scheduled_tokens;
      for (std::size_t g = 0; g < layouts.size(); ++g) {
        const std::int64_t gbs = layouts[g].gpu_block_size;
        for (std::int64_t k = e.num_computed_tokens / gbs; k < (end + gbs - 1) / gbs; ++k) {
          const GpuBlockId id = r.table[g][static_cast<std::size_t>(k)];
          REQUIRE(id != null_block);
          gpu_[id] = (k + 1) * gbs <= end ? label(r, g, k) : (kPartial | r.uid);
        }
      }
      r.computed = end;
      if (r.computed >= r.prompt) r.num_tokens = std::min(r.computed + 1, r.max_len + 1);
    }
    for (const TransferJob& job : out.store_jobs) add_job(job);

    // Jobs run and workers report, in random order over the next steps.
    worker_reports();

    // Finish requests that reached their length; update hashes of the rest.
    for (auto it = running_.begin(); it != running_.end();) {
      SimRequest& r = requests_.at(*it);
      if (r.computed >= r.max_len) {
        s_->on_finished(r.id);
        free_blocks(r);
        r.phase = Phase::done;
        it = running_.erase(it);
      } else {
        send_hashes(r);
        ++it;
      }
    }
    if (t % 50 == 0) check_hits_match_model();
  }

  void add_job(const TransferJob& job) {
    SimJob sj;
    sj.job = job;
    sj.reports_left = config_.num_workers;
    jobs_.emplace(job.id, std::move(sj));
  }

  /// Copies like a worker: group g's GPU blocks pair with host sub-blocks starting
  /// block_indices[g] % f into its first host block.
  void execute(SimJob& sj) {
    const TransferJob& job = sj.job;
    std::size_t key = 0, pos = 0;
    for (std::size_t g = 0; g < job.gpu.group_sizes.size(); ++g) {
      const std::int64_t skip = job.gpu.block_indices[g] % f_;
      const std::size_t first_key = key;
      while (key < job.keys.size() && job.keys[key].group == g) ++key;
      if (job.kind == JobKind::store) {
        for (std::size_t k = first_key; k < key; ++k) {
          host_[job.host_block_ids[k]].assign(static_cast<std::size_t>(f_), kUnwritten);
        }
      }
      for (std::int64_t p = 0; p < job.gpu.group_sizes[g]; ++p, ++pos) {
        const std::size_t hk = first_key + static_cast<std::size_t>((skip + p) / f_);
        const auto sub = static_cast<std::size_t>((skip + p) % f_);
        REQUIRE(hk < key);
        auto& slot = host_[job.host_block_ids[hk]];
        const GpuBlockId id = job.gpu.block_ids[pos];
        if (job.kind == JobKind::store) {
          slot[sub] = gpu_[id];
        } else {
          REQUIRE(slot.size() == static_cast<std::size_t>(f_));
          gpu_[id] = slot[sub];
        }
      }
    }
    if (job.kind == JobKind::load) {
      // Every loaded block must hold what the request would have computed.
      SimRequest& r = requests_.at(job.request_id);
      std::size_t at = 0;
      for (std::size_t g = 0; g < job.gpu.group_sizes.size(); ++g) {
        for (std::int64_t p = 0; p < job.gpu.group_sizes[g]; ++p, ++at) {
          const std::int64_t k = job.gpu.block_indices[g] + p;
          INFO("load job " << job.id << " group " << g << " GPU block index " << k);
          const std::uint64_t got = gpu_[job.gpu.block_ids[at]];
          if (got == kUnwritten) {
            // A window block stored while its leading sub-blocks were already null (after
            // reset_cache restarted the stores) holds only its later sub-blocks. SEMANTICS
            // still counts its key as a hit; see the note in the README.
            REQUIRE(config_.groups[g].kind != GroupKind::full_attention);
            ++unwritten_reads;
            continue;
          }
          REQUIRE(got == label(r, g, k));
        }
      }
      ++loads_verified;
    } else {
      ++stores_done;
    }
    sj.executed = true;
  }

  void worker_reports() {
    std::vector<JobReport> reports;
    for (auto& [id, sj] : jobs_) {
      if (!chance(0.5)) continue;
      if (!sj.executed) execute(sj);
      const std::int64_t count = std::min<std::int64_t>(sj.reports_left, rand(1, 2));
      reports.push_back({id, count, !chance(0.03)});
      sj.reports_left -= count;
    }
    if (!reports.empty()) handle_completions(s_->on_completed(reports));
  }

  void handle_completions(const std::vector<CompletedJob>& done) {
    for (const CompletedJob& c : done) {
      const SimJob& sj = jobs_.at(c.job);
      REQUIRE(sj.reports_left == 0);
      if (c.kind == JobKind::load) {
        SimRequest& r = requests_.at(c.request_id);
        loading_.erase(r.id);
        if (c.ok) {
          r.phase = Phase::running;
          r.computed = r.cached;
          running_.push_back(r.id);
        } else {
          restart(r);  // the engine recomputes
        }
      }
    }
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      it = it->second.reports_left == 0 ? jobs_.erase(it) : std::next(it);
    }
    apply_events();
  }

  // ---- checks ----------------------------------------------------------------------------

  void apply_events() {
    for (const ManagerEvent& e : s_->take_events()) {
      for (const Key& k : e.keys) {
        if (e.removed) {
          REQUIRE(model_.erase(k) == 1);
        } else {
          REQUIRE(model_.insert(k).second);
        }
      }
    }
  }

  std::unordered_set<GpuBlockId> blocks_written_this_step(
      const std::vector<ScheduledRequest>& entries, const StepResult& out) {
    std::unordered_set<GpuBlockId> written;
    const auto layouts = s_->layouts();
    for (const ScheduledRequest& e : entries) {
      const SimRequest& r = requests_.at(e.request_id);
      for (const auto& [id, value] : r.local_data) written.insert(id);
      const std::int64_t end = e.num_computed_tokens + e.num_scheduled_tokens;
      for (std::size_t g = 0; g < layouts.size(); ++g) {
        const std::int64_t gbs = layouts[g].gpu_block_size;
        for (std::int64_t k = e.num_computed_tokens / gbs; k < (end + gbs - 1) / gbs; ++k) {
          written.insert(r.table[g][static_cast<std::size_t>(k)]);
        }
      }
    }
    for (const TransferJob& job : out.load_jobs) {
      written.insert(job.gpu.block_ids.begin(), job.gpu.block_ids.end());
    }
    return written;
  }

  void check_step(const StepResult& out, const std::unordered_set<GpuBlockId>& written) {
    apply_events();
    const HostBlockManager& m = s_->manager();
    const auto G = static_cast<std::int64_t>(config_.groups.size());
    for (const TransferJob& job : out.store_jobs) {
      check_job_invariants(job, G, f_);
      for (std::size_t i = 0; i < job.keys.size(); ++i) {
        REQUIRE(m.peek(job.keys[i]) == LookupResult::pending);
        REQUIRE(m.block_of(job.keys[i]) == job.host_block_ids[i]);
        seen_keys_.insert(job.keys[i]);
      }
    }
    for (const TransferJob& job : out.load_jobs) {
      check_job_invariants(job, G, f_);
      for (std::size_t i = 0; i < job.keys.size(); ++i) {
        // Loaded keys were stored successfully and not evicted since.
        REQUIRE(model_.count(job.keys[i]) == 1);
        REQUIRE(m.block_of(job.keys[i]) == job.host_block_ids[i]);
        REQUIRE(m.readers(job.host_block_ids[i]) > 0);
      }
    }
    // The fence: a store that has not run yet and reads a block that this step writes (the
    // forward pass, a local prefix hit, a load) must be in the flush set.
    const std::set<JobId> flush(out.flush.begin(), out.flush.end());
    for (const auto& [id, sj] : jobs_) {
      if (sj.executed || sj.job.kind != JobKind::store) continue;
      for (const GpuBlockId b : sj.job.gpu.block_ids) {
        if (written.count(b) != 0) {
          ++flush_checks;
          INFO("store job " << id << " reads GPU block " << b << ", written this step");
          REQUIRE(flush.count(id) == 1);
        }
      }
    }
    for (std::size_t i = 1; i < out.flush.size(); ++i) REQUIRE(out.flush[i - 1] < out.flush[i]);
  }

  void check_hits_match_model() {
    apply_events();
    for (const Key& k : seen_keys_) {
      const bool hit = s_->manager().peek(k) == LookupResult::hit;
      INFO("key " << to_string(k));
      REQUIRE(hit == (model_.count(k) == 1));
    }
  }

  std::mt19937_64 rng_;
  std::int64_t steps_;
  SchedulerConfig config_;
  std::optional<Scheduler> s_;
  std::int64_t f_ = 1;
  std::int64_t max_obs_ = 0;
  int next_req_ = 0;
  std::map<std::string, SimRequest> requests_;
  std::deque<std::string> waiting_;
  std::set<std::string> loading_;
  std::vector<std::string> running_;
  std::map<JobId, SimJob> jobs_;
  std::vector<GpuBlockId> free_ids_;
  std::unordered_map<GpuBlockId, std::uint64_t> gpu_;
  std::unordered_map<HostBlockId, std::vector<std::uint64_t>> host_;
  std::set<Key, KeyLess> model_;
  std::set<Key, KeyLess> seen_keys_;
  bool reset_pending_ = false;
};

std::uint64_t test_seed() {
  if (const char* env = std::getenv("KVOFFLOAD_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  return std::random_device{}();
}

}  // namespace

TEST_CASE("Property: random hybrid configurations, LRU and ARC, hold the SEMANTICS invariants",
          "[scheduler][property]") {
  const std::uint64_t seed = test_seed();
  std::cout << "scheduler property test seed: " << seed
            << " (replay with KVOFFLOAD_TEST_SEED=" << seed << ")\n";
  std::mt19937_64 seeds(seed);
  constexpr int kConfigs = 50;
  constexpr std::int64_t kSteps = 500;  // 25,000 steps in all
  std::int64_t loads = 0, stores = 0, hits = 0, fences = 0, unwritten = 0;
  for (int c = 0; c < kConfigs; ++c) {
    const std::uint64_t sim_seed = seeds();
    // Every other configuration uses ARC: both policies must hold every invariant.
    Simulation sim(sim_seed, kSteps, c % 2 == 0 ? "lru" : "arc");
    INFO("seed " << seed << ", configuration " << c << " (" << sim.describe() << ")");
    sim.run();
    loads += sim.loads_verified;
    stores += sim.stores_done;
    hits += sim.hits;
    fences += sim.flush_checks;
    unwritten += sim.unwritten_reads;
  }
  std::cout << "  " << stores << " stores, " << loads << " loads verified, " << hits
            << " lookup hits, " << fences << " fenced block reuses, " << unwritten
            << " window sub-blocks loaded that their store skipped\n";
  // The run must have exercised what it checks.
  CHECK(loads > 100);
  CHECK(stores > 1000);
  CHECK(fences > 0);
}
