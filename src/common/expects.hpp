#pragma once

// Internal: checks that turn bad input into typed exceptions. The message is only built when
// the check fails, so hot paths pay for the comparison alone.

#include <fmt/format.h>

#include "kvoffload/error.hpp"

/// Throws kvoffload::invalid_argument with the fmt-formatted message unless `cond` holds.
#define KVOFFLOAD_EXPECTS(cond, ...)                                   \
  do {                                                                 \
    if (!(cond)) [[unlikely]] {                                        \
      throw ::kvoffload::invalid_argument(::fmt::format(__VA_ARGS__)); \
    }                                                                  \
  } while (0)

/// Throws kvoffload::error: a broken internal invariant (a bug in kvoffload, not the caller).
#define KVOFFLOAD_ASSERT(cond, ...)                                                             \
  do {                                                                                          \
    if (!(cond)) [[unlikely]] {                                                                 \
      throw ::kvoffload::error(::fmt::format("kvoffload internal error at {}:{}: {}", __FILE__, \
                                             __LINE__, ::fmt::format(__VA_ARGS__)));            \
    }                                                                                           \
  } while (0)
