#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kvoffload/export.hpp"

namespace kvoffload {

/// Parses a byte size, the one grammar of every front end (C++, C, Python, the vLLM
/// connector, the tools): a non-negative number, optional blanks, an optional unit in any
/// case, B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000), e.g.
/// "64GiB", "64gib", "512 MiB", "4096", "1.5GiB", "2e9". Whole numbers are exact; a fraction
/// or an exponent is rounded down to whole bytes. Throws invalid_argument naming `field`.
KVOFFLOAD_EXPORT std::uint64_t parse_bytes(std::string_view text, std::string_view field);

/// "1.50 GiB"-style text for logs.
KVOFFLOAD_EXPORT std::string format_bytes(std::uint64_t bytes);

}  // namespace kvoffload
