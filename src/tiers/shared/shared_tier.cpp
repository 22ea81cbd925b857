#include "kvoffload/tiers/shared_tier.hpp"

#include <algorithm>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/expects.hpp"
#include "common/logging.hpp"
#include "kvoffload/tiers/cluster_client.hpp"

namespace kvoffload {
namespace {

// The value header, little-endian (what every supported host is):
//   0 magic u32 | 4 version u32 | 8 layout digest u64 | 16 key hash bytes [32] |
//   48 key hash size u32 | 52 group u32 | 56 payload length u64 | 64 XXH3 of the payload u64 |
//   72 valid_from u32 (SEMANTICS 6.8: first written sub-block) | 76 zero u32
// Only whole blocks go below host memory (valid_from 0); a reader refuses any other value.
// Version 2 added valid_from: values of version 1 predate the rule (some may be partly
// written) and are refused as foreign.
constexpr std::uint32_t kMagic = 0x53564b4b;  // "KKVS"
constexpr std::uint32_t kVersion = 2;

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

}  // namespace

// "v2": the value format of version 2 (valid_from). Values of version 1 live in another
// namespace, so an engine of either version sees the other's values as absent (a plain miss)
// rather than finding them and failing their promotion again at every request.
std::string shared_namespace(std::string_view name, int tp_size, std::int64_t block_size_factor) {
  KVOFFLOAD_EXPECTS(tp_size >= 1, "shared tier: tp_size must be >= 1, got {}", tp_size);
  KVOFFLOAD_EXPECTS(block_size_factor >= 1, "shared tier: block_size_factor must be >= 1, got {}",
                    block_size_factor);
  const std::string text = fmt::format("kvoffload shared tier v2\nname={}\ntp={}\nfactor={}\n",
                                       name, tp_size, block_size_factor);
  return fmt::format("{:016x}", XXH3_64bits(text.data(), text.size()));
}

std::string shared_key(std::string_view ns, const Key& key, int rank) {
  return fmt::format("kvo:{{{}:{}:{}}}:{}", ns, key.group, key.hash.to_hex(), rank);
}

SharedTier::SharedTier(const SharedTierConfig& c, std::int64_t block_size_factor,
                       std::string_view layout, std::uint64_t payload_bytes,
                       std::function<std::span<std::byte>(HostBlockId)> host_block)
    : rank_(c.tp_rank),
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
  ClusterClientConfig cc;
  cc.seeds = parse_cluster_nodes(c.nodes, "shared tier: nodes");
  cc.connect_timeout_ms = c.connect_timeout_ms;
  cc.reply_timeout_ms = c.reply_timeout_ms;
  namespace_ = shared_namespace(c.name, c.tp_size, block_size_factor);  // checks the factor
  client_ = std::make_unique<ClusterClient>(cc);
  const std::string text = fmt::format("kvoffload shared tier v2\nname={}\ntp={}/{}\nlayout={}\n",
                                       c.name, c.tp_rank, c.tp_size, layout);
  digest_ = XXH3_64bits(text.data(), text.size());
  thread_ = std::thread([this] { run(); });
}

SharedTier::~SharedTier() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  thread_.join();
}

void SharedTier::submit(const TierJob& job) {
  KVOFFLOAD_EXPECTS(job.keys.size() == job.host_block_ids.size(),
                    "tier job {}: {} keys but {} host blocks", job.id, job.keys.size(),
                    job.host_block_ids.size());
  for (const HostBlockId id : job.host_block_ids) (void)host_block_(id);  // throws if out of range
  {
    std::lock_guard lock(mutex_);
    KVOFFLOAD_EXPECTS(!open_.contains(job.id), "tier job {}: submitted twice", job.id);
    open_[job.id] = false;
    queue_.push_back(job);
  }
  work_ready_.notify_one();
}

std::vector<FinishedTierJob> SharedTier::get_finished() {
  std::lock_guard lock(mutex_);
  std::vector<FinishedTierJob> out;
  out.swap(finished_);
  for (const FinishedTierJob& f : out) open_.erase(f.job);
  return out;
}

void SharedTier::wait(std::span<const JobId> jobs) {
  std::unique_lock lock(mutex_);
  job_done_.wait(lock, [&] {
    return std::none_of(jobs.begin(), jobs.end(), [&](JobId j) {
      const auto it = open_.find(j);
      return it != open_.end() && !it->second;
    });
  });
}

SharedTierStats SharedTier::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void SharedTier::run() {
  for (;;) {
    TierJob job;
    {
      std::unique_lock lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything submitted has run
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    std::int64_t failed = 0;
    run_job(job, failed);
    {
      std::lock_guard lock(mutex_);
      open_[job.id] = true;
      finished_.push_back(FinishedTierJob{job.id, job.kind, failed == 0, failed});
    }
    job_done_.notify_all();
    if (failed > 0) {
      detail::logger().debug("shared tier: {} job {}: {} of {} block(s) failed",
                             to_string(job.kind), job.id, failed, job.keys.size());
    }
  }
}

void SharedTier::run_job(const TierJob& job, std::int64_t& failed) {
  const bool promote = job.kind == TierJobKind::promote;
  std::vector<std::string> keys;
  std::vector<std::array<std::byte, shared_value_header_bytes>> headers;
  std::vector<ClusterCommand> commands;
  SharedTierStats delta;
  for (std::size_t first = 0; first < job.keys.size();
       first += static_cast<std::size_t>(in_flight_)) {
    const std::size_t n = std::min(job.keys.size() - first, static_cast<std::size_t>(in_flight_));
    keys.resize(n);
    headers.resize(n);
    commands.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const Key& k = job.keys[first + i];
      keys[i] = shared_key(namespace_, k, rank_);
      if (promote) {
        // The payload goes straight into the host block; it counts only once verified (the
        // block is the promotion's alone, and a failed one is never a hit).
        commands[i] = ClusterCommand{
            .key = keys[i],
            .args = {"GET", keys[i]},
            .reply_into = host_block_(job.host_block_ids[first + i]).first(payload_bytes_),
            .reply_prefix = shared_value_header_bytes};
        continue;
      }
      const std::span<std::byte> payload = host_block_(job.host_block_ids[first + i]);
      std::byte* h = headers[i].data();
      std::memset(h, 0, shared_value_header_bytes);
      put<std::uint32_t>(h, 0, kMagic);
      put<std::uint32_t>(h, 4, kVersion);
      put<std::uint64_t>(h, 8, digest_);
      std::memcpy(h + 16, k.hash.data(), k.hash.size());
      put<std::uint32_t>(h, 48, static_cast<std::uint32_t>(k.hash.size()));
      put<std::uint32_t>(h, 52, k.group);
      put<std::uint64_t>(h, 56, payload_bytes_);
      put<std::uint32_t>(h, 72, 0);  // valid_from: the scheduler writes whole blocks only
      commands[i] = ClusterCommand{
          .key = keys[i],
          .args = {"SET", keys[i]},
          .value = {std::string_view(reinterpret_cast<const char*>(h), shared_value_header_bytes),
                    std::string_view(reinterpret_cast<const char*>(payload.data()),
                                     payload_bytes_)},
          // The checksum while the node stores the block before this one.
          .before_send = [h, payload, n = payload_bytes_] {
            put<std::uint64_t>(h, 64, XXH3_64bits(payload.data(), n));
          }};
    }
    client_->run(commands, [&](std::size_t i, const ClusterReply& r) {
      const Key& k = job.keys[first + i];
      if (!promote) {
        if (r.kind == ClusterReplyKind::status && r.text == "OK") {
          ++delta.writes;
          delta.bytes_written += payload_bytes_;
        } else {
          ++delta.write_errors;
          ++failed;
        }
        return;
      }
      if (r.kind == ClusterReplyKind::nil) {
        ++delta.read_misses;  // evicted (or never there) since the existence check
        ++failed;
        return;
      }
      if (r.kind != ClusterReplyKind::string) {
        ++delta.read_errors;
        ++failed;
        return;
      }
      // A value of the right length arrived in place: its header, then the payload's sum.
      const char* v = r.text.data();
      const std::byte* payload = commands[i].reply_into.data();
      const bool valid =
          r.in_place && r.text.size() == shared_value_header_bytes &&
          get<std::uint32_t>(v, 0) == kMagic && get<std::uint32_t>(v, 4) == kVersion &&
          get<std::uint64_t>(v, 8) == digest_ && get<std::uint32_t>(v, 48) == k.hash.size() &&
          std::memcmp(v + 16, k.hash.data(), k.hash.size()) == 0 &&
          get<std::uint32_t>(v, 52) == k.group && get<std::uint64_t>(v, 56) == payload_bytes_ &&
          get<std::uint32_t>(v, 72) == 0 && get<std::uint32_t>(v, 76) == 0 &&
          get<std::uint64_t>(v, 64) == XXH3_64bits(payload, payload_bytes_);
      if (!valid) {
        ++delta.bad_values;
        ++failed;
        return;
      }
      ++delta.reads;
      delta.bytes_read += payload_bytes_;
    });
  }
  std::lock_guard lock(mutex_);
  stats_.reads += delta.reads;
  stats_.read_misses += delta.read_misses;
  stats_.bad_values += delta.bad_values;
  stats_.read_errors += delta.read_errors;
  stats_.writes += delta.writes;
  stats_.write_errors += delta.write_errors;
  stats_.bytes_read += delta.bytes_read;
  stats_.bytes_written += delta.bytes_written;
}

}  // namespace kvoffload
