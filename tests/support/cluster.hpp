#pragma once

// For the [cluster] tests: the Valkey cluster ctest starts (scripts/valkey-cluster, fixture
// valkey_cluster) and valkey-cli against it.

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

#include "kvoffload/tiers/cluster_client.hpp"
#include "support/fake_resp_server.hpp"

namespace kvoffload::test {

inline constexpr int kClusterPort = KVOFFLOAD_TEST_CLUSTER_PORT;

inline std::string cluster_seed() {
  return "127.0.0.1:" + std::to_string(kClusterPort);
}

inline ClusterClientConfig cluster_config() {
  ClusterClientConfig c;
  c.seeds = parse_cluster_nodes(cluster_seed(), "test");
  return c;
}

/// Runs a shell command, returning its standard output (throws if it cannot start).
inline std::string shell(const std::string& command) {
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) throw std::runtime_error("popen failed: " + command);
  std::string out;
  std::array<char, 4096> buf{};
  std::size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  pclose(p);
  return out;
}

/// valkey-cli against node `port` (the cluster's first node by default), output trimmed.
inline std::string cli(const std::string& args, int port = kClusterPort) {
  std::string out = shell("valkey-cli -p " + std::to_string(port) + " " + args + " 2>&1");
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

/// scripts/valkey-cluster with the tests' state directory.
inline int cluster_script(const std::string& args) {
  const std::string cmd = std::string("KVOFFLOAD_VALKEY_DIR=") + KVOFFLOAD_TEST_CLUSTER_DIR +
                          " KVOFFLOAD_VALKEY_PORT=" + std::to_string(kClusterPort) + " " +
                          KVOFFLOAD_SOURCE_DIR + "/scripts/valkey-cluster " + args + " > /dev/null";
  return std::system(cmd.c_str());
}

/// The pid of node i (0-based) of the tests' cluster.
inline int cluster_node_pid(int i) {
  std::ifstream f(std::string(KVOFFLOAD_TEST_CLUSTER_DIR) + "/node-" + std::to_string(i) + ".pid");
  int pid = 0;
  f >> pid;
  return pid;
}

}  // namespace kvoffload::test
