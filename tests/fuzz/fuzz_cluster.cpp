// Fuzzes what the cluster client reads from the network: a fake server on a loopback port
// answers CLUSTER SLOTS, then the first command of a pipelined batch with the input's bytes
// (which may hold any number of replies) and hangs up. The client must answer every command
// exactly once and never read out of bounds (ASan), whatever the bytes: truncated replies,
// huge lengths, nested arrays, redirects and slot maps naming anywhere (it connects to its
// seed only: only_seeds).
//
// Input: byte 0: bit 0, the GET reads in place; bit 1, a slot map follows: the bytes up to the
// first "\n--\n" are the CLUSTER SLOTS answer. The rest is the reply stream.

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "kvoffload/tiers/cluster_client.hpp"
#include "support/fake_resp_server.hpp"

using namespace kvoffload;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::uint8_t flags = data[0];
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  std::string slots;
  if ((flags & 2) != 0) {
    const std::size_t sep = rest.find("\n--\n");
    if (sep == std::string_view::npos) return 0;
    slots = std::string(rest.substr(0, sep));
    rest.remove_prefix(sep + 4);
  }
  kvoffload::test::FakeRespServer server(std::string(rest), slots, /*hang_up=*/true);
  ClusterClientConfig config;
  config.seeds = {ClusterAddress{"127.0.0.1", server.port()}};
  config.connect_timeout_ms = 200;
  config.reply_timeout_ms = 200;
  config.down_backoff_ms = 0;
  config.max_redirects = 2;
  config.only_seeds = true;  // addresses in the input must not reach anything else
  ClusterClient client(config);

  std::vector<std::byte> into((flags & 1) != 0 ? 16 : 0);
  const std::vector<ClusterCommand> commands = {
      {.key = "k", .args = {"GET", "k"}, .reply_into = into, .reply_prefix = 4},
      {.key = "{k}x", .args = {"EXISTS", "{k}x", "{k}y"}},
      {.key = "k2", .args = {"SET", "k2"}, .value = {"va", "lue"}},
  };
  std::vector<int> calls(commands.size(), 0);
  client.run(commands, [&](std::size_t i, const ClusterReply& r) {
    if (i >= calls.size()) std::abort();
    ++calls[i];
    // Touch every byte the reply claims to have (ASan checks they are readable).
    volatile char sink = 0;
    for (const char c : r.text) sink = static_cast<char>(sink ^ c);
    if (r.in_place && r.text.size() != commands[i].reply_prefix) std::abort();
  });
  for (const int n : calls) {
    if (n != 1) std::abort();  // exactly one answer per command
  }
  return 0;
}
