// A serving engine's loop around kvoffload, small enough to read in one sitting.
//
// Six requests share two system prompts. Each step the "engine" admits waiting requests
// (lookup: how much of the prompt is in host memory?), allocates GPU blocks, lets the
// scheduler plan loads and stores, runs them on the worker (HostBackend: the "GPU" KV cache
// is host memory here), "computes" the new tokens by writing each block's expected bytes,
// reports finished transfers back, and finishes requests. Blocks loaded from the host are
// checked byte for byte; the program fails if one differs.
//
//   examples/engine_loop [--quiet]
// The synthetic engine in tools/sim does the same for hybrid models under eviction pressure.

#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "kvoffload/scheduler.hpp"
#include "kvoffload/worker.hpp"

namespace {

using namespace kvoffload;

constexpr std::int64_t kBlockTokens = 16;  // GPU block = hash block = 16 tokens
constexpr std::int64_t kFactor = 2;        // a host block holds 2 GPU blocks
constexpr std::int64_t kGpuBlocks = 128;
constexpr std::int64_t kPageBytes = 512;
constexpr std::int64_t kDecodeTokens = 20;

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 31;
  x *= 0x9e3779b97f4a7c15ULL;
  return x ^ (x >> 29);
}

struct Request {
  std::string id;
  std::vector<std::uint64_t> tokens;  // prompt, then generated tokens
  std::int64_t prompt = 0;
  std::int64_t computed = 0;  // tokens whose KV is in the GPU blocks
  std::vector<GpuBlockId> blocks;
  std::vector<JobId> loads;  // must finish before this request computes
};

class Engine {
 public:
  explicit Engine(bool quiet)
      : quiet_(quiet),
        gpu_(static_cast<std::size_t>(kGpuBlocks * kPageBytes)),
        scheduler_([] {
          SchedulerConfig c;
          c.groups = {GroupConfig{GroupKind::full_attention, kBlockTokens, 0}};
          c.block_size_factor = kFactor;
          c.hash_block_size = kBlockTokens;
          c.gpu_blocks = kGpuBlocks;
          c.manager.host_blocks = 64;
          return c;
        }()),
        worker_([this] {
          WorkerConfig w;
          w.tensors = {
              {reinterpret_cast<std::uintptr_t>(gpu_.data()), kGpuBlocks, kPageBytes, kPageBytes}};
          w.groups = {{{0, kPageBytes}}};
          w.threads = 1;
          // The factor and the pool's size come from the scheduler's config: given once.
          return derive_worker_config(scheduler_.config(), w);
        }()) {
    for (GpuBlockId b = kGpuBlocks - 1; b >= 1; --b) free_.push_back(b);  // 0 is the null block
  }

  void add(const std::string& id, std::uint64_t system_prompt, std::int64_t prefix_tokens,
           std::int64_t own_tokens) {
    Request r;
    r.id = id;
    for (std::int64_t t = 0; t < prefix_tokens; ++t)
      r.tokens.push_back(mix(system_prompt * 1000 + t));
    for (std::int64_t t = 0; t < own_tokens; ++t)
      r.tokens.push_back(mix(std::hash<std::string>{}(id) + t));
    r.prompt = static_cast<std::int64_t>(r.tokens.size());
    waiting_.push_back(std::move(r));
  }

  /// One engine step; returns false when every request is done.
  bool step() {
    std::string log;
    std::vector<ScheduledRequest> scheduled;
    for (auto& [id, r] : running_) {
      // Decode: one more token; a new block every 16 tokens.
      const std::int64_t pos = static_cast<std::int64_t>(r.tokens.size());
      r.tokens.push_back(mix(pos * 7 + r.tokens.front()));
      ScheduledRequest e{id, r.computed, 1, {{}}, false};
      if (pos % kBlockTokens == 0) {
        r.blocks.push_back(take_block());
        e.new_block_ids[0].push_back(r.blocks.back());
      }
      if (pos % kBlockTokens == kBlockTokens - 1) {  // a hash block just completed
        scheduler_.extend_request(id, pos + 1,
                                  std::vector<BlockHash>{hash_of(r, (pos + 1) / kBlockTokens - 1)});
      } else {
        scheduler_.extend_request(id, pos + 1, {});
      }
      scheduled.push_back(std::move(e));
    }
    admit(scheduled, log);  // after the running ones: they are scheduled from the next step on
    if (scheduled.empty() && waiting_.empty()) return false;

    const StepResult plan = scheduler_.build_step(scheduled);
    if (!plan.flush.empty()) worker_.wait(plan.flush);  // stores still reading reused blocks
    for (const TransferJob& j : plan.load_jobs) {
      worker_.submit(j);
      running_.at(j.request_id).loads.push_back(j.id);
      log += " load job " + std::to_string(j.id) + " (" + j.request_id + ", " +
             std::to_string(j.gpu.block_ids.size()) + " blocks)";
    }
    compute(scheduled);
    for (const TransferJob& j : plan.store_jobs) {
      worker_.submit(j);
      log += " store job " + std::to_string(j.id) + " (" + j.request_id + ", " +
             std::to_string(j.keys.size()) + " host blocks)";
    }
    report_finished();
    finish_done(log);
    if (!quiet_) std::printf("step %2d:%s\n", step_++, log.empty() ? " decode" : log.c_str());
    return true;
  }

  int mismatches() const { return mismatches_; }
  std::int64_t verified() const { return verified_; }

 private:
  BlockHash hash_of(const Request& r, std::int64_t block) const {
    // A chained hash over the tokens: equal prefixes give equal block hashes.
    std::uint64_t h = 0;
    for (std::int64_t b = 0; b <= block; ++b) {
      for (std::int64_t t = b * kBlockTokens; t < (b + 1) * kBlockTokens; ++t) {
        h = mix(h ^ r.tokens[static_cast<std::size_t>(t)]);
      }
    }
    std::uint8_t bytes[8];
    std::memcpy(bytes, &h, 8);
    return BlockHash::from_bytes(bytes);
  }

  GpuBlockId take_block() {
    if (free_.empty()) throw std::runtime_error("engine_loop: out of GPU blocks");
    const GpuBlockId b = free_.back();
    free_.pop_back();
    return b;
  }

  void admit(std::vector<ScheduledRequest>& scheduled, std::string& log) {
    int admitted = 0;  // at most 2 a step, 4 running
    for (std::size_t n = waiting_.size(); n > 0 && running_.size() < 4 && admitted < 2; --n) {
      Request r = std::move(waiting_.front());
      waiting_.pop_front();
      std::vector<BlockHash> hashes;
      for (std::int64_t b = 0; b < r.prompt / kBlockTokens; ++b) hashes.push_back(hash_of(r, b));
      scheduler_.update_request(r.id, r.prompt, hashes);
      const std::optional<std::int64_t> hit = scheduler_.lookup(r.id, 0);
      if (!hit) {  // its prefix is being stored or loaded right now: try again next step
        log += " " + r.id + " deferred";
        waiting_.push_back(std::move(r));
        continue;
      }
      for (std::int64_t t = 0; t < r.prompt; t += kBlockTokens) r.blocks.push_back(take_block());
      scheduler_.on_allocated(r.id, std::vector<AllocatedGroup>{{r.blocks, 0}}, *hit);
      r.computed = *hit;  // those tokens arrive by the load job
      ++admitted;
      scheduled.push_back({r.id, *hit, r.prompt - *hit, {r.blocks}, false});
      log += " admit " + r.id + " (prompt " + std::to_string(r.prompt) + ", " +
             std::to_string(*hit) + " from host)";
      running_.emplace(r.id, std::move(r));
    }
  }

  std::uint8_t* page(GpuBlockId b) { return gpu_.data() + b * kPageBytes; }
  static void expected(const BlockHash& h, std::uint8_t* out) {
    for (std::int64_t i = 0; i < kPageBytes; ++i)
      out[i] = static_cast<std::uint8_t>(h.data()[i % 8] + i);
  }

  /// Waits for each request's loads, checks the loaded blocks, then writes the KV of the tokens
  /// computed this step (a block's bytes depend only on its hash, like real KV on its prefix).
  void compute(const std::vector<ScheduledRequest>& scheduled) {
    // The forward pass takes time; the offload copies run meanwhile on the worker's threads.
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::vector<std::uint8_t> want(kPageBytes);
    for (const ScheduledRequest& e : scheduled) {
      Request& r = running_.at(e.request_id);
      if (!r.loads.empty()) {
        worker_.wait(r.loads);
        for (std::int64_t b = 0; b < e.num_computed_tokens / kBlockTokens; ++b) {
          expected(hash_of(r, b), want.data());
          ++verified_;
          if (std::memcmp(page(r.blocks[static_cast<std::size_t>(b)]), want.data(), kPageBytes) !=
              0) {
            std::fprintf(stderr, "engine_loop: %s block %lld differs after its load\n",
                         r.id.c_str(), static_cast<long long>(b));
            ++mismatches_;
          }
        }
        r.loads.clear();
      }
      r.computed = e.num_computed_tokens + e.num_scheduled_tokens;
      for (std::int64_t b = e.num_computed_tokens / kBlockTokens; b < r.computed / kBlockTokens;
           ++b) {
        expected(hash_of(r, b), page(r.blocks[static_cast<std::size_t>(b)]));
      }
    }
  }

  void report_finished() {
    std::vector<JobReport> reports;
    for (const FinishedTransfer& f : worker_.get_finished()) reports.push_back({f.job, 1, f.ok});
    (void)scheduler_.on_completed(reports);
  }

  void finish_done(std::string& log) {
    for (auto it = running_.begin(); it != running_.end();) {
      Request& r = it->second;
      if (r.computed < r.prompt + kDecodeTokens) {
        ++it;
        continue;
      }
      scheduler_.on_finished(r.id);
      // Freed blocks may be reused next step; the scheduler flushes stores still reading them.
      free_.insert(free_.end(), r.blocks.begin(), r.blocks.end());
      log += " finish " + r.id;
      it = running_.erase(it);
    }
  }

  bool quiet_;
  std::vector<std::uint8_t> gpu_;  // the "GPU" KV cache: kGpuBlocks pages
  Scheduler scheduler_;
  Worker worker_;
  std::vector<GpuBlockId> free_;
  std::deque<Request> waiting_;
  std::map<std::string, Request> running_;
  int step_ = 0;
  int mismatches_ = 0;
  std::int64_t verified_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  const bool quiet = argc > 1 && std::strcmp(argv[1], "--quiet") == 0;
  try {
    Engine engine(quiet);
    for (int i = 0; i < 6; ++i) {
      engine.add("req-" + std::to_string(i), i % 2, 64, 20 + 3 * i);  // 2 shared system prompts
    }
    int steps = 0;
    while (engine.step()) {
      if (++steps > 1000) throw std::runtime_error("engine_loop: no progress");
    }
    std::printf("engine_loop: %d steps, %lld loaded blocks checked, %d mismatches\n", steps,
                static_cast<long long>(engine.verified()), engine.mismatches());
    return engine.mismatches() == 0 && engine.verified() > 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine_loop: %s\n", e.what());
    return 1;
  }
}
