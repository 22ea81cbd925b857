// make_cluster_presence: the scheduler's existence checks on a shared tier's cluster, run on a
// thread of their own so a lookup never waits for the network.

#include "kvoffload/tiers/shared_presence.hpp"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "common/expects.hpp"
#include "kvoffload/tiers/cluster_client.hpp"
#include "kvoffload/tiers/shared_keys.hpp"
#include "tiers/shared/client_config.hpp"

namespace kvoffload {

PresenceCheck::~PresenceCheck() = default;

namespace {

class ClusterPresence final : public PresenceCheck {
 public:
  ClusterPresence(const SharedTierConfig& c, std::int64_t block_size_factor) : tp_size_(c.tp_size) {
    ClusterClientConfig cc = detail::cluster_client_config(c);
    cc.cancel = cancel_;                            // one flag stops every checker's client
    cc.health = std::make_shared<ClusterHealth>();  // a node one finds down, all skip
    for (int i = 0; i < kCheckers; ++i) {
      checkers_.push_back(std::make_unique<Checker>(c, block_size_factor, cc));
    }
    try {
      for (auto& checker : checkers_) {
        checker->thread = std::thread([this, w = checker.get()] { run(*w); });
      }
    } catch (...) {
      stop();  // the threads already started (a std::thread that cannot start throws)
      throw;
    }
  }
  ~ClusterPresence() override { stop(); }
  ClusterPresence(const ClusterPresence&) = delete;
  ClusterPresence& operator=(const ClusterPresence&) = delete;

  void submit(std::uint64_t ticket, std::uint64_t epoch, std::vector<Key> keys) override {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(Check{ticket, epoch, std::move(keys)});
    }
    ready_.notify_one();
  }

  std::vector<PresenceAnswer> poll() override {
    std::lock_guard lock(mutex_);
    std::vector<PresenceAnswer> out;
    out.swap(answers_);
    return out;
  }

 private:
  void stop() noexcept {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cancel_->store(true);  // a check waiting on a slow node ends now: its answer is not wanted
    ready_.notify_all();
    for (auto& checker : checkers_) {
      if (checker->thread.joinable()) checker->thread.join();
    }
  }

  /// Checks taken together: every queued one (up to kMaxTaken) goes out in one pipelined run,
  /// and each is answered as soon as its own replies are in, so a check whose keys live on
  /// healthy nodes is not held back by a slow node another check's keys live on.
  static constexpr std::size_t kMaxTaken = 64;
  /// Threads taking checks, each with its own connections: a check submitted while one
  /// thread's run waits on a slow node goes to another.
  static constexpr int kCheckers = 4;

  struct Checker {
    Checker(const SharedTierConfig& c, std::int64_t factor, const ClusterClientConfig& cc)
        : keys(c, factor), client(std::make_unique<ClusterClient>(cc)) {}
    SharedKeys keys;  // its thread's only
    std::unique_ptr<ClusterClient> client;
    std::thread thread;
  };

  void run(Checker& w) {
    std::vector<Check> checks;
    for (;;) {
      checks.clear();
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (stopping_) return;  // answers nobody will read
        while (!queue_.empty() && checks.size() < kMaxTaken) {
          checks.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
      }
      // One EXISTS per key naming every rank's row (they share a slot): present if all are.
      const auto ranks = static_cast<std::size_t>(tp_size_);
      std::vector<PresenceAnswer> answers;
      std::vector<std::size_t> left;  // per check: its keys not answered yet
      std::vector<std::pair<std::size_t, std::size_t>> whose;  // per command: (check, key)
      std::size_t total = 0;
      for (const Check& c : checks) total += c.keys.size();
      std::vector<std::string> names(total * ranks);
      std::vector<ClusterCommand> commands(total);
      std::size_t i = 0;
      for (std::size_t k = 0; k < checks.size(); ++k) {
        const Check& check = checks[k];
        answers.push_back(
            PresenceAnswer{check.ticket, std::vector<bool>(check.keys.size(), false)});
        left.push_back(check.keys.size());
        for (std::size_t j = 0; j < check.keys.size(); ++j, ++i) {
          ClusterCommand& c = commands[i];
          c.args.push_back("EXISTS");
          for (std::size_t rank = 0; rank < ranks; ++rank) {
            std::string& name = names[i * ranks + rank];
            name = w.keys.name(check.keys[j], static_cast<int>(rank), check.epoch);
            c.args.push_back(name);
          }
          c.key = c.args[1];
          whose.emplace_back(k, j);
        }
      }
      const auto answer = [&](std::size_t k) {
        std::lock_guard lock(mutex_);
        answers_.push_back(std::move(answers[k]));
      };
      for (std::size_t k = 0; k < checks.size(); ++k) {
        if (left[k] == 0) answer(k);  // a check of no keys
      }
      w.client->run(commands, [&](std::size_t c, const ClusterReply& r) {
        const auto [k, j] = whose[c];
        answers[k].present[j] = r.kind == ClusterReplyKind::integer && r.integer == tp_size_;
        if (r.kind != ClusterReplyKind::integer) ++answers[k].errors;
        if (--left[k] == 0) answer(k);
      });
    }
  }

  int tp_size_ = 1;
  std::shared_ptr<std::atomic<bool>> cancel_ = std::make_shared<std::atomic<bool>>(false);
  std::vector<std::unique_ptr<Checker>> checkers_;
  std::mutex mutex_;
  std::condition_variable ready_;
  struct Check {
    std::uint64_t ticket = 0;
    std::uint64_t epoch = 0;
    std::vector<Key> keys;
  };
  std::deque<Check> queue_;
  std::vector<PresenceAnswer> answers_;
  bool stopping_ = false;
};

}  // namespace

std::shared_ptr<PresenceCheck> make_cluster_presence(const SharedTierConfig& config,
                                                     std::int64_t block_size_factor) {
  KVOFFLOAD_EXPECTS(!config.name.empty(), "shared tier: name is empty");
  return std::make_shared<ClusterPresence>(config, block_size_factor);
}

SchedulerServices make_scheduler_services(const SchedulerConfig& config) {
  config.validate();
  SchedulerServices services;
  services.presence.resize(config.tiers.size());
  for (std::size_t t = 0; t < config.tiers.size(); ++t) {
    const TierConfig& tier = config.tiers[t];
    if (tier.medium != Medium::shared) continue;
    KVOFFLOAD_EXPECTS(tier.store.has_value(),
                      "tiers[{}].store: a shared tier's presence checks need its cluster "
                      "(a SharedTierConfig)",
                      t);
    services.presence[t] =
        make_cluster_presence(std::get<SharedTierConfig>(*tier.store), config.block_size_factor);
  }
  return services;
}

}  // namespace kvoffload
