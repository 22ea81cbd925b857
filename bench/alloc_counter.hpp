#pragma once

// Counts heap allocations made through operator new anywhere in the process (the library
// included): kvoffload-bench replaces the global operator new.

#include <cstdint>

namespace kvbench {

std::uint64_t allocations() noexcept;

}  // namespace kvbench
