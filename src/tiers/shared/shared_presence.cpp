// make_cluster_presence: the scheduler's existence checks on a shared tier's cluster, run on a
// thread of their own so a lookup never waits for the network.

#include "kvoffload/tiers/shared_presence.hpp"

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
  ClusterPresence(const SharedTierConfig& c, std::int64_t block_size_factor)
      : keys_(c, block_size_factor), tp_size_(c.tp_size) {
    client_ = std::make_unique<ClusterClient>(detail::cluster_client_config(c));
    thread_ = std::thread([this] { run(); });
  }
  ~ClusterPresence() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    client_->cancel();  // a check waiting on a slow node ends now: its answer is not wanted
    ready_.notify_all();
    thread_.join();
  }
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
  void run() {
    for (;;) {
      Check check;
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (stopping_) return;  // answers nobody will read
        check = std::move(queue_.front());
        queue_.pop_front();
      }
      PresenceAnswer a{check.ticket, std::vector<bool>(check.keys.size(), false)};
      // One EXISTS per key naming every rank's row (they share a slot): present if all are.
      std::vector<std::string> names(check.keys.size() * static_cast<std::size_t>(tp_size_));
      std::vector<ClusterCommand> commands(check.keys.size());
      for (std::size_t i = 0; i < check.keys.size(); ++i) {
        ClusterCommand& c = commands[i];
        c.args.push_back("EXISTS");
        for (int rank = 0; rank < tp_size_; ++rank) {
          std::string& name = names[i * static_cast<std::size_t>(tp_size_) + rank];
          name = keys_.name(check.keys[i], rank, check.epoch);
          c.args.push_back(name);
        }
        c.key = c.args[1];
      }
      client_->run(commands, [&](std::size_t i, const ClusterReply& r) {
        a.present[i] = r.kind == ClusterReplyKind::integer && r.integer == tp_size_;
        if (r.kind != ClusterReplyKind::integer) ++a.errors;
      });
      std::lock_guard lock(mutex_);
      answers_.push_back(std::move(a));
    }
  }

  SharedKeys keys_;  // the thread's only (after construction)
  int tp_size_ = 1;
  std::unique_ptr<ClusterClient> client_;
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
  std::thread thread_;
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
