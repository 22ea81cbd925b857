#include "kvoffload/tiers/shared_tier.hpp"

#include <algorithm>
#include <array>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/expects.hpp"
#include "common/helper_thread.hpp"
#include "common/logging.hpp"
#include "kvoffload/tiers/cluster_client.hpp"
#include "tiers/shared/client_config.hpp"
#include "tiers/shared/value_mac.hpp"
#include "tiers/tier_queue.hpp"

namespace kvoffload {
namespace {

// The value header, little-endian (what every supported host is):
//   0 magic u32 | 4 version u32 | 8 layout digest u64 | 16 nonce [16] (random per write) |
//   32 zero [20] (no block hash: a value must not reveal the prompt hash its key's name hides) |
//   52 group u32 | 56 payload length u64 | 64 valid_from u32 (SEMANTICS 6.8: first written
//   sub-block) | 68 rank u32 | 72 zero u64 | 80 tag [16] | 96 zero [16].
// The tag is the value's MAC under the fleet's value key (tiers/shared/value_mac.hpp): a
// one-time key from HMAC-SHA-256 of the key's name and header bytes 0..80 (nonce included),
// GMAC of the payload under it. The name is a keyed PRF of the namespace, epoch, group and
// block hash, so the MAC binds the value to its key: a value copied under another key, rank
// or epoch is refused.
// Only whole blocks go below host memory (valid_from 0); a reader refuses any other value.
// Version 3 had HMAC-SHA-256 over the whole value (a third of the read path's speed), 2 an
// unkeyed checksum (anyone could recompute it), 1 no valid_from: all live in other namespaces.
constexpr std::uint32_t kMagic = 0x53564b4b;  // "KKVS"
constexpr std::uint32_t kVersion = 4;
constexpr std::size_t kNonceAt = 16;
constexpr std::size_t kNonceBytes = 16;
constexpr std::size_t kMacAt = detail::kValueMacHeaderBytes;
static_assert(kMacAt + 2 * detail::kGmacTagBytes == shared_value_header_bytes);

template <typename T>
void put(std::byte* at, std::size_t off, T v) {
  std::memcpy(at + off, &v, sizeof(T));
}
template <typename T>
T get(const char* at, std::size_t off) {
  T v;
  std::memcpy(&v, at + off, sizeof(T));
  return v;
}

/// The value's MAC: its key's name, header bytes 0..kMacAt and the payload.
detail::GmacTag value_mac(detail::ValueMac& mac, std::string_view name, const std::byte* header,
                          const std::byte* payload, std::size_t n) {
  return mac.tag(name, std::span<const std::byte, kMacAt>(header, kMacAt), std::span(payload, n));
}

}  // namespace

SharedTier::SharedTier(const SharedTierConfig& c, std::int64_t block_size_factor,
                       std::string_view layout, std::uint64_t payload_bytes,
                       std::function<std::span<std::byte>(HostBlockId)> host_block)
    : Tier("shared tier", /*failures_expected=*/true),
      rank_(c.tp_rank),
      in_flight_(c.in_flight),
      payload_bytes_(payload_bytes),
      host_block_(std::move(host_block)) {
  KVOFFLOAD_EXPECTS(!c.name.empty(),
                    "shared tier: name is empty (name the model, revision, dtype and block size: "
                    "engines sharing blocks give the same)");
  KVOFFLOAD_EXPECTS(c.tp_size >= 1 && c.tp_rank >= 0 && c.tp_rank < c.tp_size,
                    "shared tier: tp_rank {} is not in 0..tp_size-1 (tp_size {})", c.tp_rank,
                    c.tp_size);
  KVOFFLOAD_EXPECTS(c.in_flight >= 1 && c.in_flight <= 1024,
                    "shared tier: in_flight must be 1 to 1024, got {}", c.in_flight);
  const ClusterClientConfig cc = detail::cluster_client_config(c);  // AUTH, TLS: named errors
  keys_ = std::make_unique<SharedKeys>(c, block_size_factor);       // checks the factor, the secret
  mac_ = keys_->value_mac();
  check_mac_ = keys_->value_mac();
  checker_ = std::make_unique<detail::HelperThread>();
  client_config_ = cc;
  client_config_.cancel = cancel_;
  client_ = std::make_unique<ClusterClient>(client_config_);  // loads the TLS files: named errors
  // Two batches' deadlines (each the timeouts plus its blocks at the minimum rate), at least
  // 5 s: enough for a healthy cluster to drain the queue's head.
  const std::uint64_t batch_bytes = static_cast<std::uint64_t>(c.in_flight) * payload_bytes;
  const long long timeouts_ms =
      2LL * (static_cast<long long>(c.reply_timeout_ms) + c.connect_timeout_ms);
  const long long values_ms =
      cc.min_rate_bytes_per_s == 0
          ? 0
          : static_cast<long long>(2 * batch_bytes * 1000 / cc.min_rate_bytes_per_s);
  grace_ =
      std::max(std::chrono::milliseconds(5000), std::chrono::milliseconds(timeouts_ms + values_ms));
  if (c.ttl_seconds > 0) ttl_ = std::to_string(c.ttl_seconds);
  const std::string text = fmt::format("kvoffload shared tier v4\nname={}\ntp={}/{}\nlayout={}\n",
                                       c.name, c.tp_rank, c.tp_size, layout);
  digest_ = XXH3_64bits(text.data(), text.size());
  std::promise<void> finished;
  finished_ = finished.get_future();
  thread_ = std::thread([this, done = std::move(finished)]() mutable {
    run();
    done.set_value();
  });
}

void SharedTier::add_client_stats(SharedTierStats& delta) {
  const ClusterStats now = client_->stats();
  delta.connect_errors += now.connect_errors - client_seen_.connect_errors;
  delta.tls_errors += now.tls_errors - client_seen_.tls_errors;
  delta.auth_errors += now.auth_errors - client_seen_.auth_errors;
  delta.io_errors += now.io_errors - client_seen_.io_errors;
  delta.timeouts += now.timeouts - client_seen_.timeouts;
  delta.protocol_errors += now.protocol_errors - client_seen_.protocol_errors;
  delta.oversized += now.oversized - client_seen_.oversized;
  client_seen_ = now;
}

SharedTier::~SharedTier() {
  stop();
  if (finished_.wait_for(grace_) != std::future_status::ready) {
    detail::logger().warn(
        "shared tier: jobs still running {} ms after shutdown began; the rest are cancelled",
        grace_.count());
    cancel_->store(true);
  }
  thread_.join();
}

void SharedTier::check(const TierJob& job) const {
  KVOFFLOAD_EXPECTS(job.keys.size() == job.host_block_ids.size(),
                    "tier job {}: {} keys but {} host blocks", job.id, job.keys.size(),
                    job.host_block_ids.size());
  for (std::size_t i = 0; i < job.keys.size(); ++i) {
    KVOFFLOAD_EXPECTS(job.keys[i].hash.size() >= shared_hash_min_bytes,
                      "tier job {}: block {}'s hash is {} bytes; a shared tier needs at least {}",
                      job.id, i, job.keys[i].hash.size(), shared_hash_min_bytes);
  }
  detail::check_host_blocks(job, host_block_);
}

SharedTierStats SharedTier::shared_stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

TierIoStats SharedTier::stats() const {
  const SharedTierStats s = shared_stats();
  return TierIoStats{s.reads, s.read_misses + s.bad_values + s.read_errors, s.writes,
                     s.write_errors};
}

// Up to in_flight blocks per pipelined batch, from one job or several in a row.
void SharedTier::run() {
  using Task = detail::TierQueue::Task;
  std::vector<Task> tasks;
  std::vector<std::string> keys;
  std::vector<std::array<std::byte, shared_value_header_bytes>> headers;
  std::vector<ClusterCommand> commands;
  std::vector<bool> ok;
  // Per block: 1 once the helper thread found its MAC right (read after checker_->wait()).
  std::vector<std::uint8_t> mac_right;
  std::vector<std::size_t> checked;  // the promotions whose MAC the helper checks
  for (;;) {
    tasks.clear();
    if (!queue().take(tasks, static_cast<std::size_t>(in_flight_), false)) return;
    const std::size_t n = tasks.size();
    if (n == 0) continue;
    ok.assign(n, false);
    mac_right.assign(n, 0);
    checked.clear();
    SharedTierStats delta;
    try {
      keys.resize(n);
      headers.resize(n);
      commands.assign(n, ClusterCommand{});
      for (std::size_t i = 0; i < n; ++i) {
        const TierJob& job = tasks[i].job->job;
        const std::size_t b = tasks[i].index;
        const Key& k = job.keys[b];
        keys[i] = keys_->name(k, rank_, job.epoch);
        if (job.kind == JobKind::promote) {
          // The payload goes straight into the host block; it counts only once verified (the
          // block is the promotion's alone, and a failed one is never a hit).
          commands[i] =
              ClusterCommand{.key = keys[i],
                             .args = {"GET", keys[i]},
                             .reply_into = host_block_(job.host_block_ids[b]).first(payload_bytes_),
                             .reply_prefix = shared_value_header_bytes};
          continue;
        }
        const std::span<std::byte> payload = host_block_(job.host_block_ids[b]);
        std::byte* h = headers[i].data();
        std::memset(h, 0, shared_value_header_bytes);
        put<std::uint32_t>(h, 0, kMagic);
        put<std::uint32_t>(h, 4, kVersion);
        put<std::uint64_t>(h, 8, digest_);
        // No block hash in the value (its name binds the key). The nonce is drawn with the MAC.
        put<std::uint32_t>(h, 52, k.group);
        put<std::uint64_t>(h, 56, payload_bytes_);
        put<std::uint32_t>(h, 64, 0);  // valid_from: the scheduler writes whole blocks only
        put<std::uint32_t>(h, 68, static_cast<std::uint32_t>(rank_));
        commands[i] = ClusterCommand{
            .key = keys[i],
            // SETEX key seconds value with a TTL: the value is the command's last argument.
            .args = ttl_.empty() ? std::vector<std::string_view>{"SET", keys[i]}
                                 : std::vector<std::string_view>{"SETEX", keys[i], ttl_},
            .value = {std::string_view(reinterpret_cast<const char*>(h), shared_value_header_bytes),
                      std::string_view(reinterpret_cast<const char*>(payload.data()),
                                       payload_bytes_)},
            // The MAC while the node stores the block before this one.
            // A fresh nonce, so a fresh one-time MAC key (value_mac.hpp), at every send: a
            // redirected command is sent again, and no GMAC key may tag two payloads.
            .before_send = [this, h, name = std::string_view(keys[i]), payload] {
              detail::fill_random(std::span(h + kNonceAt, kNonceBytes));
              const detail::GmacTag m = value_mac(*mac_, name, h, payload.data(), payload_bytes_);
              std::memcpy(h + kMacAt, m.data(), m.size());
            }};
      }
      if (client_ == nullptr) client_ = std::make_unique<ClusterClient>(client_config_);
      client_->run(commands, [&](std::size_t i, const ClusterReply& r) {
        const TierJob& job = tasks[i].job->job;
        const Key& k = job.keys[tasks[i].index];
        if (job.kind == JobKind::write) {
          if (r.kind == ClusterReplyKind::status && r.text == "OK") {
            ++delta.writes;
            delta.bytes_written += payload_bytes_;
            ok[i] = true;
          } else {
            ++delta.write_errors;
          }
          return;
        }
        if (r.kind == ClusterReplyKind::nil) {
          ++delta.read_misses;  // evicted (or never there) since the existence check
          return;
        }
        if (r.kind != ClusterReplyKind::string) {
          ++delta.read_errors;
          return;
        }
        // A value of the right length arrived in place: its header here, its MAC on the
        // helper thread while this one reads the next reply (the MAC is most of a block's
        // CPU time). The header is copied: the reply's buffer is reused.
        const char* v = r.text.data();
        const bool valid =
            r.in_place && r.text.size() == shared_value_header_bytes &&
            get<std::uint32_t>(v, 0) == kMagic && get<std::uint32_t>(v, 4) == kVersion &&
            get<std::uint64_t>(v, 8) == digest_ &&
            std::all_of(v + kNonceAt + kNonceBytes, v + 52, [](char c) { return c == 0; }) &&
            get<std::uint32_t>(v, 52) == k.group && get<std::uint64_t>(v, 56) == payload_bytes_ &&
            get<std::uint32_t>(v, 64) == 0 &&
            get<std::uint32_t>(v, 68) == static_cast<std::uint32_t>(rank_) &&
            get<std::uint64_t>(v, 72) == 0 &&
            std::all_of(v + kMacAt + detail::kGmacTagBytes, v + shared_value_header_bytes,
                        [](char c) { return c == 0; });
        if (!valid) {
          ++delta.bad_values;
          return;
        }
        std::memcpy(headers[i].data(), v, shared_value_header_bytes);
        checked.push_back(i);
        auto check = [this, h = headers[i].data(), name = std::string_view(keys[i]),
                      payload = commands[i].reply_into.data(), right = &mac_right[i]]() noexcept {
          try {
            *right = detail::tag_equal(value_mac(*check_mac_, name, h, payload, payload_bytes_),
                                       h + kMacAt)
                         ? 1
                         : 0;
          } catch (...) {
            *right = 0;  // OpenSSL failed (out of memory): not verified, so not a hit
          }
        };
        // A batch of one has nothing to overlap its check with: checked here.
        if (n == 1) {
          check();
        } else {
          checker_->post(std::move(check));
        }
      });
    } catch (const std::exception& e) {
      // Building a batch or running it failed (out of memory): its unanswered blocks fail,
      // and every block is still reported once (the values that arrived whole are checked).
      detail::logger().error("shared tier: a batch of {} block(s) failed: {}", n, e.what());
      // The client may hold part of the batch or unread replies: the next batch starts over
      // with a new one (new connections, a fresh slot map) rather than read replies out of
      // step.
      if (client_ != nullptr) add_client_stats(delta);
      client_.reset();
      client_seen_ = {};
    }
    if (client_ != nullptr) add_client_stats(delta);
    // Every posted check reads its block and writes mac_right: done before either is reused
    // or the block is reported.
    checker_->wait();
    for (const std::size_t i : checked) {
      if (mac_right[i] == 0) {
        ++delta.bad_values;
        continue;
      }
      ++delta.reads;
      delta.bytes_read += payload_bytes_;
      ok[i] = true;
    }
    {
      std::lock_guard lock(stats_mutex_);
      stats_.reads += delta.reads;
      stats_.read_misses += delta.read_misses;
      stats_.bad_values += delta.bad_values;
      stats_.read_errors += delta.read_errors;
      stats_.writes += delta.writes;
      stats_.write_errors += delta.write_errors;
      stats_.bytes_read += delta.bytes_read;
      stats_.bytes_written += delta.bytes_written;
      stats_.connect_errors += delta.connect_errors;
      stats_.tls_errors += delta.tls_errors;
      stats_.auth_errors += delta.auth_errors;
      stats_.io_errors += delta.io_errors;
      stats_.timeouts += delta.timeouts;
      stats_.protocol_errors += delta.protocol_errors;
      stats_.oversized += delta.oversized;
    }
    // Stats first: a caller that sees the job finished sees its counters too.
    for (std::size_t i = 0; i < n; ++i) queue().done(tasks[i], ok[i]);
  }
}

}  // namespace kvoffload
