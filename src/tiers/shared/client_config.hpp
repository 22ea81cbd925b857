#pragma once

// Internal: a shared tier's cluster client settings, from its config, once for the worker's
// tier and the scheduler's presence checks: nodes, timeouts, AUTH (the password read from its
// file or environment variable) and TLS.

#include "kvoffload/tiers/cluster_client.hpp"
#include "kvoffload/tiers/tier_config.hpp"

namespace kvoffload::detail {

/// Throws invalid_argument naming the field: bad nodes, an unreadable password_file, a
/// username without a password, TLS files without tls, a negative ttl_seconds. The TLS files
/// themselves are loaded (and refused by name) when the client is built.
ClusterClientConfig cluster_client_config(const SharedTierConfig& config);

}  // namespace kvoffload::detail
