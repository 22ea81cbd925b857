#include "kvoffload/testing/faulty_backend.hpp"

#include <algorithm>

#include "common/expects.hpp"

namespace kvoffload {

FaultyBackend::FaultyBackend(std::unique_ptr<Backend> inner, const FaultConfig& config)
    : inner_(std::move(inner)), config_(config), rng_(config.seed) {
  KVOFFLOAD_EXPECTS(inner_ != nullptr, "faulty backend: no inner backend");
  KVOFFLOAD_EXPECTS(config.fail >= 0 && config.fail <= 1 && config.delay >= 0 &&
                        config.delay <= 1 && config.max_delay_polls >= 1,
                    "faulty backend: probabilities must be in [0, 1] and max_delay_polls >= 1 "
                    "(fail {}, delay {}, max_delay_polls {})",
                    config.fail, config.delay, config.max_delay_polls);
}

FaultyBackend::~FaultyBackend() {
  inner_->shutdown(/*drain=*/true);
}

Ticket FaultyBackend::submit(CopyPlan plan) {
  std::lock_guard lock(mutex_);
  ++counts_.plans;
  const bool fail = std::uniform_real_distribution<double>(0, 1)(rng_) < config_.fail;
  if (fail) plan.descriptors.resize(plan.descriptors.size() / 2);  // broke off halfway
  const Ticket t = inner_->submit(std::move(plan));
  if (fail) failing_.insert(t);
  return t;
}

void FaultyBackend::poll(std::vector<BackendResult>& finished) {
  std::lock_guard lock(mutex_);
  fresh_.clear();
  inner_->poll(fresh_);
  for (BackendResult& r : fresh_) {
    if (failing_.erase(r.ticket) > 0) {
      r.ok = false;
      r.bytes = 0;
      r.error = "injected failure: the transfer broke off after part of its copies";
      ++counts_.failed;
    }
    int polls = 0;
    if (std::uniform_real_distribution<double>(0, 1)(rng_) < config_.delay) {
      polls = std::uniform_int_distribution<int>(1, config_.max_delay_polls)(rng_);
      ++counts_.delayed;
    }
    held_.push_back({std::move(r), polls});
  }
  const std::size_t first = finished.size();
  if (config_.reorder) {
    // Whatever is due, in random order.
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->polls_left == 0) {
        finished.push_back(std::move(it->result));
        it = held_.erase(it);
      } else {
        --it->polls_left;
        ++it;
      }
    }
    if (finished.size() - first > 1) {
      std::shuffle(finished.begin() + static_cast<std::ptrdiff_t>(first), finished.end(), rng_);
      ++counts_.reordered_batches;
    }
    return;
  }
  // In order per direction: a held result holds back the later ones of its direction.
  bool blocked[2] = {false, false};
  for (auto it = held_.begin(); it != held_.end();) {
    const auto d = static_cast<std::size_t>(it->result.kind);
    if (!blocked[d] && it->polls_left == 0) {
      finished.push_back(std::move(it->result));
      it = held_.erase(it);
      continue;
    }
    if (it->polls_left > 0) --it->polls_left;
    blocked[d] = true;
    ++it;
  }
}

void FaultyBackend::wait(Ticket ticket) {
  inner_->wait(ticket);  // the copy itself is done (the report may still be held back)
}

void FaultyBackend::shutdown(bool drain) {
  inner_->shutdown(drain);
}

FaultyBackend::Counts FaultyBackend::counts() const {
  std::lock_guard lock(mutex_);
  return counts_;
}

}  // namespace kvoffload
