// parse_bytes is the one byte-size grammar of every front end (issue 27, join 4): the C++
// configs, the C API, Python, the vLLM connector and the tools all call it.
#include <clocale>
#include <cstdint>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "kvoffload/byte_size.hpp"
#include "kvoffload/error.hpp"

using namespace kvoffload;
using Catch::Matchers::ContainsSubstring;

TEST_CASE("parse_bytes reads whole numbers exactly, in binary and decimal units", "[bytes]") {
  CHECK(parse_bytes("4096", "host_bytes") == 4096);
  CHECK(parse_bytes("64GiB", "host_bytes") == (std::uint64_t{64} << 30));
  CHECK(parse_bytes("512 MiB", "host_bytes") == (std::uint64_t{512} << 20));
  CHECK(parse_bytes("2GB", "host_bytes") == 2000000000ULL);
  CHECK(parse_bytes("1B", "host_bytes") == 1);
  CHECK(parse_bytes("16777215TiB", "host_bytes") == (std::uint64_t{16777215} << 40));
  CHECK_THROWS_AS(parse_bytes("16777216TiB", "host_bytes"), invalid_argument);  // 2^64
  // 2^64 - 1, the largest: exact, not through a floating-point value.
  CHECK(parse_bytes("18446744073709551615", "host_bytes") == 18446744073709551615ULL);
}

TEST_CASE("parse_bytes takes any case, blanks around, fractions and exponents", "[bytes]") {
  CHECK(parse_bytes("64gib", "host_bytes") == (std::uint64_t{64} << 30));
  CHECK(parse_bytes("64GIB", "host_bytes") == (std::uint64_t{64} << 30));
  CHECK(parse_bytes(" 4096 ", "host_bytes") == 4096);
  CHECK(parse_bytes("1.5 MiB", "host_bytes") == (std::uint64_t{3} << 19));
  CHECK(parse_bytes("0.5KiB", "host_bytes") == 512);
  CHECK(parse_bytes("2e9", "host_bytes") == 2000000000ULL);
  CHECK(parse_bytes("1E3KB", "host_bytes") == 1000000ULL);
  CHECK(parse_bytes("2.5e-1KiB", "host_bytes") == 256);
  CHECK(parse_bytes("1.9", "host_bytes") == 1);  // rounded down to whole bytes
}

TEST_CASE("parse_bytes does not depend on the program's locale", "[bytes]") {
  // A host program may set a locale whose decimal point is a comma; "1.5" must not change.
  const char* set = std::setlocale(LC_NUMERIC, "de_DE.UTF-8");
  CHECK(parse_bytes("1.5KiB", "host_bytes") == 1536);
  if (set != nullptr) std::setlocale(LC_NUMERIC, "C");
}

TEST_CASE("parse_bytes errors name the field and the text", "[bytes]") {
  CHECK_THROWS_WITH(parse_bytes("lots", "host_bytes"), ContainsSubstring("host_bytes"));
  CHECK_THROWS_WITH(parse_bytes("-1", "DiskTierConfig.capacity"),
                    ContainsSubstring("DiskTierConfig.capacity") && ContainsSubstring("-1"));
  CHECK_THROWS_WITH(parse_bytes("", "host_bytes"), ContainsSubstring("not a byte size"));
  CHECK_THROWS_WITH(parse_bytes(".", "host_bytes"), ContainsSubstring("not a byte size"));
  CHECK_THROWS_WITH(parse_bytes("64 GiBs", "host_bytes"), ContainsSubstring("unknown unit"));
  CHECK_THROWS_WITH(parse_bytes("12 parsecs", "host_bytes"), ContainsSubstring("unknown unit"));
  CHECK_THROWS_WITH(parse_bytes("1e", "host_bytes"), ContainsSubstring("unknown unit"));
  CHECK_THROWS_WITH(parse_bytes("1 2", "host_bytes"), ContainsSubstring("unknown unit"));
  CHECK_THROWS_AS(parse_bytes("99999999999999999999", "host_bytes"), invalid_argument);
  CHECK_THROWS_AS(parse_bytes("18446744073709551616", "host_bytes"), invalid_argument);
  CHECK_THROWS_AS(parse_bytes("20000000TiB", "host_bytes"), invalid_argument);
  CHECK_THROWS_AS(parse_bytes("1e30", "host_bytes"), invalid_argument);
  CHECK_THROWS_AS(parse_bytes("16777216.0TiB", "host_bytes"), invalid_argument);  // 2^64
}

TEST_CASE("format_bytes writes binary units with two decimals", "[bytes]") {
  CHECK(format_bytes(3 << 20) == "3.00 MiB");
}
