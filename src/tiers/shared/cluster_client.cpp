// The cluster layer over hiredis (include/kvoffload/cluster_client.hpp). How it follows the
// cluster specification, as the common cluster clients (hiredis-cluster, redis-py's
// RedisCluster, Jedis) do:
// - the slot map comes from CLUSTER SLOTS of any reachable node (the seeds first time, then the
//   known nodes); an empty host in an entry means the node answering; a node that answers
//   that cluster support is disabled is a standalone server and owns every slot;
// - a command goes to its slot's master; MOVED updates that slot and schedules a full reload
//   before the next batch; ASK sends ASKING and the command to the node named, once, without
//   touching the map; more than max_redirects hops fail the command; an empty host in a
//   redirect (Redis 7+) means the node that sent it;
// - every node gets its commands as one pipelined batch (all are written, then the replies are
//   read in order), on one connection per node with a timeout on connect and on every read;
// - an I/O error (timeout, reset, malformed reply) drops the connection: the commands of that
//   batch without a reply fail, the node is skipped (a jittered backoff that doubles at each
//   failure in a row), the map is reloaded; nodes the new map no longer names are disconnected.

#include "kvoffload/tiers/cluster_client.hpp"

#include <hiredis/hiredis.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
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

std::string_view str_of(const redisReply* r) {
  return {r->str, r->len};
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

/// Where the reply being read should put a value's bytes (ClusterCommand::reply_into).
struct InPlace {
  std::span<std::byte> into;
  std::size_t prefix = 0;
  bool done = false;  // the reply's bytes after `prefix` went to `into`
};

// hiredis's reply objects, built as its default functions build them (freeReplyObject frees
// them), except that a top-level bulk string of exactly prefix + into.size() bytes goes
// straight to `into`, leaving only the prefix in the reply: one copy less for large values.
redisReply* new_reply() {
  return static_cast<redisReply*>(std::calloc(1, sizeof(redisReply)));
}

void attach(const redisReadTask* task, redisReply* r) {
  if (task->parent != nullptr) {
    auto* parent = static_cast<redisReply*>(task->parent->obj);
    parent->element[task->idx] = r;
  }
}

void* create_string(const redisReadTask* task, char* str, size_t len) {
  redisReply* r = new_reply();
  if (r == nullptr) return nullptr;
  r->type = task->type;
  auto* where = static_cast<InPlace*>(task->privdata);
  std::size_t keep = len;
  if (where != nullptr && task->parent == nullptr && task->type == REDIS_REPLY_STRING &&
      !where->into.empty() && len == where->prefix + where->into.size()) {
    std::memcpy(where->into.data(), str + where->prefix, where->into.size());
    where->done = true;
    keep = where->prefix;
  }
  auto* buf = static_cast<char*>(std::malloc(keep + 1));
  if (buf == nullptr) {
    std::free(r);
    return nullptr;
  }
  std::memcpy(buf, str, keep);
  buf[keep] = '\0';
  r->str = buf;
  r->len = keep;
  attach(task, r);
  return r;
}

void* create_array(const redisReadTask* task, int elements) {
  redisReply* r = new_reply();
  if (r == nullptr) return nullptr;
  r->type = REDIS_REPLY_ARRAY;
  if (elements > 0) {
    r->element = static_cast<redisReply**>(
        std::calloc(static_cast<std::size_t>(elements), sizeof(redisReply*)));
    if (r->element == nullptr) {
      std::free(r);
      return nullptr;
    }
  }
  r->elements = static_cast<std::size_t>(std::max(elements, 0));
  attach(task, r);
  return r;
}

void* create_integer(const redisReadTask* task, long long value) {
  redisReply* r = new_reply();
  if (r == nullptr) return nullptr;
  r->type = REDIS_REPLY_INTEGER;
  r->integer = value;
  attach(task, r);
  return r;
}

void* create_nil(const redisReadTask* task) {
  redisReply* r = new_reply();
  if (r == nullptr) return nullptr;
  r->type = REDIS_REPLY_NIL;
  attach(task, r);
  return r;
}

redisReplyObjectFunctions kReplyFunctions = {create_string, create_array, create_integer,
                                             create_nil, freeReplyObject};

}  // namespace

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
  // The destination of the reply being read (ClusterCommand::reply_into), for createString.
  InPlace in_place;
  std::unique_ptr<detail::TlsContext> tls;  // null: plain TCP
  std::minstd_rand jitter{std::random_device{}()};
  std::string last_error;
  // The warnings already logged (an operator's mistake is said once, not at every retry).
  std::string warned;

  explicit Impl(ClusterClientConfig c) : config(std::move(c)) {
    slots.fill(-1);
    for (const ClusterAddress& a : config.seeds)
      nodes[static_cast<std::size_t>(node_of(a))].seed = true;
    if (config.tls.enabled) tls = std::make_unique<detail::TlsContext>(config.tls);
  }

  int node_of(const ClusterAddress& a) {
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      if (nodes[i].address.port == a.port && nodes[i].address.host == a.host) {
        return static_cast<int>(i);
      }
    }
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
    n.conn.reset();
    map_stale = true;
  }

  void note_error(const Node& n, std::string_view what, bool warn) {
    last_error = fmt::format("{}:{}: {}", n.address.host, n.address.port, what);
    if (warn && warned != last_error) {
      detail::logger().warn("cluster: {}", last_error);
      warned = last_error;
    }
  }

  bool connect(Node& n) {
    if (n.conn != nullptr) return true;
    if (Clock::now() < n.down_until) return false;
    if (config.only_seeds && !n.seed) {
      ++stats.connect_errors;
      mark_down(n, "not a seed, and only_seeds is set");
      return false;
    }
    detail::ConnectionOptions o;
    o.connect_timeout_ms = config.connect_timeout_ms;
    o.reply_timeout_ms = config.reply_timeout_ms;
    o.tls = tls.get();
    o.username = config.username;
    o.password = config.password;
    o.keepalive = config.keepalive;
    o.functions = &kReplyFunctions;  // in-place values
    o.privdata = &in_place;
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
    n.failures = 0;
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
  /// an error or a timeout (SO_SNDTIMEO, set with the reply timeout).
  bool send_encoded(Node& n) {
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
    const bool ok = n.conn->write_all(iov);
    clear();
    return ok;
  }

  bool load_map_from(std::size_t index) {
    Node& n = nodes[index];  // a deque: stays valid while node_of adds nodes
    if (!connect(n)) return false;
    static constexpr std::array<std::string_view, 2> kSlots{"CLUSTER", "SLOTS"};
    void* raw = nullptr;
    if (!n.conn->command(kSlots, &raw)) {
      ++stats.io_errors;
      note_error(n, "CLUSTER SLOTS got no reply: " + n.conn->error(), false);
      mark_down(n, "CLUSTER SLOTS got no reply");
      return false;
    }
    auto* reply = static_cast<redisReply*>(raw);
    std::array<int, detail::kClusterSlots> map;
    map.fill(-1);
    if (reply->type == REDIS_REPLY_ERROR &&
        str_of(reply).find("cluster support disabled") != std::string_view::npos) {
      // A standalone server: it owns every slot.
      freeReplyObject(reply);
      map.fill(static_cast<int>(index));
      install_map(map);
      return true;
    }
    if (reply->type == REDIS_REPLY_ERROR &&
        (str_of(reply).starts_with("NOAUTH") || str_of(reply).starts_with("WRONGPASS") ||
         str_of(reply).starts_with("NOPERM"))) {
      // Connected, but the server wants a user and password we did not give, or the user
      // may not read the slot map.
      ++stats.auth_errors;
      note_error(n,
                 fmt::format("{} (the server needs AUTH with a user allowed cluster|slots, "
                             "asking, get, set, setex and exists)",
                             str_of(reply)),
                 true);
      freeReplyObject(reply);
      mark_down(n, "AUTH needed");
      return false;
    }
    bool ok = reply->type == REDIS_REPLY_ARRAY;
    for (std::size_t i = 0; ok && i < reply->elements; ++i) {
      const redisReply* e = reply->element[i];
      // [start, end, [host, port, id...], replicas...]
      ok = e->type == REDIS_REPLY_ARRAY && e->elements >= 3 &&
           e->element[0]->type == REDIS_REPLY_INTEGER &&
           e->element[1]->type == REDIS_REPLY_INTEGER && e->element[2]->type == REDIS_REPLY_ARRAY &&
           e->element[2]->elements >= 2 && e->element[2]->element[0]->type == REDIS_REPLY_STRING &&
           e->element[2]->element[1]->type == REDIS_REPLY_INTEGER;
      if (!ok) break;
      const long long first = e->element[0]->integer;
      const long long last = e->element[1]->integer;
      const long long port = e->element[2]->element[1]->integer;
      ok = first >= 0 && first <= last && last < detail::kClusterSlots && port > 0 && port <= 65535;
      if (!ok) break;
      std::string host(str_of(e->element[2]->element[0]));
      if (host.empty() || host == "?") host = n.address.host;  // "the node you asked"
      const int owner = node_of(ClusterAddress{host, static_cast<int>(port)});
      for (long long s = first; s <= last; ++s) map[static_cast<std::size_t>(s)] = owner;
    }
    freeReplyObject(reply);
    if (!ok) {
      // An answer that is not a slot map (an error: cluster support off, say).
      detail::logger().warn("cluster: {}:{} gave no usable CLUSTER SLOTS answer", n.address.host,
                            n.address.port);
      return false;
    }
    install_map(map);
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
    for (std::size_t i = 0; i < known; ++i) {
      if (!nodes[i].seed && !named[i]) continue;
      if (load_map_from(i)) return true;
    }
    return false;
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
    return std::pair{slot, node_of(*address)};
  }

  void run(std::span<const ClusterCommand> commands,
           const std::function<void(std::size_t, const ClusterReply&)>& on_reply) {
    stats.commands += commands.size();
    if (!have_map || map_stale) (void)refresh();
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
      for (std::size_t b = 0; b < batches.size(); ++b) {
        sent[b] = send_batch(batches[b].first, batches[b].second, commands);
        if (!sent[b]) {
          for (const Pending& p : batches[b].second) fail(p.index);
        }
      }
      for (std::size_t b = 0; b < batches.size(); ++b) {
        if (sent[b])
          read_batch(batches[b].first, batches[b].second, commands, on_reply, fail, next);
      }
      pending.swap(next);
    }
  }

  /// Connects if needed and writes the batch's commands; false if the node is down or the
  /// write failed (the node is then marked down).
  bool send_batch(int node, std::span<const Pending> batch,
                  std::span<const ClusterCommand> commands) {
    if (node < 0 || !connect(nodes[static_cast<std::size_t>(node)])) return false;
    Node& n = nodes[static_cast<std::size_t>(node)];
    static constexpr std::array<std::string_view, 1> kAsking{"ASKING"};
    bool ok = true;
    for (const Pending& p : batch) {
      const ClusterCommand& c = commands[p.index];
      if (c.before_send) {
        // What is encoded so far goes out first (once it is worth a system call): the node
        // works on it meanwhile.
        if (encoded_bytes >= kFlushBytes) ok = ok && send_encoded(n);
        c.before_send();
      }
      if (p.asking) encode(kAsking, {});
      encode(c.args, c.value);
    }
    ok = ok && send_encoded(n);
    heads.clear();
    iov_ref.clear();
    encoded_bytes = 0;
    if (!ok) {
      detail::logger().debug("cluster: sending to {}:{} failed: {}", n.address.host, n.address.port,
                             std::strerror(errno));
      ++stats.io_errors;
      mark_down(n, "send failed");
    }
    return ok;
  }

  void read_batch(int node, std::span<const Pending> batch,
                  std::span<const ClusterCommand> commands,
                  const std::function<void(std::size_t, const ClusterReply&)>& on_reply,
                  const std::function<void(std::size_t)>& fail, std::vector<Pending>& next) {
    Node& n = nodes[static_cast<std::size_t>(node)];
    std::size_t answered = 0;
    for (; answered < batch.size(); ++answered) {
      const Pending& p = batch[answered];
      void* raw = nullptr;
      in_place = InPlace{};
      if (p.asking) {
        if (!n.conn->get_reply(&raw)) break;
        freeReplyObject(raw);  // +OK to ASKING
      }
      const ClusterCommand& command = commands[p.index];
      in_place = InPlace{command.reply_into, command.reply_prefix, false};
      bool oversized = false;
      const bool got = command.reply_into.empty()
                           ? n.conn->get_reply(&raw)
                           : n.conn->get_bounded_reply(
                                 &raw, command.reply_prefix + command.reply_into.size(), oversized);
      const bool wrote_in_place = in_place.done;
      in_place = InPlace{};
      if (!got) break;
      if (oversized) {
        ++stats.oversized;
        ClusterReply skipped;
        skipped.kind = ClusterReplyKind::string;
        skipped.oversized = true;
        on_reply(p.index, skipped);
        continue;
      }
      auto* r = static_cast<redisReply*>(raw);
      ClusterReply reply;
      switch (r->type) {
        case REDIS_REPLY_STRING:
          reply.kind = ClusterReplyKind::string;
          reply.text = str_of(r);
          reply.in_place = wrote_in_place;
          break;
        case REDIS_REPLY_NIL: reply.kind = ClusterReplyKind::nil; break;
        case REDIS_REPLY_INTEGER:
          reply.kind = ClusterReplyKind::integer;
          reply.integer = r->integer;
          break;
        case REDIS_REPLY_STATUS:
          reply.kind = ClusterReplyKind::status;
          reply.text = str_of(r);
          break;
        case REDIS_REPLY_ARRAY: reply.kind = ClusterReplyKind::array; break;
        default:
          reply.kind = ClusterReplyKind::error;
          reply.text = str_of(r);
          break;
      }
      const bool moved = reply.kind == ClusterReplyKind::error && reply.text.starts_with("MOVED ");
      const bool ask = reply.kind == ClusterReplyKind::error && reply.text.starts_with("ASK ");
      if (moved || ask) {
        const auto target = redirect_target(reply.text, node);
        if (target && p.hops < config.max_redirects) {
          if (moved) {
            ++stats.moved;
            slots[static_cast<std::size_t>(target->first)] = target->second;
            map_stale = true;
          } else {
            ++stats.asked;
          }
          next.push_back(Pending{p.index, target->second, ask, p.hops + 1});
        } else {
          detail::logger().debug("cluster: command {} not followed: {}", p.index, reply.text);
          fail(p.index);
        }
      } else {
        on_reply(p.index, reply);
      }
      freeReplyObject(r);
    }
    if (answered < batch.size()) {
      ++stats.io_errors;
      note_error(n, n.conn->error(), false);
      mark_down(n, n.conn->error());
      for (std::size_t i = answered; i < batch.size(); ++i) fail(batch[i].index);
    }
  }
};

ClusterClient::ClusterClient(ClusterClientConfig config) {
  KVOFFLOAD_EXPECTS(!config.seeds.empty(), "cluster client: no seed node given");
  KVOFFLOAD_EXPECTS(config.connect_timeout_ms > 0 && config.reply_timeout_ms > 0,
                    "cluster client: connect_timeout_ms ({}) and reply_timeout_ms ({}) must be > 0",
                    config.connect_timeout_ms, config.reply_timeout_ms);
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
