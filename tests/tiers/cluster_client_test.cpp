// The cluster client against the real cluster ctest starts ([cluster]: scripts/valkey-cluster,
// 3 masters on 127.0.0.1:7101-7103), and against a fake server for bad network input.

#include <catch2/catch_test_macros.hpp>
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kvoffload/error.hpp"
#include "kvoffload/tiers/cluster_client.hpp"
#include "support/cluster.hpp"

using namespace kvoffload;
using kvoffload::test::cli;
using kvoffload::test::cluster_config;
using kvoffload::test::FakeRespServer;

namespace {

struct Replies {
  std::vector<ClusterReplyKind> kind;
  std::vector<std::string> text;
  std::vector<long long> integer;
};

Replies run(ClusterClient& c, const std::vector<ClusterCommand>& cmds) {
  Replies r;
  r.kind.assign(cmds.size(), ClusterReplyKind::failed);
  r.text.assign(cmds.size(), "<no reply>");
  r.integer.assign(cmds.size(), -1);
  std::vector<int> calls(cmds.size(), 0);
  c.run(cmds, [&](std::size_t i, const ClusterReply& reply) {
    ++calls.at(i);
    r.kind[i] = reply.kind;
    r.text[i] = std::string(reply.text);
    r.integer[i] = reply.integer;
  });
  for (const int n : calls) REQUIRE(n == 1);  // exactly one reply per command
  return r;
}

ClusterCommand get(const std::string& key) {
  return ClusterCommand{.key = key, .args = {"GET", key}};
}

}  // namespace

TEST_CASE("cluster node lists parse and bad ones are named", "[cluster_client]") {
  const auto nodes = parse_cluster_nodes("127.0.0.1:7101,localhost:9", "shared.nodes");
  REQUIRE(nodes.size() == 2);
  CHECK(nodes[0].host == "127.0.0.1");
  CHECK(nodes[0].port == 7101);
  CHECK(nodes[1].host == "localhost");
  CHECK(nodes[1].port == 9);
  for (const char* bad : {"", "host", "host:", ":7101", "h:0", "h:65536", "h:12x", "a:1,,b:2"}) {
    CAPTURE(bad);
    try {
      (void)parse_cluster_nodes(bad, "shared.nodes");
      FAIL("no exception");
    } catch (const invalid_argument& e) {
      CHECK(std::string(e.what()).find("shared.nodes") != std::string::npos);
    }
  }
  CHECK_THROWS_AS(ClusterClient(ClusterClientConfig{}), invalid_argument);
}

TEST_CASE("cluster: pipelined SET, GET and EXISTS reach every master", "[cluster]") {
  ClusterClient c(cluster_config());
  REQUIRE(c.refresh());
  std::vector<std::string> keys, values;
  std::set<std::string> owners;
  for (int i = 0; i < 300; ++i) {
    keys.push_back("kvo-test:client:" + std::to_string(i));
    values.push_back(std::string(static_cast<std::size_t>(1 + i * 37 % 5000), char('a' + i % 26)) +
                     std::to_string(i));
    owners.insert(c.owner_of(cluster_key_slot(keys.back())));
  }
  REQUIRE(owners.size() == 3);  // the keys span the three masters
  std::vector<ClusterCommand> sets, gets, exists;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    // The value in two pieces: they arrive as one argument.
    const std::string_view v = values[i];
    sets.push_back(ClusterCommand{.key = keys[i],
                                  .args = {"SET", keys[i]},
                                  .value = {v.substr(0, v.size() / 2), v.substr(v.size() / 2)}});
    gets.push_back(get(keys[i]));
    exists.push_back(ClusterCommand{.key = keys[i], .args = {"EXISTS", keys[i]}});
  }
  Replies r = run(c, sets);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    REQUIRE(r.kind[i] == ClusterReplyKind::status);
    REQUIRE(r.text[i] == "OK");
  }
  r = run(c, gets);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    REQUIRE(r.kind[i] == ClusterReplyKind::string);
    REQUIRE(r.text[i] == values[i]);
    // The server agrees (another client, no cluster layer of ours).
    if (i % 50 == 0) REQUIRE(cli("-c GET " + keys[i]) == values[i]);
  }
  r = run(c, exists);
  for (std::size_t i = 0; i < keys.size(); ++i) REQUIRE(r.integer[i] == 1);
  r = run(c, {get("kvo-test:client:missing")});
  CHECK(r.kind[0] == ClusterReplyKind::nil);
  CHECK(c.stats().failed == 0);
  CHECK(c.stats().moved == 0);
}

TEST_CASE("cluster: a slot moved meanwhile is followed through ASK and MOVED", "[cluster]") {
  ClusterClient c(cluster_config());
  REQUIRE(c.refresh());
  // A key on the first node; its slot moves to the second node by the cluster's own protocol.
  // The slot must hold no other key (what other tests left there would block the move).
  std::string key;
  for (int i = 0; key.empty() && i < 100000; ++i) {
    const std::string k = "kvo-test:move:" + std::to_string(i);
    const int s = cluster_key_slot(k);
    if (c.owner_of(s) == kvoffload::test::cluster_seed() &&
        cli("cluster countkeysinslot " + std::to_string(s), kvoffload::test::kClusterPort) == "0") {
      key = k;
    }
  }
  REQUIRE(!key.empty());
  const int slot = cluster_key_slot(key);
  const int from = kvoffload::test::kClusterPort, to = from + 1;
  const std::string from_id = cli("cluster myid", from), to_id = cli("cluster myid", to);
  REQUIRE(cli("SET " + key + " old", from) == "OK");
  const auto setslot = [&](int port, const std::string& what) {
    REQUIRE(cli("cluster setslot " + std::to_string(slot) + " " + what, port) == "OK");
  };
  setslot(to, "importing " + from_id);
  setslot(from, "migrating " + to_id);
  // Migrating: a key not on the old owner is answered ASK; the new key lands on the new owner.
  const std::string key2 = key + "{" + key + "}";  // same slot as `key` (its tag is the key)
  REQUIRE(cluster_key_slot(key2) == slot);
  Replies r = run(c, {ClusterCommand{.key = key2, .args = {"SET", key2, "new"}}});
  CHECK(r.text[0] == "OK");
  CHECK(c.stats().asked >= 1);
  CHECK(cli("-c GET " + key2, to).find("new") != std::string::npos);
  // Finish: move the old key, give the slot to the new owner; our map is now stale: MOVED.
  REQUIRE(cli("migrate 127.0.0.1 " + std::to_string(to) + " " + key + " 0 5000", from) == "OK");
  for (const int port : {from, to, to + 1}) setslot(port, "node " + to_id);
  r = run(c, {get(key), get(key2)});
  CHECK(r.text[0] == "old");
  CHECK(r.text[1] == "new");
  CHECK(c.stats().moved >= 1);
  // The next batch reloads the map: the slot's owner is the new node.
  (void)run(c, {get(key)});
  CHECK(c.owner_of(slot) == "127.0.0.1:" + std::to_string(to));
  const auto moved = c.stats().moved;
  (void)run(c, {get(key)});
  CHECK(c.stats().moved == moved);
  // And back, so the other tests find the cluster as it was.
  setslot(from, "importing " + to_id);
  setslot(to, "migrating " + from_id);
  REQUIRE(cli("migrate 127.0.0.1 " + std::to_string(from) + " \"\" 0 5000 keys " + key + " " + key2,
              to) == "OK");
  for (const int port : {from, to, to + 1}) setslot(port, "node " + from_id);
}

TEST_CASE("cluster: nodes nobody listens on fail the commands fast", "[cluster_client]") {
  ClusterClientConfig config;
  config.seeds = parse_cluster_nodes("127.0.0.1:1", "test");  // port 1: refused
  ClusterClient c(config);
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < 3; ++round) {
    const Replies r = run(c, {get("a"), get("b")});
    CHECK(r.kind[0] == ClusterReplyKind::failed);
    CHECK(r.kind[1] == ClusterReplyKind::failed);
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));
  CHECK(c.stats().failed == 6);
  CHECK(c.stats().connect_errors >= 1);
}

TEST_CASE("cluster client: bad replies from the network are failures, never crashes",
          "[cluster_client]") {
  struct Case {
    const char* name;
    std::string answer;
    ClusterReplyKind expect;
  };
  const std::vector<Case> cases = {
      {"truncated bulk string", "$10\r\nabc", ClusterReplyKind::failed},
      {"huge bulk length", "$9223372036854775807\r\n", ClusterReplyKind::failed},
      {"huge array length", "*9223372036854775807\r\n", ClusterReplyKind::failed},
      {"negative length", "$-5\r\n", ClusterReplyKind::failed},
      {"not RESP", "hello world\r\n", ClusterReplyKind::failed},
      {"wrong type (integer)", ":42\r\n", ClusterReplyKind::integer},
      {"wrong type (array)", "*1\r\n$1\r\nx\r\n", ClusterReplyKind::array},
      {"server error", "-ERR nope\r\n", ClusterReplyKind::error},
      {"redirect loop", "-MOVED 1 127.0.0.1:PORT\r\n", ClusterReplyKind::failed},
      {"redirect to garbage", "-MOVED 99999 nowhere\r\n", ClusterReplyKind::failed},
  };
  for (const Case& k : cases) {
    CAPTURE(k.name);
    // "PORT" in an answer is the fake server's own port (a MOVED loop).
    FakeRespServer server(k.answer);
    ClusterClientConfig config;
    config.seeds = parse_cluster_nodes("127.0.0.1:" + std::to_string(server.port()), "test");
    config.reply_timeout_ms = 300;
    ClusterClient c(config);
    const auto start = std::chrono::steady_clock::now();
    const Replies r = run(c, {get("k")});
    CHECK(r.kind[0] == k.expect);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(3));
  }
}

TEST_CASE("cluster: values read in place and written after a last-moment hook", "[cluster]") {
  ClusterClient c(cluster_config());
  std::vector<std::string> keys;
  for (int i = 0; i < 6; ++i) keys.push_back("kvo-test:inplace:" + std::to_string(i));
  // 1 MiB values whose last byte the hook sets just before each is sent.
  std::vector<std::string> values(keys.size(), std::string(1 << 20, 'x'));
  std::vector<ClusterCommand> sets;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    std::string& v = values[i];
    sets.push_back({.key = keys[i],
                    .args = {"SET", keys[i]},
                    .value = {std::string_view(v)},
                    .before_send = [&v, i] { v.back() = static_cast<char>('a' + i); }});
  }
  for (const ClusterReplyKind k : run(c, sets).kind) REQUIRE(k == ClusterReplyKind::status);
  // Read back: the first 16 bytes as the reply's text, the rest into buffers.
  std::vector<std::vector<std::byte>> into(keys.size(), std::vector<std::byte>((1 << 20) - 16));
  std::vector<ClusterCommand> gets;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    gets.push_back(
        {.key = keys[i], .args = {"GET", keys[i]}, .reply_into = into[i], .reply_prefix = 16});
  }
  std::vector<bool> in_place(keys.size(), false);
  std::vector<std::string> text(keys.size());
  c.run(gets, [&](std::size_t i, const ClusterReply& r) {
    in_place[i] = r.in_place;
    text[i] = std::string(r.text);
  });
  for (std::size_t i = 0; i < keys.size(); ++i) {
    CAPTURE(i);
    CHECK(in_place[i]);
    CHECK(text[i] == std::string(16, 'x'));
    CHECK(std::memcmp(into[i].data(), values[i].data() + 16, into[i].size()) == 0);
    CHECK(static_cast<char>(into[i].back()) == static_cast<char>('a' + i));
  }
  // A value longer than asked for is skipped without being buffered (one oversized value
  // used to keep the client's read buffer grown for good), and so is a shorter one larger
  // than a command's reply budget (64 KiB). Pipelined behind a skipped one, the next reply
  // is still read in step.
  std::vector<std::byte> small(100), large(values[0].size() + 100);
  const std::vector<ClusterCommand> two{
      {.key = keys[0], .args = {"GET", keys[0]}, .reply_into = small, .reply_prefix = 16},
      {.key = keys[0], .args = {"GET", keys[0]}, .reply_into = large, .reply_prefix = 16}};
  int answered = 0;
  c.run(two, [&](std::size_t, const ClusterReply& r) {
    ++answered;
    CHECK_FALSE(r.in_place);
    CHECK(r.kind == ClusterReplyKind::string);
    CHECK(r.oversized);
    CHECK(r.text.empty());
  });
  CHECK(answered == 2);
  CHECK(c.stats().oversized == 2);
  // A short value (within the budget) is carried whole when it is not the size asked for.
  const std::vector<ClusterCommand> short_value{
      {.key = keys[0], .args = {"SET", keys[0], "short"}},
      {.key = keys[0], .args = {"GET", keys[0]}, .reply_into = large, .reply_prefix = 16}};
  std::string got;
  c.run(short_value, [&](std::size_t i, const ClusterReply& r) {
    if (i == 1) got = std::string(r.text);
  });
  CHECK(got == "short");
  CHECK(c.stats().io_errors == 0);
}

TEST_CASE("cluster client: a redirect without a host is to the node that sent it",
          "[cluster_client]") {
  // Redis 7+ may answer "MOVED <slot> :<port>": the host is the one the reply came from. The
  // fake server redirects to itself, so the client follows until max_redirects.
  FakeRespServer server("-MOVED 1 :PORT\r\n");
  ClusterClientConfig config;
  config.seeds = parse_cluster_nodes("127.0.0.1:" + std::to_string(server.port()), "test");
  config.reply_timeout_ms = 300;
  ClusterClient c(config);
  const Replies r = run(c, {get("k")});
  CHECK(r.kind[0] == ClusterReplyKind::failed);
  CHECK(c.stats().moved == static_cast<std::uint64_t>(config.max_redirects));
}

TEST_CASE("cluster client: a server without cluster support owns every slot", "[cluster_client]") {
  // A standalone Valkey or Redis (most managed offerings) answers CLUSTER SLOTS with an error.
  FakeRespServer server("$5\r\nvalue\r\n", "-ERR This instance has cluster support disabled\r\n");
  ClusterClientConfig config;
  config.seeds = parse_cluster_nodes("127.0.0.1:" + std::to_string(server.port()), "test");
  config.reply_timeout_ms = 300;
  ClusterClient c(config);
  const Replies r = run(c, {get("a"), get("b"), get("{x}c")});
  for (const ClusterReplyKind k : r.kind) CHECK(k == ClusterReplyKind::string);
  CHECK(c.owner_of(0) == "127.0.0.1:" + std::to_string(server.port()));
  CHECK(c.owner_of(16383) == c.owner_of(0));
  CHECK(c.stats().failed == 0);
}
