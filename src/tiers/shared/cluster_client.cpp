// The cluster layer over our connections (include/kvoffload/cluster_client.hpp). How it follows the
// cluster specification, as the common cluster clients (hiredis-cluster, redis-py's
// RedisCluster, Jedis) do:
// - the slot map comes from CLUSTER SLOTS of any reachable node (the seeds first time, then the
//   known nodes); an empty host in an entry means the node answering; a node that answers
//   that cluster support is disabled is a standalone server and owns every slot;
// - a command goes to its slot's master; MOVED updates that slot and schedules a full reload
//   before the next batch; ASK sends ASKING and the command to the node named, once, without
//   touching the map; more than max_redirects hops fail the command; an empty host in a
//   redirect (Redis 7+) means the node that sent it;
// - every node gets its commands as one pipelined batch (all are written, then the replies of
//   every node are read as they arrive, a poll() over their connections, so a slow node holds
//   back only its own commands), on one connection per node with a deadline on the connect, on
//   each write and on each whole reply (node_connection.hpp), every reply bounded
//   (resp_reader.hpp);
// - an I/O error (timeout, reset, malformed reply) drops the connection: the commands of that
//   batch without a reply fail, the node is skipped (a jittered backoff that doubles at each
//   failure in a row), the map is reloaded; nodes the new map no longer names are disconnected.

#include "kvoffload/tiers/cluster_client.hpp"

#include <poll.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>

#include "common/expects.hpp"
#include "common/logging.hpp"
#include "tiers/shared/cluster_slot.hpp"
#include "tiers/shared/node_connection.hpp"

namespace kvoffload {
namespace {

using Clock = std::chrono::steady_clock;

// What an ACL refusal's warning adds: the commands the tier's user needs.
constexpr std::string_view kAclNeeded =
    "the server needs AUTH with a user allowed cluster|slots, asking, get, set, setex and "
    "exists on kvo:*";

bool is_acl_refusal(std::string_view text) {
  return text.starts_with("NOPERM") || text.starts_with("NOAUTH") || text.starts_with("WRONGPASS");
}

/// "host:port" (the port after the last ':', so IPv6 addresses work); nullopt if malformed.
std::optional<ClusterAddress> split_address(std::string_view text) {
  const std::size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon + 1 >= text.size()) return std::nullopt;
  int port = 0;
  const std::string_view digits = text.substr(colon + 1);
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (ec != std::errc{} || end != digits.data() + digits.size() || port <= 0 || port > 65535) {
    return std::nullopt;
  }
  // A cluster bus suffix ("host:port@bus") is not part of a reply address; refused here.
  return ClusterAddress{std::string(text.substr(0, colon)), port};
}

}  // namespace

struct ClusterHealth::Impl {
  mutable std::mutex mutex;
  std::map<std::pair<std::string, int>, Clock::time_point> down;
};

ClusterHealth::ClusterHealth() : impl_(std::make_unique<Impl>()) {}
ClusterHealth::~ClusterHealth() = default;

ClusterHealth::Clock::time_point ClusterHealth::down_until(const ClusterAddress& a) const {
  const std::lock_guard lock(impl_->mutex);
  const auto it = impl_->down.find({a.host, a.port});
  return it == impl_->down.end() ? Clock::time_point{} : it->second;
}

void ClusterHealth::mark_down(const ClusterAddress& a, Clock::time_point until) {
  const std::lock_guard lock(impl_->mutex);
  Clock::time_point& t = impl_->down[{a.host, a.port}];
  t = std::max(t, until);
}

void ClusterHealth::mark_up(const ClusterAddress& a) {
  const std::lock_guard lock(impl_->mutex);
  impl_->down.erase({a.host, a.port});
}

std::vector<ClusterAddress> parse_cluster_nodes(std::string_view text, std::string_view field) {
  std::vector<ClusterAddress> out;
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    const std::string_view entry = text.substr(0, comma);
    const auto address = split_address(entry);
    KVOFFLOAD_EXPECTS(address && !address->host.empty(),
                      "{}: \"{}\" is not host:port (a port from 1 to 65535)", field, entry);
    out.push_back(*address);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  KVOFFLOAD_EXPECTS(!out.empty(), "{}: no node given (host:port[,host:port...])", field);
  return out;
}

int cluster_key_slot(std::string_view key) noexcept {
  return detail::cluster_slot(key);
}

struct ClusterClient::Impl {
  struct Node {
    ClusterAddress address;
    std::unique_ptr<detail::NodeConnection> conn;
    Clock::time_point down_until{};
    int failures = 0;  // in a row: the backoff doubles with each
    bool seed = false;
  };
  /// A command in flight: where it goes next and how often it was redirected.
  struct Pending {
    std::size_t index = 0;
    int node = -1;
    bool asking = false;
    int hops = 0;
  };

  ClusterClientConfig config;
  // Seeds first, then the nodes the map names. A deque: node_of adds nodes while references to
  // others are held (a redirect read in the middle of a batch), which must stay valid.
  std::deque<Node> nodes;
  std::array<int, detail::kClusterSlots> slots{};
  bool have_map = false;
  bool map_stale = true;
  ClusterStats stats;
  // Commands encoded for one node's batch: heads[i] holds headers and small arguments;
  // iov_ref lists what to send in order (a head, or a piece of a value sent in place).
  static constexpr std::size_t kNoHead = static_cast<std::size_t>(-1);
  std::vector<std::string> heads;
  std::vector<std::pair<std::size_t, std::string_view>> iov_ref;
  std::size_t encoded_bytes = 0;  // in heads and iov_ref, not yet sent
  static constexpr std::size_t kFlushBytes = 1 << 20;
  // Nodes known at most: a slot map can name 16384 (one per slot), each a connect to try.
  static constexpr std::size_t kMaxNodes = 1024;
  std::shared_ptr<std::atomic<bool>> cancelled;
  std::unique_ptr<detail::TlsContext> tls;  // null: plain TCP
  std::minstd_rand jitter{std::random_device{}()};
  std::string last_error;
  // The warnings already logged (an operator's mistake is said once, not at every retry).
  std::string warned;

  explicit Impl(ClusterClientConfig c)
      : config(std::move(c)),
        cancelled(config.cancel != nullptr ? config.cancel
                                           : std::make_shared<std::atomic<bool>>(false)) {
    slots.fill(-1);
    for (const ClusterAddress& a : config.seeds) {
      const int i = node_of(a);
      if (i >= 0) nodes[static_cast<std::size_t>(i)].seed = true;
    }
    if (config.tls.enabled) tls = std::make_unique<detail::TlsContext>(config.tls);
  }

  /// The node's index, added if new; -1 once kMaxNodes are known (a slot map or redirect
  /// naming more is not followed there: its slots have no owner).
  int node_of(const ClusterAddress& a) {
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      if (nodes[i].address.port == a.port && nodes[i].address.host == a.host) {
        return static_cast<int>(i);
      }
    }
    if (nodes.size() >= kMaxNodes) return -1;
    nodes.push_back(Node{a, nullptr, {}, 0, false});
    return static_cast<int>(nodes.size() - 1);
  }

  /// `what` may be the connection's own error text: it is logged before the connection goes.
  void mark_down(Node& n, std::string_view what) {
    ++n.failures;
    // Doubles at each failure in a row, capped; drawn from [0.5, 1.5) of that.
    const int shift = std::min(n.failures - 1, 16);
    const auto base = static_cast<double>(
        std::min<long long>(static_cast<long long>(config.down_backoff_ms) << shift,
                            std::max(config.max_backoff_ms, config.down_backoff_ms)));
    const double wait = base * std::uniform_real_distribution<double>(0.5, 1.5)(jitter);
    detail::logger().debug("cluster: {}:{}: {}; skipped for {:.0f} ms", n.address.host,
                           n.address.port, what, wait);
    n.down_until = Clock::now() + std::chrono::microseconds(static_cast<long long>(wait * 1000));
    if (config.health) config.health->mark_down(n.address, n.down_until);
    n.conn.reset();
    map_stale = true;
  }

  /// The node answered a whole batch in time: its failures in a row end (a node that accepts
  /// connections and then stalls keeps doubling its backoff).
  void node_answered(Node& n) {
    if (n.failures == 0) return;
    n.failures = 0;
    if (config.health) config.health->mark_up(n.address);
  }

  /// A connection dropped mid-command: counted by why.
  void count_failure(const detail::NodeConnection& c) {
    ++stats.io_errors;
    if (c.failure() == detail::IoFailure::timeout) ++stats.timeouts;
    if (c.failure() == detail::IoFailure::protocol) ++stats.protocol_errors;
  }

  void note_error(const Node& n, std::string_view what, bool warn) {
    last_error = fmt::format("{}:{}: {}", n.address.host, n.address.port, what);
    if (warn && warned != last_error) {
      detail::logger().warn("cluster: {}", last_error);
      warned = last_error;
    }
  }

  bool connect(Node& n) {
    const Clock::time_point now = Clock::now();
    if (config.health && now < config.health->down_until(n.address)) {
      n.conn.reset();  // another client found it down or slow: skipped here too, until then
      return false;
    }
    if (n.conn != nullptr) return true;
    if (cancelled->load(std::memory_order_relaxed)) return false;
    if (now < n.down_until) return false;
    if (config.only_seeds && !n.seed) {
      ++stats.connect_errors;
      mark_down(n, "not a seed, and only_seeds is set");
      return false;
    }
    detail::ConnectionOptions o;
    o.connect_timeout_ms = config.connect_timeout_ms;
    o.reply_timeout_ms = config.reply_timeout_ms;
    o.min_rate_bytes_per_s = config.min_rate_bytes_per_s;
    o.tls = tls.get();
    o.username = config.username;
    o.password = config.password;
    o.keepalive = config.keepalive;
    o.cancel = cancelled.get();
    detail::ConnectFailure failure = detail::ConnectFailure::none;
    std::string why;
    n.conn = detail::NodeConnection::open(n.address, o, failure, why);
    if (n.conn == nullptr) {
      // TLS and AUTH failures are an operator's to fix: said at warning level, once.
      switch (failure) {
        case detail::ConnectFailure::tls: ++stats.tls_errors; break;
        case detail::ConnectFailure::auth: ++stats.auth_errors; break;
        default: ++stats.connect_errors; break;
      }
      note_error(n, why, failure != detail::ConnectFailure::network);
      mark_down(n, why);
      return false;
    }
    ++stats.connects;
    return true;
  }

  /// Encodes one command (a RESP array of bulk strings) as iovecs: the headers and small
  /// arguments go to `heads` (kept until sent), a value's pieces are sent from where they are.
  void encode(std::span<const std::string_view> args, std::span<const std::string_view> value) {
    std::string& head = heads.emplace_back();
    std::size_t value_size = 0;
    for (const std::string_view p : value) value_size += p.size();
    head = fmt::format("*{}\r\n", args.size() + (value.empty() ? 0 : 1));
    for (const std::string_view a : args) {
      fmt::format_to(std::back_inserter(head), "${}\r\n", a.size());
      head += a;
      head += "\r\n";
    }
    encoded_bytes += head.size();
    if (value.empty()) {
      iov_ref.push_back({heads.size() - 1, {}});
      return;
    }
    encoded_bytes += value_size;
    fmt::format_to(std::back_inserter(head), "${}\r\n", value_size);
    iov_ref.push_back({heads.size() - 1, {}});
    for (const std::string_view p : value) iov_ref.push_back({kNoHead, p});
    iov_ref.push_back({kNoHead, "\r\n"});
  }

  /// Writes every encoded command to the node's connection (values are not copied). False on
  /// an error or a missed deadline (the reply timeout, per write).
  bool send_encoded(Node& n, Clock::time_point deadline) {
    std::vector<iovec> iov;
    iov.reserve(iov_ref.size());
    for (const auto& [head, piece] : iov_ref) {
      const std::string_view bytes = head == kNoHead ? piece : std::string_view(heads[head]);
      if (bytes.empty()) continue;
      iov.push_back({const_cast<char*>(bytes.data()), bytes.size()});
    }
    const auto clear = [this] {  // after the writes: the iovecs point into heads
      heads.clear();
      iov_ref.clear();
      encoded_bytes = 0;
    };
    const bool ok = n.conn->write_all(iov, deadline);
    clear();
    return ok;
  }

  bool load_map_from(std::size_t index) {
    Node& n = nodes[index];  // a deque: stays valid while node_of adds nodes
    if (!connect(n)) return false;
    static constexpr std::array<std::string_view, 2> kSlots{"CLUSTER", "SLOTS"};
    detail::RespValue reply;
    if (!n.conn->command(kSlots, reply)) {
      count_failure(*n.conn);
      note_error(n, "CLUSTER SLOTS got no reply: " + n.conn->error(), false);
      mark_down(n, "CLUSTER SLOTS got no reply");
      return false;
    }
    std::array<int, detail::kClusterSlots> map;
    map.fill(-1);
    using detail::RespType;
    if (reply.type == RespType::error &&
        reply.text.find("cluster support disabled") != std::string::npos) {
      // A standalone server: it owns every slot.
      map.fill(static_cast<int>(index));
      install_map(map);
      node_answered(n);
      return true;
    }
    if (reply.type == RespType::error && is_acl_refusal(reply.text)) {
      // Connected, but the server wants a user and password we did not give, or the user
      // may not read the slot map.
      ++stats.auth_errors;
      note_error(n, fmt::format("{} ({})", reply.text, kAclNeeded), true);
      mark_down(n, "AUTH needed");
      return false;
    }
    bool ok = reply.type == RespType::array;
    for (std::size_t i = 0; ok && i < reply.elements.size(); ++i) {
      const detail::RespValue& e = reply.elements[i];
      // [start, end, [host, port, id...], replicas...]
      ok = e.type == RespType::array && e.elements.size() >= 3 &&
           e.elements[0].type == RespType::integer && e.elements[1].type == RespType::integer &&
           e.elements[2].type == RespType::array && e.elements[2].elements.size() >= 2 &&
           e.elements[2].elements[0].type == RespType::string &&
           e.elements[2].elements[1].type == RespType::integer;
      if (!ok) break;
      const long long first = e.elements[0].integer;
      const long long last = e.elements[1].integer;
      const long long port = e.elements[2].elements[1].integer;
      ok = first >= 0 && first <= last && last < detail::kClusterSlots && port > 0 && port <= 65535;
      if (!ok) break;
      std::string host = e.elements[2].elements[0].text;
      if (host.empty() || host == "?") host = n.address.host;  // "the node you asked"
      const int owner = node_of(ClusterAddress{host, static_cast<int>(port)});
      for (long long s = first; s <= last; ++s) map[static_cast<std::size_t>(s)] = owner;
    }
    if (!ok) {
      // An answer that is not a slot map (an error: cluster support off, say).
      detail::logger().warn("cluster: {}:{} gave no usable CLUSTER SLOTS answer", n.address.host,
                            n.address.port);
      return false;
    }
    install_map(map);
    node_answered(n);
    return true;
  }

  /// The new map; nodes it no longer names (and that are not seeds) are disconnected.
  void install_map(const std::array<int, detail::kClusterSlots>& map) {
    slots = map;
    have_map = true;
    map_stale = false;
    ++stats.refreshes;
    std::vector<bool> named(nodes.size(), false);
    for (const int owner : slots) {
      if (owner >= 0) named[static_cast<std::size_t>(owner)] = true;
    }
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      if (!named[i] && !nodes[i].seed) nodes[i].conn.reset();
    }
  }

  bool refresh() {
    // The seeds and the nodes the current map names: one it dropped (a node that left) is not
    // asked again. node_of may grow `nodes`: index, not iterators.
    std::vector<bool> named(nodes.size(), !have_map);
    for (const int owner : slots) {
      if (owner >= 0) named[static_cast<std::size_t>(owner)] = true;
    }
    const std::size_t known = nodes.size();
    // Each silent node costs a connect and a reply timeout: the nodes asked after the phase
    // budget are not asked this time (the next run asks again).
    const Clock::time_point stop = Clock::now() + phase_budget();
    for (std::size_t i = 0; i < known && Clock::now() < stop; ++i) {
      if (!nodes[i].seed && !named[i]) continue;
      if (load_map_from(i)) return true;
    }
    return false;
  }

  /// How long the connects and writes of one round (or the map's reload) may take in all:
  /// each node's own are bounded by the timeouts, but a map naming many silent nodes would
  /// add them up.
  [[nodiscard]] std::chrono::milliseconds phase_budget(std::uint64_t bytes = 0) const {
    return std::chrono::milliseconds(config.connect_timeout_ms + 2 * config.reply_timeout_ms) +
           transfer_allowance(bytes);
  }

  /// The time `bytes` of values may take on top of a deadline: at the slowest rate a healthy
  /// but busy link is expected to keep up (min_rate_bytes_per_s). A node slower than that
  /// (a drip feed) still misses its deadline, within a time bounded by the batch's size.
  [[nodiscard]] std::chrono::milliseconds transfer_allowance(std::uint64_t bytes) const {
    if (config.min_rate_bytes_per_s == 0) return std::chrono::milliseconds(0);
    return std::chrono::milliseconds(bytes * 1000 / config.min_rate_bytes_per_s);
  }

  /// Parses "MOVED 3999 127.0.0.1:6381" / "ASK ..." into (slot, node); an empty host (Redis
  /// 7+: "MOVED 3999 :6381") is the host of `from`, the node that sent it.
  std::optional<std::pair<int, int>> redirect_target(std::string_view text, int from) {
    const std::size_t a = text.find(' ');
    const std::size_t b = a == std::string_view::npos ? a : text.find(' ', a + 1);
    if (b == std::string_view::npos) return std::nullopt;
    int slot = -1;
    const std::string_view s = text.substr(a + 1, b - a - 1);
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), slot);
    if (ec != std::errc{} || slot < 0 || slot >= detail::kClusterSlots) return std::nullopt;
    auto address = split_address(text.substr(b + 1));
    if (!address) return std::nullopt;
    if (address->host.empty()) address->host = nodes[static_cast<std::size_t>(from)].address.host;
    const int node = node_of(*address);
    if (node < 0) return std::nullopt;
    return std::pair{slot, node};
  }

  void run(std::span<const ClusterCommand> commands,
           const std::function<void(std::size_t, const ClusterReply&)>& on_reply) {
    stats.commands += commands.size();
    if (!cancelled->load(std::memory_order_relaxed) && (!have_map || map_stale)) (void)refresh();
    const auto fail = [&](std::size_t i) {
      ++stats.failed;
      on_reply(i, ClusterReply{});
    };
    std::vector<Pending> pending;
    pending.reserve(commands.size());
    for (std::size_t i = 0; i < commands.size(); ++i) {
      pending.push_back(
          Pending{i, slots[static_cast<std::size_t>(detail::cluster_slot(commands[i].key))]});
    }
    std::vector<Pending> next;
    std::vector<std::pair<int, std::vector<Pending>>> batches;
    while (!pending.empty()) {
      next.clear();
      // One batch per node, in the order the nodes first appear: all are sent, then the
      // replies read, so the nodes work at the same time.
      batches.clear();
      for (const Pending& p : pending) {
        auto it = std::find_if(batches.begin(), batches.end(),
                               [&](const auto& b) { return b.first == p.node; });
        if (it == batches.end()) it = batches.insert(batches.end(), {p.node, {}});
        it->second.push_back(p);
      }
      std::vector<bool> sent(batches.size(), false);
      std::uint64_t value_bytes = 0;  // what the round writes: its values
      for (const Pending& p : pending) {
        for (const std::string_view piece : commands[p.index].value) value_bytes += piece.size();
      }
      const Clock::time_point send_stop = Clock::now() + phase_budget(value_bytes);
      for (std::size_t b = 0; b < batches.size(); ++b) {
        // Past the round's budget the remaining nodes' commands fail untried (counted as
        // failed; the nodes are not marked down: nothing is known of them).
        sent[b] = Clock::now() < send_stop &&
                  send_batch(batches[b].first, batches[b].second, commands, send_stop);
        if (!sent[b]) {
          for (const Pending& p : batches[b].second) fail(p.index);
        }
      }
      read_batches(batches, sent, commands, on_reply, fail, next);
      pending.swap(next);
    }
  }

  /// Connects if needed and writes the batch's commands; false if the node is down or the
  /// write failed (the node is then marked down).
  bool send_batch(int node, std::span<const Pending> batch,
                  std::span<const ClusterCommand> commands, Clock::time_point stop) {
    if (node < 0 || !connect(nodes[static_cast<std::size_t>(node)])) return false;
    Node& n = nodes[static_cast<std::size_t>(node)];
    static constexpr std::array<std::string_view, 1> kAsking{"ASKING"};
    // One deadline for the whole batch's writes (the reply timeout plus its values at the
    // minimum rate), within the round's: a node reading slower than that misses it however
    // the batch is cut into writes.
    std::uint64_t value_bytes = 0;
    for (const Pending& p : batch) {
      for (const std::string_view piece : commands[p.index].value) value_bytes += piece.size();
    }
    const Clock::time_point deadline =
        std::min(stop, Clock::now() + std::chrono::milliseconds(config.reply_timeout_ms) +
                           transfer_allowance(value_bytes));
    bool ok = true;
    for (const Pending& p : batch) {
      const ClusterCommand& c = commands[p.index];
      if (c.before_send) {
        // What is encoded so far goes out first (once it is worth a system call): the node
        // works on it meanwhile.
        if (encoded_bytes >= kFlushBytes) ok = ok && send_encoded(n, deadline);
        c.before_send();
      }
      if (p.asking) encode(kAsking, {});
      encode(c.args, c.value);
    }
    ok = ok && send_encoded(n, deadline);
    heads.clear();
    iov_ref.clear();
    encoded_bytes = 0;
    if (!ok) {
      detail::logger().debug("cluster: sending to {}:{} failed: {}", n.address.host, n.address.port,
                             n.conn->error());
      count_failure(*n.conn);
      mark_down(n, "send failed");
    }
    return ok;
  }

  using OnReply = std::function<void(std::size_t, const ClusterReply&)>;

  /// One node's batch being read: the command whose reply comes next, and the deadline of
  /// every reply of the batch (the reply timeout from when the batches were written: a node
  /// that answers each reply just inside a per-reply timeout still misses it).
  struct Reading {
    int node = -1;
    std::span<const Pending> batch;
    std::size_t next = 0;
    bool asking_read = false;  // the next command's ASKING was answered
    bool started = false;      // its reply's destination was given to the reader
    Clock::time_point deadline;
    detail::RespValue reply;  // being parsed: stays put while the Reading lives
  };

  /// Reads every sent batch's replies at once: whichever node has bytes is parsed, so a slow
  /// node holds back only its own commands (each by at most one deadline, then it is
  /// dropped); the others' replies are passed on as they arrive.
  void read_batches(const std::vector<std::pair<int, std::vector<Pending>>>& batches,
                    const std::vector<bool>& sent, std::span<const ClusterCommand> commands,
                    const OnReply& on_reply, const std::function<void(std::size_t)>& fail,
                    std::vector<Pending>& next) {
    const auto timeout = std::chrono::milliseconds(config.reply_timeout_ms);
    std::vector<Reading> reading(batches.size());  // never resized: each reply stays put
    for (std::size_t b = 0; b < batches.size(); ++b) {
      Reading& g = reading[b];
      g.node = batches[b].first;
      g.batch = batches[b].second;
      g.next = sent[b] ? 0 : g.batch.size();
      // The reply timeout, plus the time the values it reads may take at the minimum rate.
      std::uint64_t expected = 0;
      for (const Pending& p : g.batch) {
        expected += commands[p.index].reply_prefix + commands[p.index].reply_into.size();
      }
      g.deadline = Clock::now() + timeout + transfer_allowance(expected);
    }
    std::vector<pollfd> fds;
    std::vector<Reading*> polled;
    for (;;) {
      for (Reading& g : reading) advance(g, commands, on_reply, fail, next);
      fds.clear();
      polled.clear();
      const Clock::time_point now = Clock::now();
      Clock::time_point wake = now + std::chrono::milliseconds(detail::kCancelPollMs);
      const bool stop = cancelled->load(std::memory_order_relaxed);
      for (Reading& g : reading) {
        if (g.next >= g.batch.size()) continue;
        detail::NodeConnection& c = *nodes[static_cast<std::size_t>(g.node)].conn;
        if (stop || now >= g.deadline) {
          (void)(stop ? c.give_up(detail::IoFailure::other, "cancelled") : c.timed_out());
          drop(g, fail);
          continue;
        }
        fds.push_back(pollfd{c.fd(), c.want_events(), 0});
        polled.push_back(&g);
        wake = std::min(wake, g.deadline);
        if (c.has_pending()) wake = now;  // bytes TLS holds: parse them without waiting
      }
      if (fds.empty()) return;
      const auto ms = std::chrono::ceil<std::chrono::milliseconds>(wake - now).count();
      (void)::poll(fds.data(), fds.size(), static_cast<int>(std::max<long long>(ms, 0)));
    }
  }

  /// Parses what `g`'s node has sent, passing each whole reply on; drops the node on a
  /// failure.
  void advance(Reading& g, std::span<const ClusterCommand> commands, const OnReply& on_reply,
               const std::function<void(std::size_t)>& fail, std::vector<Pending>& next) {
    while (g.next < g.batch.size()) {
      const Pending& p = g.batch[g.next];
      detail::NodeConnection& c = *nodes[static_cast<std::size_t>(g.node)].conn;
      const bool asking_reply = p.asking && !g.asking_read;  // +OK to ASKING comes first
      if (!g.started) {
        const ClusterCommand& command = commands[p.index];
        if (!asking_reply && !command.reply_into.empty()) {
          c.expect(command.reply_into, command.reply_prefix);
        }
        // The tier's commands get a status, an integer, an error or a value (read in place
        // or skipped): 64 KiB by default, not the 8 MiB a slot map may need.
        c.limit_next(command.max_reply_bytes);
        g.started = true;
      }
      const int got = c.poll_reply(g.reply);
      if (got == 0) return;
      if (got < 0) return drop(g, fail);
      g.started = false;
      if (asking_reply) {
        g.asking_read = true;
        continue;
      }
      g.asking_read = false;
      ++g.next;
      dispatch(g.node, p, g.reply, on_reply, fail, next);
      if (g.next == g.batch.size()) {
        if (c.buffered() > 0) {
          // Bytes nobody asked for: the next batch's replies would be out of step.
          (void)c.give_up(detail::IoFailure::protocol, "bytes after the last reply of a batch");
          return drop(g, fail);
        }
        node_answered(nodes[static_cast<std::size_t>(g.node)]);
      }
    }
  }

  /// The node of `g` failed mid-batch: counted, marked down, and its unanswered commands fail.
  void drop(Reading& g, const std::function<void(std::size_t)>& fail) {
    Node& n = nodes[static_cast<std::size_t>(g.node)];
    count_failure(*n.conn);
    note_error(n, n.conn->error(), false);
    mark_down(n, n.conn->error());
    for (std::size_t i = g.next; i < g.batch.size(); ++i) fail(g.batch[i].index);
    g.next = g.batch.size();
  }

  /// One reply to command p: passed on, or followed (MOVED, ASK) into `next`.
  void dispatch(int node, const Pending& p, const detail::RespValue& r, const OnReply& on_reply,
                const std::function<void(std::size_t)>& fail, std::vector<Pending>& next) {
    if (r.skipped) {
      ++stats.oversized;
      ClusterReply skipped;
      skipped.kind = ClusterReplyKind::string;
      skipped.oversized = true;
      on_reply(p.index, skipped);
      return;
    }
    ClusterReply reply;
    switch (r.type) {
      case detail::RespType::string:
        reply.kind = ClusterReplyKind::string;
        reply.text = r.text;
        reply.in_place = r.in_place;
        break;
      case detail::RespType::nil: reply.kind = ClusterReplyKind::nil; break;
      case detail::RespType::integer:
        reply.kind = ClusterReplyKind::integer;
        reply.integer = r.integer;
        break;
      case detail::RespType::status:
        reply.kind = ClusterReplyKind::status;
        reply.text = r.text;
        break;
      case detail::RespType::array: reply.kind = ClusterReplyKind::array; break;
      case detail::RespType::error:
        reply.kind = ClusterReplyKind::error;
        reply.text = r.text;
        break;
    }
    const bool moved = reply.kind == ClusterReplyKind::error && reply.text.starts_with("MOVED ");
    const bool ask = reply.kind == ClusterReplyKind::error && reply.text.starts_with("ASK ");
    if (!moved && !ask) {
      if (reply.kind == ClusterReplyKind::error && is_acl_refusal(reply.text)) {
        // A user that may read but not write (or the reverse): the operator's to fix.
        ++stats.auth_errors;
        note_error(nodes[static_cast<std::size_t>(node)],
                   fmt::format("{} ({})", reply.text, kAclNeeded), true);
      }
      on_reply(p.index, reply);
      return;
    }
    const auto target = redirect_target(reply.text, node);
    if (!target || p.hops >= config.max_redirects) {
      detail::logger().debug("cluster: command {} not followed: {}", p.index, reply.text);
      fail(p.index);
      return;
    }
    if (moved) {
      ++stats.moved;
      slots[static_cast<std::size_t>(target->first)] = target->second;
      map_stale = true;
    } else {
      ++stats.asked;
    }
    next.push_back(Pending{p.index, target->second, ask, p.hops + 1});
  }
};

ClusterClient::ClusterClient(ClusterClientConfig config) {
  KVOFFLOAD_EXPECTS(!config.seeds.empty(), "cluster client: no seed node given");
  KVOFFLOAD_EXPECTS(config.connect_timeout_ms > 0 && config.reply_timeout_ms > 0 &&
                        config.connect_timeout_ms <= 3600000 && config.reply_timeout_ms <= 3600000,
                    "cluster client: connect_timeout_ms ({}) and reply_timeout_ms ({}) must be "
                    "from 1 to 3600000 (an hour)",
                    config.connect_timeout_ms, config.reply_timeout_ms);
  KVOFFLOAD_EXPECTS(config.min_rate_bytes_per_s == 0 || config.min_rate_bytes_per_s >= (64u << 10),
                    "cluster client: min_rate_bytes_per_s ({}) must be 0 (no allowance) or at "
                    "least 65536: a lower rate makes a deadline of days",
                    config.min_rate_bytes_per_s);
  KVOFFLOAD_EXPECTS(
      config.max_redirects >= 0 && config.down_backoff_ms >= 0 && config.max_backoff_ms >= 0,
      "cluster client: max_redirects ({}), down_backoff_ms ({}) and max_backoff_ms "
      "({}) must be >= 0",
      config.max_redirects, config.down_backoff_ms, config.max_backoff_ms);
  impl_ = std::make_unique<Impl>(std::move(config));
}

ClusterClient::~ClusterClient() = default;

void ClusterClient::run(std::span<const ClusterCommand> commands,
                        const std::function<void(std::size_t, const ClusterReply&)>& on_reply) {
  impl_->run(commands, on_reply);
}

void ClusterClient::cancel() noexcept {
  impl_->cancelled->store(true);
}

bool ClusterClient::refresh() {
  return impl_->refresh();
}

ClusterStats ClusterClient::stats() const noexcept {
  return impl_->stats;
}

std::string ClusterClient::last_error() const {
  return impl_->last_error;
}

std::string ClusterClient::owner_of(int slot) const {
  if (slot < 0 || slot >= detail::kClusterSlots) return {};
  const int n = impl_->slots[static_cast<std::size_t>(slot)];
  if (n < 0) return {};
  const ClusterAddress& a = impl_->nodes[static_cast<std::size_t>(n)].address;
  return fmt::format("{}:{}", a.host, a.port);
}

}  // namespace kvoffload
