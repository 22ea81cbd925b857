// The shared tier's bounded RESP reader, fed bytes directly (no network): every reply type, in
// any split, and every bound refused before what it bounds is buffered.

#include "tiers/shared/resp_reader.hpp"

#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "support/resp_feed.hpp"

using kvoffload::detail::RespLimits;
using kvoffload::detail::RespReader;
using kvoffload::detail::RespType;
using kvoffload::detail::RespValue;
using Status = RespReader::Status;

namespace {

/// Feeds `bytes` in pieces of `step` and parses after each; the status at the end.
Status feed(RespReader& r, std::string_view bytes, std::size_t step, RespValue& out) {
  Status s = r.parse(out);
  while (s == Status::more && !bytes.empty()) {
    bytes.remove_prefix(kvoffload::test::feed_some(r, bytes, step));
    s = r.parse(out);
  }
  return s;
}

/// Every reply in `bytes`, fed in pieces of `step`; the status after the last byte.
Status all_replies(RespReader& r, std::string_view bytes, std::size_t step,
                   std::vector<RespValue>& got) {
  for (;;) {
    RespValue v;
    Status s = feed(r, bytes.substr(0, 0), step, v);  // what is buffered already
    std::size_t fed = 0;
    while (s == Status::more && fed < bytes.size()) {
      const std::span<char> direct = r.direct();
      const std::span<char> to = direct.empty() ? r.space() : direct;
      const std::size_t n = std::min(std::min(step, to.size()), bytes.size() - fed);
      std::memcpy(to.data(), bytes.data() + fed, n);
      fed += n;
      if (direct.empty()) {
        r.commit(n);
      } else {
        r.commit_direct(n);
      }
      s = r.parse(v);
    }
    bytes.remove_prefix(fed);
    if (s != Status::done) return s;
    got.push_back(std::move(v));
  }
}

}  // namespace

TEST_CASE("RESP reader: every reply type, whole or a byte at a time", "[resp]") {
  const std::string stream =
      "+OK\r\n-ERR no\r\n:-42\r\n$5\r\nhe\r\no\r\n$-1\r\n*-1\r\n*0\r\n"
      "*3\r\n:1\r\n*2\r\n$1\r\na\r\n$0\r\n\r\n+s\r\n";
  for (const std::size_t step : {std::size_t{1}, std::size_t{3}, stream.size()}) {
    RespReader r;
    std::vector<RespValue> got;
    INFO("step " << step);
    REQUIRE(all_replies(r, stream, step, got) == Status::more);
    CHECK(r.buffered() == 0);
    REQUIRE(got.size() == 8);
    CHECK((got[0].type == RespType::status && got[0].text == "OK"));
    CHECK((got[1].type == RespType::error && got[1].text == "ERR no"));
    CHECK((got[2].type == RespType::integer && got[2].integer == -42));
    CHECK((got[3].type == RespType::string && got[3].text == "he\r\no"));
    CHECK(got[4].type == RespType::nil);
    CHECK(got[5].type == RespType::nil);
    CHECK((got[6].type == RespType::array && got[6].elements.empty()));
    REQUIRE((got[7].type == RespType::array && got[7].elements.size() == 3));
    CHECK(got[7].elements[0].integer == 1);
    REQUIRE(got[7].elements[1].elements.size() == 2);
    CHECK(got[7].elements[1].elements[0].text == "a");
    CHECK((got[7].elements[1].elements[1].type == RespType::string &&
           got[7].elements[1].elements[1].text.empty()));
    CHECK(got[7].elements[2].text == "s");
  }
}

TEST_CASE("RESP reader: a value streams into place, and one of another size is skipped", "[resp]") {
  const std::string payload(300000, 'v');
  std::vector<std::byte> into(payload.size());
  RespReader r;
  RespValue v;
  r.expect(into, 4);
  const std::string value =
      std::string("$") + std::to_string(4 + payload.size()) + "\r\nHEAD" + payload + "\r\n";
  REQUIRE(feed(r, value, 4096, v) == Status::done);
  CHECK(v.in_place);
  CHECK(v.text == "HEAD");
  CHECK(std::memcmp(into.data(), payload.data(), payload.size()) == 0);
  CHECK(r.buffered() == 0);

  // Longer than the reply bound and not the expected size: read past, never held.
  RespLimits small;
  small.max_reply_bytes = 1024;
  RespReader r2(small);
  r2.expect(into, 4);
  const std::string big = std::string("$5000\r\n") + std::string(5000, 'x') + "\r\n:7\r\n";
  REQUIRE(feed(r2, big, 512, v) == Status::done);
  CHECK(v.skipped);
  CHECK(v.text.empty());
  REQUIRE(r2.parse(v) == Status::done);  // the stream goes on in step
  CHECK(v.integer == 7);
  // Without expect(), the same string breaks the bound.
  RespReader r3(small);
  CHECK(feed(r3, big, 512, v) == Status::error);
}

TEST_CASE("RESP reader: every bound is refused when its header arrives", "[resp]") {
  RespLimits limits;
  limits.max_reply_bytes = 1 << 20;
  limits.max_line = 1024;
  RespValue v;
  SECTION("an array too long for the budget, before a single element") {
    RespReader r(limits);
    CHECK(feed(r, "*5000000\r\n", 64, v) == Status::error);
    CHECK(r.error().find("5000000") != std::string::npos);
    // Just inside the budget is fine.
    RespReader ok(limits);
    const std::size_t n = (limits.max_reply_bytes / sizeof(RespValue)) - 2;
    std::string many = std::string("*") + std::to_string(n) + "\r\n";
    for (std::size_t i = 0; i < n; ++i) many += ":1\r\n";
    REQUIRE(feed(ok, many, 65536, v) == Status::done);
    CHECK(v.elements.size() == n);
  }
  SECTION("a bulk string inside an array over the budget") {
    RespReader r(limits);
    CHECK(feed(r, "*1\r\n$2000000\r\n", 64, v) == Status::error);
  }
  SECTION("many strings that add up over the budget") {
    RespReader r(limits);
    std::string s = "*100\r\n";
    for (int i = 0; i < 100; ++i) s += std::string("$20000\r\n") + std::string(20000, 'a') + "\r\n";
    CHECK(feed(r, s, 65536, v) == Status::error);
  }
  SECTION("nesting deeper than the limit") {
    RespReader r(limits);
    std::string nine;
    for (int i = 0; i < 9; ++i) nine += "*1\r\n";
    CHECK(feed(r, nine + ":1\r\n", 64, v) == Status::error);
    RespReader ok(limits);
    CHECK(feed(ok, "*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n", 64, v) ==
          Status::done);
  }
  SECTION("a line longer than max_line fails once it passes the limit, not at its end") {
    RespReader r(limits);
    // 32 MiB of error text would follow; the reader gives up within the first 2 KiB.
    const std::string start = std::string("-ERR ") + std::string(2048, 'e');
    CHECK(feed(r, start, 100, v) == Status::error);
    CHECK(r.buffered() < 4096);
  }
  SECTION("malformed lines, lengths and types") {
    for (const std::string_view bad : {"$abc\r\n", "$-2\r\n", "*-5\r\n", ":12x\r\n", "\r\n",
                                       "?1\r\n", "%1\r\n", "+ok\n", "$1\r\nab\r\n"}) {
      RespReader r(limits);
      INFO(bad);
      CHECK(feed(r, bad, 1, v) == Status::error);
    }
  }
}
