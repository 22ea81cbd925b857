// The cluster client against a hostile server of our own (tests/support/hostile_server.hpp):
// a node that drip-feeds or stalls, replies far larger than a block in every shape, lines of
// megabytes, a connection cut mid-reply, redirect loops and a slot map naming nodes that do
// not answer. Each must end in failed commands that are counted, within a bounded time, with a
// bounded growth of this process's memory, and with every command answered exactly once.

#include <sys/socket.h>

#include <catch2/catch_test_macros.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "kvoffload/error.hpp"
#include "kvoffload/tiers/cluster_client.hpp"
#include "support/hostile_server.hpp"

using namespace kvoffload;
using kvoffload::test::HostileBehavior;
using kvoffload::test::HostileReply;
using kvoffload::test::HostileServer;
using kvoffload::test::RssWatch;
using kvoffload::test::slot_range_entry;
using Clock = std::chrono::steady_clock;

namespace {

constexpr long kMiB = 1 << 20;

ClusterClientConfig config_for(const HostileServer& s, int reply_timeout_ms) {
  ClusterClientConfig c;
  c.seeds = {ClusterAddress{"127.0.0.1", s.port()}};
  c.reply_timeout_ms = reply_timeout_ms;
  c.only_seeds = true;
  return c;
}

struct Outcome {
  int failed = 0;
  int answered = 0;
  int oversized = 0;
  double seconds = 0;
};

/// `n` GETs (read in place into a 4 KiB block) and one EXISTS; every command answered once.
Outcome run_gets(ClusterClient& c, int n) {
  std::vector<std::vector<std::byte>> blocks(static_cast<std::size_t>(n),
                                             std::vector<std::byte>(4096));
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) keys.push_back(std::string("k") + std::to_string(i));
  std::vector<ClusterCommand> commands;
  for (int i = 0; i < n; ++i) {
    commands.push_back(ClusterCommand{.key = keys[static_cast<std::size_t>(i)],
                                      .args = {"GET", keys[static_cast<std::size_t>(i)]},
                                      .reply_into = blocks[static_cast<std::size_t>(i)],
                                      .reply_prefix = 16});
  }
  commands.push_back(ClusterCommand{.key = "e", .args = {"EXISTS", "e"}});
  std::vector<int> calls(commands.size(), 0);
  Outcome o;
  const auto start = Clock::now();
  c.run(commands, [&](std::size_t i, const ClusterReply& r) {
    ++calls.at(i);
    ++o.answered;
    if (r.kind == ClusterReplyKind::failed) ++o.failed;
    if (r.oversized) ++o.oversized;
  });
  o.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (const int k : calls) REQUIRE(k == 1);
  return o;
}

}  // namespace

TEST_CASE("Hostile node: a reply dripped a byte at a time misses its deadline",
          "[cluster_client]") {
  // A whole, valid value, 1 byte every 20 ms: every read is well inside any per-read timeout,
  // the reply never is inside the 300 ms one.
  HostileBehavior b;
  b.reply.head = std::string("$4112\r\n") + std::string(4112, 'v') + "\r\n";
  b.drip_ms = 20;
  HostileServer server(b);
  ClusterClient c(config_for(server, 300));
  const Outcome o = run_gets(c, 8);
  CHECK(o.failed == 9);
  CHECK(o.seconds < 2.0);  // one deadline, then the node is skipped: not 9 of them
  CHECK(c.stats().timeouts >= 1);
  CHECK(c.stats().io_errors >= 1);
  // Skipped for its backoff: the next batch fails at once.
  const Outcome again = run_gets(c, 2);
  CHECK(again.failed == 3);
  CHECK(again.seconds < 0.2);
}

TEST_CASE("Hostile node: one that never answers is cancelled from another thread",
          "[cluster_client]") {
  HostileBehavior b;
  b.stall = true;
  HostileServer server(b);
  ClusterClient c(config_for(server, 20000));  // a deadline far away: cancel() must end it
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    c.cancel();
  });
  const Outcome o = run_gets(c, 4);
  canceller.join();
  CHECK(o.failed == 5);
  CHECK(o.seconds < 1.5);
  // Cancelled for good: nothing more is sent.
  const int sent = server.commands();
  CHECK(run_gets(c, 2).failed == 3);
  CHECK(server.commands() == sent);
}

TEST_CASE("Hostile node: oversized replies of every shape are refused unbuffered",
          "[cluster_client]") {
  struct Case {
    const char* name;
    HostileReply reply;
    bool oversized;  // a top-level value of the wrong size: skipped, the connection kept
  };
  const std::string chunk(64 << 10, 'x');
  const std::vector<Case> cases = {
      {"five million integers", {"*5000000\r\n", ":1\r\n", 5000000, ""}, false},
      {"an array holding a 100 MiB string", {"*1\r\n$104857600\r\n", chunk, 1600, "\r\n"}, false},
      {"a 100 MiB string where a block was asked", {"$104857600\r\n", chunk, 1600, "\r\n"}, true},
      {"a 32 MiB error line", {"-ERR ", chunk, 512, "\r\n"}, false},
      {"a 32 MiB status line", {"+", chunk, 512, "\r\n"}, false},
      {"arrays nested 100 deep", {"", "*1\r\n", 100, ":1\r\n"}, false},
  };
  for (const Case& k : cases) {
    CAPTURE(k.name);
    HostileBehavior b;
    b.reply = k.reply;
    HostileServer server(b);
    RssWatch rss;
    ClusterClient c(config_for(server, 5000));
    const Outcome o = run_gets(c, 1);
    CHECK(o.seconds < 5.0);
    // The reader holds at most its 8 MiB reply budget; the rest is this test's own.
    CHECK(rss.growth() < 24 * kMiB);
    if (k.oversized) {
      CHECK(o.oversized == 1);
      CHECK(c.stats().oversized == 1);
    } else {
      CHECK(o.failed == 2);  // the GET and the EXISTS behind it on the dropped connection
      CHECK(c.stats().protocol_errors == 1);
    }
  }
}

TEST_CASE("Hostile node: a connection cut mid-reply, and a redirect loop", "[cluster_client]") {
  {
    HostileBehavior b;
    b.reply.head = std::string("$4112\r\n") + std::string(4112, 'v') + "\r\n";
    b.cut_after = 100;
    HostileServer server(b);
    ClusterClient c(config_for(server, 2000));
    const Outcome o = run_gets(c, 3);
    CHECK(o.failed == 4);
    CHECK(o.seconds < 1.0);  // the close is seen at once, not at the deadline
    CHECK(c.stats().io_errors == 1);
    CHECK(c.stats().timeouts == 0);
  }
  {
    HostileBehavior b;
    b.reply.head = "-MOVED 0 127.0.0.1:PORT\r\n";
    HostileServer server(b);
    ClusterClientConfig config = config_for(server, 2000);
    config.max_redirects = 5;
    ClusterClient c(config);
    const Outcome o = run_gets(c, 3);
    CHECK(o.failed == 4);
    CHECK(o.seconds < 2.0);
    CHECK(c.stats().moved == 4 * 5);  // each command followed max_redirects times, no more
  }
}

TEST_CASE("Hostile node: a slot map naming nodes that do not answer, thousands of them",
          "[cluster_client]") {
  // Two ports that accept connections and never answer (a listen backlog nobody accepts
  // from), and 3000 more nodes that refuse: the client keeps at most 1024 nodes, and each
  // command costs at most one deadline on the node it goes to.
  std::vector<int> silent;
  for (int i = 0; i < 2; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(::listen(fd, 8) == 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    silent.push_back(fd);
    silent.push_back(ntohs(a.sin_port));
  }
  std::string slots =
      "*3002\r\n" + slot_range_entry(0, 8191, silent[1]) + slot_range_entry(8192, 9999, silent[3]);
  for (int s = 10000; s < 13000; ++s) slots += slot_range_entry(s, s, 40000 + (s - 10000));
  HostileBehavior b;
  b.slots = slots;
  HostileServer server(b);
  ClusterClientConfig config = config_for(server, 300);
  config.only_seeds = false;
  RssWatch rss;
  ClusterClient c(config);
  const Outcome o = run_gets(c, 32);  // keys over every part of the map
  CHECK(o.failed == 33);
  CHECK(o.seconds < 3.0);
  CHECK(rss.growth() < 24 * kMiB);
  for (std::size_t i = 0; i < silent.size(); i += 2) ::close(silent[i]);
}

TEST_CASE("Hostile node: a silent node holds back only the commands sent to it",
          "[cluster_client]") {
  // Slots 0-8191 on a node that never answers, the rest on one that answers at once. The
  // first command goes to the silent node: its reply's deadline must not hold back the
  // other node's replies, which are passed on as they arrive.
  HostileBehavior quiet;
  quiet.stall = true;
  HostileServer silent(quiet);
  HostileBehavior fast_b;
  fast_b.reply.head = ":1\r\n";
  fast_b.slots =
      "*2\r\n" + slot_range_entry(0, 8191, silent.port()) + slot_range_entry(8192, 16383, -1);
  const std::size_t at = fast_b.slots.find(":-1\r\n");
  fast_b.slots.replace(at, 5, ":PORT\r\n");
  HostileServer fast(fast_b);
  ClusterClientConfig config = config_for(fast, 1000);
  config.only_seeds = false;
  ClusterClient c(config);
  std::vector<std::string> keys;
  std::vector<bool> on_silent;
  for (int i = 0; keys.size() < 12; ++i) {
    const std::string k = std::string("key") + std::to_string(i);
    const bool low = cluster_key_slot(k) < 8192;
    // Silent first, then alternate.
    if (keys.empty() ? !low : low == on_silent.back()) continue;
    keys.push_back(k);
    on_silent.push_back(low);
  }
  std::vector<ClusterCommand> commands;
  for (const std::string& k : keys) commands.push_back({.key = k, .args = {"EXISTS", k}});
  std::vector<double> at_s(keys.size(), -1);
  std::vector<ClusterReplyKind> kind(keys.size());
  const auto start = Clock::now();
  c.run(commands, [&](std::size_t i, const ClusterReply& r) {
    at_s[i] = std::chrono::duration<double>(Clock::now() - start).count();
    kind[i] = r.kind;
  });
  for (std::size_t i = 0; i < keys.size(); ++i) {
    CAPTURE(i, keys[i], on_silent[i], at_s[i]);
    if (on_silent[i]) {
      CHECK(kind[i] == ClusterReplyKind::failed);
      CHECK(at_s[i] >= 0.9);  // its deadline
    } else {
      CHECK(kind[i] == ClusterReplyKind::integer);
      CHECK(at_s[i] < 0.5);  // long before the silent node's deadline
    }
  }
  CHECK(c.stats().timeouts == 1);
}

TEST_CASE("Hostile node: replies each just inside a per-reply timeout miss the batch's deadline",
          "[cluster_client]") {
  // Each whole reply 600 ms after the one before, inside a 1 s timeout per reply: a batch of
  // 6 would take 3.6 s. The batch's replies are all due 1 s after it was written.
  HostileBehavior b;
  b.reply.head = ":1\r\n";
  b.gap_ms = 600;
  HostileServer server(b);
  ClusterClient c(config_for(server, 1000));
  std::vector<ClusterCommand> commands;
  std::vector<std::string> keys;
  for (int i = 0; i < 6; ++i) keys.push_back(std::string("k") + std::to_string(i));
  for (const std::string& k : keys) commands.push_back({.key = k, .args = {"EXISTS", k}});
  int answered = 0, failed = 0;
  const auto start = Clock::now();
  c.run(commands, [&](std::size_t, const ClusterReply& r) {
    ++answered;
    if (r.kind == ClusterReplyKind::failed) ++failed;
  });
  CHECK(std::chrono::duration<double>(Clock::now() - start).count() < 1.5);
  CHECK(answered == 6);
  CHECK(failed == 5);  // the first reply came in time
  CHECK(c.stats().timeouts == 1);
}

TEST_CASE("Hostile node: ASK loops, replies nobody asked for, and megabytes for a count",
          "[cluster_client]") {
  SECTION("an ASK loop is followed max_redirects times, then fails") {
    HostileBehavior b;
    b.reply.head = "-ASK 0 127.0.0.1:PORT\r\n";
    HostileServer server(b);
    ClusterClientConfig config = config_for(server, 1000);
    config.max_redirects = 3;
    ClusterClient c(config);
    const Outcome o = run_gets(c, 2);
    CHECK(o.failed == 3);
    CHECK(c.stats().asked == 3 * 3);
    CHECK(o.seconds < 2.0);
  }
  SECTION("two replies per command: the batch is answered, the connection dropped") {
    HostileBehavior b;
    b.reply.head = ":1\r\n:1\r\n";
    HostileServer server(b);
    ClusterClient c(config_for(server, 1000));
    std::vector<ClusterReplyKind> kinds;
    const std::vector<ClusterCommand> one{{.key = "a", .args = {"EXISTS", "a"}}};
    c.run(one, [&](std::size_t, const ClusterReply& r) { kinds.push_back(r.kind); });
    CHECK(kinds == std::vector<ClusterReplyKind>{ClusterReplyKind::integer});
    // The extra reply arrives with the first one (one send): caught after the batch, before
    // it could answer the next batch's first command.
    CHECK(c.stats().protocol_errors == 1);
  }
  SECTION("an 8 MB string where a count belongs is refused at its header") {
    HostileBehavior b;
    b.reply = HostileReply{"$8000000\r\n", std::string(1 << 16, 'x'), 122, "\r\n"};
    HostileServer server(b);
    RssWatch rss;
    ClusterClient c(config_for(server, 2000));
    std::vector<ClusterReplyKind> kinds;
    const std::vector<ClusterCommand> one{{.key = "a", .args = {"EXISTS", "a"}}};
    c.run(one, [&](std::size_t, const ClusterReply& r) { kinds.push_back(r.kind); });
    CHECK(kinds == std::vector<ClusterReplyKind>{ClusterReplyKind::failed});
    CHECK(c.stats().protocol_errors == 1);
    CHECK(rss.growth() < 6 * kMiB);
  }
}

TEST_CASE("Cluster client: a node given by name is resolved within its deadline",
          "[cluster_client]") {
  // Names go through the resolver with a deadline (getaddrinfo_a): a slot map may name any
  // host, and a resolver that hangs must cost a failed connect, not a stuck tier.
  HostileBehavior b;
  b.reply.head = ":1\r\n";
  HostileServer server(b);
  ClusterClientConfig config = config_for(server, 1000);
  config.seeds = {ClusterAddress{"localhost", server.port()}};
  config.only_seeds = false;  // the server's slot map names 127.0.0.1
  ClusterClient c(config);
  std::vector<ClusterReplyKind> kinds;
  const std::vector<ClusterCommand> one{{.key = "a", .args = {"EXISTS", "a"}}};
  c.run(one, [&](std::size_t, const ClusterReply& r) { kinds.push_back(r.kind); });
  CHECK(kinds == std::vector<ClusterReplyKind>{ClusterReplyKind::integer});
  // A name that does not resolve fails the connect, counted, within the deadline.
  config.seeds = {ClusterAddress{"no-such-host.invalid", server.port()}};
  ClusterClient bad(config);
  const auto start = Clock::now();
  kinds.clear();
  bad.run(one, [&](std::size_t, const ClusterReply& r) { kinds.push_back(r.kind); });
  CHECK(kinds == std::vector<ClusterReplyKind>{ClusterReplyKind::failed});
  CHECK(bad.stats().connect_errors == 1);
  CHECK(std::chrono::duration<double>(Clock::now() - start).count() < 2.0);
}

TEST_CASE("Hostile node: a slow but steady link is not taken for a drip feed", "[cluster_client]") {
  // Whole 2 MiB values 100 ms apart (about 20 MB/s): 8 of them take 0.8 s, past the 0.5 s
  // reply timeout, inside the batch's deadline with its values' time at the minimum rate
  // (16 MiB at 16 MiB/s: 1 s more). Every value arrives, in place, and the node is never
  // marked down. The control, without the allowance, loses the batch's tail.
  constexpr std::size_t kValue = 2 << 20;
  HostileBehavior b;
  b.reply.head = std::string("$") + std::to_string(16 + kValue) + "\r\n";
  b.reply.body = std::string(16 + kValue, 'v');
  b.reply.repeat = 1;
  b.reply.tail = "\r\n";
  b.gap_ms = 100;
  HostileServer server(b);
  const auto run8 = [&](ClusterClient& c) {
    std::vector<std::vector<std::byte>> blocks(8, std::vector<std::byte>(kValue));
    std::vector<std::string> keys;
    for (int i = 0; i < 8; ++i) keys.push_back(std::string("v") + std::to_string(i));
    std::vector<ClusterCommand> commands;
    for (std::size_t i = 0; i < 8; ++i) {
      commands.push_back(
          {.key = keys[i], .args = {"GET", keys[i]}, .reply_into = blocks[i], .reply_prefix = 16});
    }
    int in_place = 0;
    c.run(commands, [&](std::size_t, const ClusterReply& r) { in_place += r.in_place ? 1 : 0; });
    return in_place;
  };
  ClusterClient steady(config_for(server, 500));
  CHECK(run8(steady) == 8);
  CHECK(steady.stats().timeouts == 0);
  ClusterClientConfig strict = config_for(server, 500);
  strict.min_rate_bytes_per_s = 0;
  ClusterClient control(strict);
  CHECK(run8(control) < 8);
  CHECK(control.stats().timeouts == 1);
}

TEST_CASE("Cluster health: a node one client found silent is skipped by the others",
          "[cluster_client]") {
  HostileBehavior b;
  b.stall = true;
  HostileServer server(b);
  ClusterClientConfig config = config_for(server, 500);
  config.health = std::make_shared<ClusterHealth>();
  ClusterClient first(config), second(config);
  const Outcome a = run_gets(first, 2);
  CHECK(a.failed == 3);
  CHECK(first.stats().timeouts == 1);
  const int connections = server.connections();
  const Outcome o = run_gets(second, 2);  // no deadline of its own to pay, no connection
  CHECK(o.failed == 3);
  CHECK(o.seconds < 0.2);
  CHECK(server.connections() == connections);
  CHECK(second.stats().timeouts == 0);
}

TEST_CASE("Cluster client: timeouts and the minimum rate are refused out of range",
          "[cluster_client]") {
  ClusterClientConfig c;
  c.seeds = {ClusterAddress{"127.0.0.1", 1}};
  c.min_rate_bytes_per_s = 1;  // a 1 MiB value would get 12 days
  CHECK_THROWS_AS(ClusterClient(c), invalid_argument);
  c.min_rate_bytes_per_s = 0;
  c.reply_timeout_ms = 3600001;
  CHECK_THROWS_AS(ClusterClient(c), invalid_argument);
  c.reply_timeout_ms = 1000;
  CHECK_NOTHROW(ClusterClient(c));
}
