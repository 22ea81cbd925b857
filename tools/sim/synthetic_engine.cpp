// The synthetic engine: set-up and tier wiring, the workload, and the public API.
#include "synthetic_engine_impl.hpp"

namespace kvsim {

namespace {

/// Lockstep runs: a presence check answered before submit returns (bounded: the cluster
/// presence answers every check, absent on a timeout, within its reply timeouts).
class AnsweredAtOnce final : public PresenceCheck {
 public:
  explicit AnsweredAtOnce(std::shared_ptr<PresenceCheck> inner) : inner_(std::move(inner)) {}
  void submit(std::uint64_t ticket, std::uint64_t epoch, std::vector<Key> keys) override {
    inner_->submit(ticket, epoch, std::move(keys));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (;;) {
      bool answered = false;
      for (PresenceAnswer& a : inner_->poll()) {
        answered = answered || a.ticket == ticket;
        answers_.push_back(std::move(a));
      }
      if (answered) return;
      if (std::chrono::steady_clock::now() > deadline) {
        throw kvoffload::error("synthetic engine (lockstep): presence check " +
                               std::to_string(ticket) + " unanswered after 30 s");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  std::vector<PresenceAnswer> poll() override { return std::exchange(answers_, {}); }

 private:
  std::shared_ptr<PresenceCheck> inner_;
  std::vector<PresenceAnswer> answers_;
};

}  // namespace

SyntheticEngine::Impl::Impl(const SimConfig& c) : config(c), rng(c.seed) {
  if (c.check_invariants && (c.reset_probability > 0 || c.report_failure_probability > 0)) {
    // The shadow cache follows the copies; a reset or a worker's failed report would make
    // the scheduler's (correct) view differ from it.
    throw kvoffload::invalid_argument(
        "synthetic engine: check_invariants excludes reset_probability and "
        "report_failure_probability");
  }
  SchedulerConfig sc;
  sc.groups = c.groups;
  sc.block_size_factor = c.block_size_factor;
  sc.hash_block_size = c.hash_block_size;
  sc.num_workers = c.num_workers;
  sc.prefix_caching = c.prefix_caching;
  sc.manager.host_blocks = c.host_blocks;
  sc.manager.policy = parse_eviction_policy(c.policy, "policy");
  sc.manager.store_threshold = c.store_threshold;
  // Events accumulate until take_events(); only the invariant checks and the observer read
  // them.
  sc.manager.enable_events = c.check_invariants || static_cast<bool>(c.observer);
  const auto G = c.groups.size();
  // Per group, per layer, K and V: separate tensors in "GPU" memory (host RAM here).
  WorkerConfig wc;
  wc.groups.resize(G);
  for (std::size_t g = 0; g < G; ++g) {
    for (int t = 0; t < 2 * c.layers; ++t) {
      gpu.emplace_back(static_cast<std::size_t>(c.gpu_blocks * c.page_bytes));
      wc.tensors.push_back({reinterpret_cast<std::uintptr_t>(gpu.back().data()), c.gpu_blocks,
                            c.page_bytes, c.page_bytes});
      wc.groups[g].push_back({static_cast<std::int32_t>(wc.tensors.size() - 1), c.page_bytes});
    }
  }
  wc.defer_stores = c.defer_stores;
  HostBackendConfig bc;
  bc.threads = c.copy_threads;
  std::unique_ptr<Backend> backend = std::make_unique<HostBackend>(bc);
  if (c.faulty) {
    auto faulty_backend = std::make_unique<FaultyBackend>(std::move(backend), c.faults);
    faulty = faulty_backend.get();
    backend = std::move(faulty_backend);
  }
  // The tiers, described once in the scheduler's config; the worker's are derived from it.
  if (!c.disk_dir.empty()) {
    DiskTierConfig dc;
    dc.path = c.disk_dir;
    dc.capacity_bytes = c.disk_capacity;
    dc.model = "kvoffload-demo synthetic";
    dc.dtype = "uint8";
    TierConfig tier;
    tier.medium = Medium::disk;
    tier.blocks = 1;  // the slots the worker's disk tier has, set once it is open
    tier.store_threshold = c.disk_store_threshold;
    tier.write_back = c.disk_write_back;
    tier.store = dc;
    sc.tiers.push_back(tier);
  }
  if (!c.shared_nodes.empty()) {
    shared_tier = sc.tiers.size();
    SharedTierConfig shared;
    shared.nodes = c.shared_nodes;
    shared.name = c.shared_name;
    shared.secret_file = c.shared_secret_file;
    shared.insecure = c.shared_insecure;
    shared.username = c.shared_username;
    shared.password_file = c.shared_password_file;
    shared.tls = !c.shared_tls_ca_file.empty();
    shared.tls_ca_file = c.shared_tls_ca_file;
    shared.tls_server_name = c.shared_tls_server_name;
    shared.reply_timeout_ms = c.shared_reply_timeout_ms;
    TierConfig tier;
    tier.medium = Medium::shared;
    tier.blocks = 1 << 20;  // keys remembered as present
    tier.store_threshold = c.shared_store_threshold;
    tier.store = shared;
    sc.tiers.push_back(tier);
  }
  engine = std::make_unique<Worker>(derive_worker_config(sc, std::move(wc)), std::move(backend));
  if (!c.disk_dir.empty()) sc.tiers[0].blocks = engine->tier(0).num_slots();
  SchedulerServices services = make_scheduler_services(sc);
  if (c.lockstep && !c.shared_nodes.empty()) {
    auto& presence = services.presence[shared_tier];
    presence = std::make_shared<AnsweredAtOnce>(presence);
  }
  scheduler = std::make_unique<Scheduler>(sc, std::move(services));
  engine->check_matches(sc);
  if (!c.disk_dir.empty()) {
    report.disk_slots = engine->tier(0).num_slots();
    report.disk_restored = scheduler->restore_tier(0, engine->tier(0).scanned());
    if (c.check_invariants) {
      for (const auto& k : engine->tier(0).scanned()) {
        if (k) disk_ok.insert(*k);
      }
    }
    engine->release_tier_scan(0);  // as an engine does: the tier runs on without it
  }
  for (GpuBlockId id = static_cast<GpuBlockId>(c.gpu_blocks - 1); id >= 1; --id) {
    free_ids.push_back(id);
  }
  for (int f = 0; f < c.prefix_families; ++f) families.push_back(random_hashes(64));
  max_obs = 0;
  for (const GroupLayout& l : scheduler->layouts()) {
    max_obs = std::max(max_obs, l.offloaded_block_size);
    gbs_lcm = std::lcm(gbs_lcm, l.gpu_block_size);
  }
  start = std::chrono::steady_clock::now();
}

void SyntheticEngine::Impl::admit() {
  Request r;
  r.id = "req" + std::to_string(next_request++);
  r.uid = static_cast<std::uint64_t>(next_request);
  r.prompt = rand(1, 6) * max_obs + rand(0, max_obs);
  r.max_len = r.prompt + rand(1, 2 * max_obs);
  r.num_tokens = r.prompt;
  const auto n = static_cast<std::size_t>(r.max_len / config.hash_block_size + 1);
  const auto& family = families[static_cast<std::size_t>(rand(0, config.prefix_families - 1))];
  const auto shared = std::min<std::size_t>(
      family.size(), static_cast<std::size_t>(rand(0, static_cast<std::int64_t>(n))));
  r.hashes.assign(family.begin(), family.begin() + static_cast<std::ptrdiff_t>(shared));
  const auto own = random_hashes(n - shared);
  r.hashes.insert(r.hashes.end(), own.begin(), own.end());
  chain(r.hashes);
  r.table.resize(config.groups.size());
  r.sent.assign(config.groups.size(), 0);
  waiting.push_back(r.id);
  requests.emplace(r.id, std::move(r));
}

void SyntheticEngine::Impl::send_hashes(Request& r) {
  const auto want = static_cast<std::size_t>(r.num_tokens / config.hash_block_size);
  if (!r.registered) {
    scheduler->update_request(r.id, r.num_tokens, std::span(r.hashes).first(want));
    r.registered = true;
  } else {
    scheduler->extend_request(r.id, r.num_tokens,
                              std::span(r.hashes).subspan(r.hashes_sent, want - r.hashes_sent));
  }
  r.hashes_sent = want;
}

/// Lookup and allocation; true if the request computes this step. Now and then the request
/// starts from a prefix in the GPU prefix cache (num_computed_tokens > 0).
bool SyntheticEngine::Impl::try_start(Request& r) {
  // SEMANTICS 8b: no load while the request still has jobs in flight (a preempted request's
  // stores whose reports are still owed): it waits.
  if (const auto it = jobs_of.find(r.id); it != jobs_of.end() && it->second > 0) return false;
  if (!r.registered) send_hashes(r);
  std::int64_t nct = 0;
  if (chance(config.local_hit_probability)) nct = rand(0, r.prompt / gbs_lcm) * gbs_lcm;
  nct = std::min(nct, r.num_tokens - 1);
  nct -= nct % gbs_lcm;
  if (config.final_states) scheduler->limit_state_stores(r.id, r.prompt);
  const auto hit = scheduler->lookup(r.id, nct);
  if (!hit) return false;
  const std::int64_t h = *hit;
  if (h > 0) ++report.lookup_hits;
  if (nct > 0) ++report.local_hits;
  const std::int64_t cached = nct + h;
  std::vector<AllocatedGroup> groups(config.groups.size());
  const auto& layouts = scheduler->layouts();
  r.local_data.clear();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const GroupLayout& L = layouts[g];
    const std::int64_t n_gpu = (cached + L.gpu_block_size - 1) / L.gpu_block_size;
    // Like vLLM, window groups hold only the blocks the next token reads: those wholly
    // before the window (mamba: before its last state) are null, with or without a load.
    // A local GPU hit not aligned to the host block thus leaves a host block's leading
    // sub-blocks null when it is stored (SEMANTICS 6.8).
    std::int64_t local = nct / L.gpu_block_size;
    std::int64_t null_below = 0;
    if (L.windowed()) {
      const std::int64_t back =
          L.kind == GroupKind::sliding_window ? config.groups[g].sliding_window - 1 : 1;
      null_below = std::min(std::max<std::int64_t>(0, cached - back) / L.gpu_block_size, n_gpu);
      local = std::min(std::max(local, null_below), n_gpu);
      null_below = h > 0 ? local : null_below;
    }
    // A mamba block holds the state at its last token: a load for a hit that ends inside one
    // would give the request the state of tokens it has not computed.
    if (h > 0 && L.kind == GroupKind::mamba && cached % L.offloaded_block_size != 0 &&
        report.mismatches++ == 0) {
      report.first_mismatch = "step " + std::to_string(report.steps) + ", request " + r.id +
                              ": a hit of mamba group " + std::to_string(g) + " ends at token " +
                              std::to_string(cached) + ", inside its block";
    }
    r.table[g].clear();
    for (std::int64_t k = 0; k < n_gpu; ++k) {
      const bool null = k < null_below;
      r.table[g].push_back(null ? null_block : alloc_block());
      if (!null && k < nct / L.gpu_block_size) r.local_data.emplace_back(g, k, r.table[g].back());
    }
    groups[g].block_ids = r.table[g];
    groups[g].num_computed_blocks = h > 0 ? local : 0;
  }
  scheduler->on_allocated(r.id, groups, h);
  r.sent.assign(groups.size(), 0);
  r.computed = nct;
  if (h > 0) {
    r.phase = Phase::loading;
    r.cached = cached;
    return false;
  }
  r.phase = Phase::running;
  return true;
}

void SyntheticEngine::Impl::free_skipped(Request& r) {
  // Blocks of a GPU prefix hit get their data in the request's first step: not before.
  if (!r.local_data.empty()) return;
  const auto& layouts = scheduler->layouts();
  for (std::size_t g = 0; g < layouts.size(); ++g) {
    const GroupLayout& L = layouts[g];
    if (!L.windowed()) continue;
    std::vector<GpuBlockId>& table = r.table[g];
    // vLLM's get_num_skipped_tokens: a window group reads the last sliding_window - 1 tokens;
    // align-mode mamba keeps its latest state block and retires older ones by and by.
    const bool window = L.kind == GroupKind::sliding_window;
    const std::int64_t keep_from =
        window ? std::max<std::int64_t>(0, r.computed - config.groups[g].sliding_window + 1) /
                     L.gpu_block_size
               : (r.computed + L.gpu_block_size - 1) / L.gpu_block_size - 1;
    const auto end =
        std::min(table.size(), static_cast<std::size_t>(std::max<std::int64_t>(0, keep_from)));
    for (std::size_t k = 0; k < end; ++k) {
      if (table[k] == null_block || (!window && !chance(0.5))) continue;
      free_ids.push_back(table[k]);
      table[k] = null_block;
    }
  }
}

void SyntheticEngine::Impl::restart(Request& r) {
  r.prompt = std::max(r.prompt, r.num_tokens - 1);  // recompute everything known
  free_blocks(r);
  r.local_data.clear();
  r.phase = Phase::waiting;
  r.computed = 0;
  r.resumed = true;
  waiting.push_back(r.id);
}

SyntheticEngine::SyntheticEngine(const SimConfig& config) : impl_(std::make_unique<Impl>(config)) {}
SyntheticEngine::~SyntheticEngine() = default;

const SimReport& SyntheticEngine::step() {
  impl_->step();
  return impl_->report;
}

SimReport SyntheticEngine::run(const std::function<void(const SimReport&)>& progress,
                               std::int64_t every) {
  for (std::int64_t i = 0; i < impl_->config.steps; ++i) {
    impl_->step();
    if (progress && every > 0 && (i + 1) % every == 0) progress(impl_->report);
  }
  if (impl_->config.check_invariants) impl_->drain();
  return impl_->report;
}

void SyntheticEngine::drain() {
  impl_->drain();
}

}  // namespace kvsim
