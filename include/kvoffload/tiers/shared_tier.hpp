#pragma once

// The worker side of a shared tier (a Tier, tier.hpp) on a Valkey (or Redis 7) cluster: runs the
// scheduler's tier jobs (promote: GET values into host blocks; write: SET host blocks as values) on
// one I/O thread with pipelined batches, and reports them finished. Every rank stores its own rows
// under its own key; a key's ranks share a hash tag, so one EXISTS answers for all of them.
// A value is a header (magic, version, layout digest, key, length, rank) and one host block
// row, written with one SET: a reader never sees a partial block. Keys' names and the values'
// MACs (HMAC-keyed GMAC over name, header and payload) are keyed by the fleet secret (SharedKeys):
// a value a writer without it forged, or moved from another key, is refused. Anything wrong
// with a value, or with the cluster, fails the block (a miss for the scheduler) and is counted.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kvoffload/export.hpp"
#include "kvoffload/job.hpp"
#include "kvoffload/tiers/cluster_client.hpp"
#include "kvoffload/tiers/shared_keys.hpp"
#include "kvoffload/tiers/tier.hpp"
#include "kvoffload/tiers/tier_config.hpp"
#include "kvoffload/types.hpp"

namespace kvoffload {
namespace detail {
class HelperThread;
}

/// The bytes before the payload in a value.
inline constexpr std::size_t shared_value_header_bytes = 112;

/// A shared tier's counters (SharedTier::stats).
struct SharedTierStats {
  std::uint64_t reads = 0;          ///< blocks promoted (read and verified)
  std::uint64_t read_misses = 0;    ///< GETs of keys the cluster did not have
  std::uint64_t bad_values = 0;     ///< values refused: header, length or MAC mismatch
  std::uint64_t read_errors = 0;    ///< GETs without a usable reply (node down, timeout...)
  std::uint64_t writes = 0;         ///< blocks written
  std::uint64_t write_errors = 0;   ///< SETs not acknowledged
  std::uint64_t bytes_read = 0;     ///< payload bytes promoted
  std::uint64_t bytes_written = 0;  ///< payload bytes written
  // Why connections failed (outages apart from misses): each also fails its blocks.
  std::uint64_t connect_errors = 0;  ///< a node unreachable (refused, timed out)
  std::uint64_t tls_errors = 0;      ///< TLS handshakes refused (certificate, name, protocol)
  std::uint64_t auth_errors = 0;     ///< AUTH refused (wrong user or password)
  std::uint64_t io_errors = 0;       ///< connections dropped mid-batch (timeout, reset)
  std::uint64_t timeouts = 0;        ///< of io_errors: a write or a whole reply missed its deadline
  std::uint64_t protocol_errors = 0;  ///< of io_errors: a reply broke the protocol or a bound
  std::uint64_t oversized = 0;        ///< values longer than a block, skipped unbuffered
};

class KVOFFLOAD_EXPORT SharedTier final : public Tier {
 public:
  /// `block_size_factor` is the worker's (part of the namespace, as for the scheduler's
  /// make_cluster_presence); `layout` is the worker's host block layout
  /// (Worker::layout_description); host_block(id) gives the bytes of host block id
  /// (payload_bytes each). Connects to nothing yet; throws invalid_argument naming the field
  /// for a bad config.
  SharedTier(const SharedTierConfig& config, std::int64_t block_size_factor,
             std::string_view layout, std::uint64_t payload_bytes,
             std::function<std::span<std::byte>(HostBlockId)> host_block);
  /// Finishes the jobs already submitted for at most shutdown_grace() (a healthy cluster
  /// drains its queue), then cancels the rest, which fail: bounded whatever the servers do.
  ~SharedTier() override;
  /// How long the destructor lets submitted jobs finish: two batches' deadlines (the reply
  /// and connect timeouts plus in_flight blocks at the client's minimum rate), at least 5 s.
  [[nodiscard]] std::chrono::milliseconds shutdown_grace() const noexcept { return grace_; }

  [[nodiscard]] Medium medium() const noexcept override { return Medium::shared; }
  /// 0: the cluster holds the values, not slots of this tier.
  [[nodiscard]] std::int64_t num_slots() const noexcept override { return 0; }
  [[nodiscard]] const std::vector<std::optional<Key>>& scanned() const noexcept override {
    return no_scan_;
  }
  [[nodiscard]] TierIoStats stats() const override;
  [[nodiscard]] SharedTierStats shared_stats() const;
  [[nodiscard]] const std::string& key_namespace() const noexcept { return keys_->key_namespace(); }
  [[nodiscard]] std::uint64_t layout_digest() const noexcept { return digest_; }

 private:
  void check(const TierJob& job) const override;
  /// The fleet's values are not this worker's to delete.
  void clear_contents() override {}
  void run();
  /// Adds what client_'s connection counters gained since the last call to `delta`.
  void add_client_stats(SharedTierStats& delta);

  std::unique_ptr<SharedKeys> keys_;               // the I/O thread's only (after construction)
  std::unique_ptr<detail::ValueMac> mac_;          // the I/O thread's only
  std::unique_ptr<detail::ValueMac> check_mac_;    // the helper thread's only
  std::unique_ptr<detail::HelperThread> checker_;  // checks read values' MACs
  std::uint64_t digest_ = 0;
  int rank_ = 0;
  int in_flight_ = 8;
  std::uint64_t payload_bytes_ = 0;
  std::function<std::span<std::byte>(HostBlockId)> host_block_;
  ClusterClientConfig client_config_;
  std::shared_ptr<std::atomic<bool>> cancel_ = std::make_shared<std::atomic<bool>>(false);
  std::chrono::milliseconds grace_{5000};
  std::future<void> finished_;             // ready once run() returned
  std::unique_ptr<ClusterClient> client_;  // the I/O thread's only; null after a failed batch
  ClusterStats client_seen_;               // client_'s counters already added to stats_
  std::string ttl_;                        // SETEX's seconds; empty: plain SET
  std::vector<std::optional<Key>> no_scan_;
  mutable std::mutex stats_mutex_;
  SharedTierStats stats_;
  std::thread thread_;
};

}  // namespace kvoffload
