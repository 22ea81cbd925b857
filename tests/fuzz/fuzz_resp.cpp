// Fuzzes the shared tier's RESP reader directly (src/tiers/shared/resp_reader.cpp), without a
// network: any bytes, fed in any split, must end in replies, "more" or an error, never a read
// out of bounds (ASan), and never more buffered than a line's bound plus one read; a value
// reported in place must hold exactly the stream's bytes, and its text exactly the prefix.
//
// Input: byte 0: bit 0, each reply expects a value in place; bits 1-3, its prefix length.
// Byte 1: the in-place destination's size. Byte 2: the largest piece fed at once (0: 1). The
// rest is the reply stream. Small limits (256-byte lines, 4 KiB replies) reach every bound.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "support/resp_feed.hpp"
#include "tiers/shared/resp_reader.hpp"

using kvoffload::detail::RespLimits;
using kvoffload::detail::RespReader;
using kvoffload::detail::RespValue;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  const bool in_place = (data[0] & 1) != 0;
  const std::size_t prefix = (data[0] >> 1) & 7;
  std::vector<std::byte> into(data[1]);
  const std::size_t step = data[2] == 0 ? 1 : data[2];
  const std::string_view stream(reinterpret_cast<const char*>(data + 3), size - 3);
  RespLimits limits;
  limits.max_line = 256;
  limits.max_reply_bytes = 4096;
  limits.max_depth = 4;
  RespReader r(limits);
  RespValue v;
  std::size_t fed = 0;
  if (in_place) r.expect(into, prefix);
  for (int rounds = 0; rounds < 1000000; ++rounds) {  // bounded: each round feeds or ends
    const RespReader::Status s = r.parse(v);
    if (s == RespReader::Status::error) {
      if (r.parse(v) != RespReader::Status::error) std::abort();  // stays unusable
      return 0;
    }
    if (s == RespReader::Status::done) {
      const std::size_t consumed = fed - r.buffered();
      if (v.in_place) {
        // "$N\r\n", prefix, payload, "\r\n" ending at `consumed`.
        if (!in_place || v.text.size() != prefix || consumed < into.size() + 2) std::abort();
        const std::string_view tail = stream.substr(consumed - 2 - into.size(), into.size() + 2);
        if (!into.empty() && std::memcmp(tail.data(), into.data(), into.size()) != 0) std::abort();
        if (tail.substr(into.size()) != "\r\n") std::abort();
        const std::string_view head = stream.substr(consumed - 2 - into.size() - prefix, prefix);
        if (head != v.text) std::abort();
      }
      if (v.skipped && !v.text.empty()) std::abort();
      if (in_place) r.expect(into, prefix);
      continue;
    }
    if (r.buffered() > limits.max_line + 2 + (64 << 10)) std::abort();
    if (fed == stream.size()) return 0;
    fed += kvoffload::test::feed_some(r, stream.substr(fed), step);
  }
  return 0;
}
