#pragma once

// What the tests' loopback servers (fake_resp_server.hpp, hostile_server.hpp) share: finding
// a client's command in the bytes read so far, and a slot map naming one node.

#include <cstddef>
#include <string>

namespace kvoffload::test {

/// The end of the first complete RESP array of bulk strings in `in` (a client's command), or
/// npos while it is incomplete or not such an array.
inline std::size_t resp_command_end(const std::string& in) {
  if (in.empty() || in[0] != '*') return std::string::npos;
  std::size_t p = in.find("\r\n");
  if (p == std::string::npos) return std::string::npos;
  const long argc = std::stol(in.substr(1, p - 1));
  p += 2;
  for (long i = 0; i < argc; ++i) {
    const std::size_t e = in.find("\r\n", p);
    if (e == std::string::npos || in[p] != '$') return std::string::npos;
    const std::size_t len = std::stoul(in.substr(p + 1, e - p - 1));
    p = e + 2 + len + 2;
    if (p > in.size()) return std::string::npos;
  }
  return p;
}

/// One entry of a CLUSTER SLOTS reply: slots first..last on 127.0.0.1:`port`.
inline std::string slot_range_entry(int first, int last, int port) {
  return "*3\r\n:" + std::to_string(first) + "\r\n:" + std::to_string(last) +
         "\r\n*2\r\n$9\r\n127.0.0.1\r\n:" + std::to_string(port) + "\r\n";
}

/// A CLUSTER SLOTS reply giving every slot to 127.0.0.1:`port`.
inline std::string one_node_slots(int port) {
  return "*1\r\n" + slot_range_entry(0, 16383, port);
}

}  // namespace kvoffload::test
