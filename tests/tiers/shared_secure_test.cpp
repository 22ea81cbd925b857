// The shared tier as a deployment runs it: a cluster that speaks only TLS and lets in only an
// ACL user (scripts/valkey-cluster start --tls --auth), and a standalone server. Each is
// started once for this file's tests on ports of its own and stopped at exit. A wrong
// password, CA or server name is a clear, counted failure (never a silent miss), and no block
// is ever read over a connection that was not verified.

#include <sys/stat.h>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kvoffload/error.hpp"
#include "kvoffload/tiers/shared_presence.hpp"
#include "kvoffload/tiers/shared_tier.hpp"
#include "support/cluster.hpp"
#include "support/shared_jobs.hpp"
#include "support/shared_secret.hpp"

using namespace kvoffload;
using Catch::Matchers::ContainsSubstring;

namespace {

constexpr std::uint64_t kBlockBytes = 64 << 10;

/// A server set started by scripts/valkey-cluster in a directory of its own, stopped at exit.
struct Servers {
  std::string dir;
  int port = 0;
  Servers(std::string name, int first_port, const std::string& args)
      : dir(std::string(KVOFFLOAD_TEST_CLUSTER_DIR) + "-" + std::move(name)), port(first_port) {
    if (script(args) != 0) throw std::runtime_error("valkey-cluster " + args + " failed");
  }
  ~Servers() { (void)script("stop"); }
  Servers(const Servers&) = delete;
  Servers& operator=(const Servers&) = delete;
  int script(const std::string& args) const {
    const std::string cmd =
        "KVOFFLOAD_VALKEY_DIR=" + dir + " KVOFFLOAD_VALKEY_PORT=" + std::to_string(port) + " " +
        KVOFFLOAD_SOURCE_DIR + "/scripts/valkey-cluster " + args + " > /dev/null";
    return std::system(cmd.c_str());
  }
  [[nodiscard]] std::string seed() const { return "127.0.0.1:" + std::to_string(port); }
};

const Servers& secure_cluster() {
  static const Servers s("tls", 7301, "start 3 --tls --auth");
  return s;
}

const Servers& standalone() {
  static const Servers s("standalone", 7311, "standalone --auth");
  return s;
}

/// The secure cluster's store: TLS with its CA, the ACL user and its password file.
SharedTierConfig secure_store(const std::string& name) {
  const Servers& s = secure_cluster();
  SharedTierConfig c = kvoffload::test::shared_store(s.seed(), name);
  c.reply_timeout_ms = 2000;
  c.connect_timeout_ms = 1000;
  c.tls = true;
  c.tls_ca_file = s.dir + "/tls/ca.crt";
  c.username = "kvoffload";
  c.password_file = s.dir + "/password";
  return c;
}

struct Pool {
  explicit Pool(std::size_t blocks) : bytes(blocks * kBlockBytes) {
    std::mt19937_64 rng(std::random_device{}());
    for (auto& b : bytes) b = static_cast<std::byte>(rng());
  }
  std::span<std::byte> block(HostBlockId id) {
    return std::span(bytes).subspan(static_cast<std::size_t>(id) * kBlockBytes, kBlockBytes);
  }
  std::vector<std::byte> bytes;
};

Key key(std::uint64_t seed) {
  std::uint8_t b[16];
  for (int i = 0; i < 16; ++i) b[i] = static_cast<std::uint8_t>((seed * 131 + i * 7 + 1) & 0xff);
  return Key{BlockHash::from_bytes(b), 0};
}

using kvoffload::test::job;
using kvoffload::test::run;

/// A file of `text`, mode 0600, removed with the object.
struct TextFile {
  std::string path;
  TextFile(std::string file, const std::string& text) : path(std::move(file)) {
    std::ofstream(path) << text;
    ::chmod(path.c_str(), 0600);
  }
  ~TextFile() { std::remove(path.c_str()); }
  TextFile(const TextFile&) = delete;
  TextFile& operator=(const TextFile&) = delete;
};

/// Writes blocks 0-2 and promotes them into 8-10 through `c`'s tier: true if every byte came
/// back.
bool round_trip(const SharedTierConfig& c, Pool& pool, JobId first_id) {
  SharedTier tier(c, 1, "layout", kBlockBytes, [&](HostBlockId id) { return pool.block(id); });
  const std::vector<Key> keys = {key(first_id), key(first_id + 1), key(first_id + 2)};
  if (!run(tier, job(first_id, JobKind::write, keys, {0, 1, 2})).ok) return false;
  if (!run(tier, job(first_id + 1, JobKind::promote, keys, {8, 9, 10})).ok) return false;
  for (HostBlockId i = 0; i < 3; ++i) {
    if (std::memcmp(pool.block(i).data(), pool.block(8 + i).data(), kBlockBytes) != 0) {
      return false;
    }
  }
  return true;
}

}  // namespace

TEST_CASE("Shared tier over TLS with an ACL user: blocks round-trip, keys are found", "[cluster]") {
  const std::string name = "secure-" + std::to_string(std::random_device{}());
  Pool pool(16);
  REQUIRE(round_trip(secure_store(name), pool, 100));
  // The scheduler's existence checks go over TLS with AUTH too.
  const auto presence = make_cluster_presence(secure_store(name), 1);
  presence->submit(1, 0, {key(100), key(101), key(999)});
  std::vector<PresenceAnswer> answers;
  for (int i = 0; i < 500 && answers.empty(); ++i) {  // bounded: 5 s
    answers = presence->poll();
    if (answers.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(answers.size() == 1);
  CHECK(answers[0].present == std::vector<bool>{true, true, false});
  // The cluster refuses a client without the password, and one without TLS.
  CHECK_THAT(kvoffload::test::cli("GET x", secure_cluster().port),
             ContainsSubstring("Connection reset") || ContainsSubstring("Error"));
}

TEST_CASE("Shared tier: a wrong password, CA or server name is a counted error, never data",
          "[cluster]") {
  const std::string name = "refused-" + std::to_string(std::random_device{}());
  Pool pool(16);
  const auto failed_with = [&](const SharedTierConfig& c) {
    SharedTier tier(c, 1, "layout", kBlockBytes, [&](HostBlockId id) { return pool.block(id); });
    CHECK_FALSE(run(tier, job(1, JobKind::write, {key(1)}, {0})).ok);
    CHECK_FALSE(run(tier, job(2, JobKind::promote, {key(1)}, {8})).ok);
    return tier.shared_stats();
  };
  SECTION("wrong password") {
    const TextFile wrong(secure_cluster().dir + "/wrong-password", "not the password");
    SharedTierConfig c = secure_store(name);
    c.password_file = wrong.path;
    const SharedTierStats s = failed_with(c);
    CHECK(s.auth_errors >= 1);
    CHECK(s.tls_errors == 0);
    CHECK(s.writes == 0);
    {
      // Not a retry storm: twenty jobs back to back try AUTH about once (the node is skipped
      // for its backoff, 0.5 s doubling, after each refusal).
      SharedTier tier(c, 1, "layout", kBlockBytes, [&](HostBlockId id) { return pool.block(id); });
      for (JobId j = 1; j <= 20; ++j)
        CHECK_FALSE(run(tier, job(j, JobKind::write, {key(1)}, {0})).ok);
      CHECK(tier.shared_stats().auth_errors >= 1);
      CHECK(tier.shared_stats().auth_errors <= 3);
      CHECK(tier.shared_stats().write_errors == 20);
    }
    // The scheduler's existence checks: every key unanswered, said as an outage.
    const auto presence = make_cluster_presence(c, 1);
    presence->submit(1, 0, {key(1), key(2)});
    std::vector<PresenceAnswer> answers;
    for (int i = 0; i < 500 && answers.empty(); ++i) {  // bounded: 5 s
      answers = presence->poll();
      if (answers.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    REQUIRE(answers.size() == 1);
    CHECK(answers[0].present == std::vector<bool>{false, false});
    CHECK(answers[0].errors == 2);
  }
  SECTION("no password at all: every command is refused (NOAUTH), nothing read") {
    SharedTierConfig c = secure_store(name);
    c.username.clear();
    c.password_file.clear();
    c.password_env = "KVOFFLOAD_TEST_NO_SUCH_PASSWORD";
    const SharedTierStats s = failed_with(c);
    CHECK(s.reads == 0);
    CHECK(s.writes == 0);
    CHECK(s.auth_errors >= 1);  // said as an AUTH problem, not as an outage
  }
  SECTION("a CA that did not sign the servers' certificates") {
    const std::string other = secure_cluster().dir + "/other-ca";
    REQUIRE(std::system(("openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=other "
                         "-keyout " +
                         other + ".key -out " + other + ".crt > /dev/null 2>&1")
                            .c_str()) == 0);
    SharedTierConfig c = secure_store(name);
    c.tls_ca_file = other + ".crt";
    const SharedTierStats s = failed_with(c);
    CHECK(s.tls_errors >= 1);
    CHECK(s.auth_errors == 0);
  }
  SECTION("a server name the certificates do not carry") {
    SharedTierConfig c = secure_store(name);
    c.tls_server_name = "not-the-cluster.example";
    CHECK(failed_with(c).tls_errors >= 1);
  }
  SECTION("plain TCP to a TLS-only cluster") {
    SharedTierConfig c = secure_store(name);
    c.tls = false;
    c.tls_ca_file.clear();
    const SharedTierStats s = failed_with(c);
    CHECK(s.reads == 0);
    CHECK(s.auth_errors + s.io_errors + s.connect_errors >= 1);
  }
}

TEST_CASE("Shared tier: bad TLS and AUTH settings are refused at start, by field", "[cluster]") {
  const auto make = [](const SharedTierConfig& c) {
    Pool pool(1);
    SharedTier t(c, 1, "layout", kBlockBytes, [&](HostBlockId id) { return pool.block(id); });
  };
  SharedTierConfig c = secure_store("fields");
  c.tls_ca_file = "/nonexistent/ca.crt";
  CHECK_THROWS_WITH(make(c), ContainsSubstring("tls_ca_file \"/nonexistent/ca.crt\""));
  c = secure_store("fields");
  c.tls_cert_file = secure_cluster().dir + "/tls/client.crt";
  CHECK_THROWS_WITH(make(c), ContainsSubstring("tls_cert_file and tls_key_file go together"));
  c = secure_store("fields");
  c.password_file = "/nonexistent/password";
  CHECK_THROWS_WITH(make(c), ContainsSubstring("password_file \"/nonexistent/password\""));
  c = secure_store("fields");
  c.tls = false;
  CHECK_THROWS_WITH(make(c), ContainsSubstring("set tls = true"));
  c = secure_store("fields");
  c.password_file.clear();
  c.password_env = "KVOFFLOAD_TEST_NO_SUCH_PASSWORD";
  CHECK_THROWS_WITH(make(c), ContainsSubstring("username \"kvoffload\" without a password"));
  // A client certificate: accepted (the servers ask for none, but take one).
  c = secure_store("fields");
  c.tls_cert_file = secure_cluster().dir + "/tls/client.crt";
  c.tls_key_file = secure_cluster().dir + "/tls/client.key";
  Pool pool(16);
  CHECK(round_trip(c, pool, 200));
}

TEST_CASE("Shared tier on a standalone server, values with a TTL", "[cluster]") {
  const Servers& s = standalone();
  SharedTierConfig c = kvoffload::test::shared_store(s.seed(), "standalone");
  c.username = "kvoffload";
  c.password_file = s.dir + "/password";
  c.ttl_seconds = 3600;
  Pool pool(16);
  REQUIRE(round_trip(c, pool, 300));
  // Every value written carries the TTL.
  const std::string password = kvoffload::test::shell("cat " + s.dir + "/password");
  const std::string ttls = kvoffload::test::shell(
      "REDISCLI_AUTH=" + password.substr(0, password.find('\n')) +
      " valkey-cli --user kvoffload -p " + std::to_string(s.port) +
      " --scan --pattern 'kvo:*' | head -3 | while read k; do REDISCLI_AUTH=" +
      password.substr(0, password.find('\n')) + " valkey-cli --user kvoffload -p " +
      std::to_string(s.port) + " TTL \"$k\"; done");
  int with_ttl = 0;
  std::istringstream lines(ttls);
  for (std::string line; std::getline(lines, line);) {
    const long t = std::strtol(line.c_str(), nullptr, 10);
    CHECK(t > 3000);
    CHECK(t <= 3600);
    ++with_ttl;
  }
  CHECK(with_ttl == 3);

  // A least-privilege user: without cluster|slots it cannot learn the map, which is said as an
  // AUTH problem (not an outage); with it, and only the data commands on kvo:*, it works.
  const auto acl = [&](const std::string& rules) {
    return kvoffload::test::shell("REDISCLI_AUTH=" + password.substr(0, password.find('\n')) +
                                  " valkey-cli --user kvoffload -p " + std::to_string(s.port) +
                                  " ACL SETUSER limited on '>limited-password-0123' resetkeys "
                                  "'~kvo:*' -@all " +
                                  rules);
  };
  const TextFile limited_password(s.dir + "/limited-password", "limited-password-0123");
  c.username = "limited";
  c.password_file = limited_password.path;
  REQUIRE(acl("+get +set +setex +exists +asking").find("OK") != std::string::npos);
  {
    SharedTier tier(c, 1, "layout", kBlockBytes, [&](HostBlockId id) { return pool.block(id); });
    CHECK_FALSE(run(tier, job(1, JobKind::write, {key(400)}, {0})).ok);
    CHECK(tier.shared_stats().auth_errors >= 1);
  }
  REQUIRE(acl("+get +set +setex +exists +asking '+cluster|slots'").find("OK") != std::string::npos);
  CHECK(round_trip(c, pool, 410));
}
