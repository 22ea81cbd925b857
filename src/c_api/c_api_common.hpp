#pragma once

// Internal: what every C entry point shares. Each one runs its body through guard(), which
// turns exceptions into a status and this thread's last-error message, so no exception and no
// crash reaches a C caller.

#include <cstddef>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

#include "kvoffload/config.hpp"
#include "kvoffload/error.hpp"
#include "kvoffload/kvoffload.h"
#include "kvoffload/types.hpp"

namespace kvoffload::capi {

void set_last_error(std::string message);
void clear_last_error();
const char* last_error_cstr() noexcept;

// The C statuses are error.hpp's table.
static_assert(KVOFFLOAD_SUCCESS == static_cast<int>(ErrorCode::ok));
static_assert(KVOFFLOAD_INVALID_ARGUMENT == static_cast<int>(ErrorCode::invalid_argument));
static_assert(KVOFFLOAD_OUT_OF_MEMORY == static_cast<int>(ErrorCode::out_of_memory));
static_assert(KVOFFLOAD_CUDA_ERROR == static_cast<int>(ErrorCode::cuda_error));
static_assert(KVOFFLOAD_UNSUPPORTED == static_cast<int>(ErrorCode::unsupported));
static_assert(KVOFFLOAD_INTERNAL_ERROR == static_cast<int>(ErrorCode::internal));
static_assert(KVOFFLOAD_IO_ERROR == static_cast<int>(ErrorCode::io_error));

/// The current exception's status (error.hpp's table), its message kept as this thread's
/// last error. Call only inside a catch block.
kvoffload_status_t status_of_current_exception() noexcept;

/// Runs f (returning void), mapping exceptions to statuses.
template <class F>
kvoffload_status_t guard(F&& f) noexcept {
  try {
    clear_last_error();
    f();
    return KVOFFLOAD_SUCCESS;
  } catch (...) {
    return status_of_current_exception();
  }
}

/// An enum a C caller passed, as its integer. C may store any int in it, and reading an
/// out-of-range value as a C++ enum is undefined behaviour (UBSan reports it), so the bytes
/// are copied instead.
template <class E>
int raw_enum(const E& e) noexcept {
  std::underlying_type_t<E> v;
  std::memcpy(&v, &e, sizeof v);
  return static_cast<int>(v);
}

/// Throws invalid_argument "<fn>: <what> is NULL" when p is null.
template <class T>
void require(const T* p, std::string_view fn, std::string_view what) {
  if (p == nullptr) throw invalid_argument(fmt::format("{}: {} is NULL", fn, what));
}

/// An array argument: NULL is allowed only with a length of 0.
template <class T>
void require_array(const T* p, std::size_t n, std::string_view fn, std::string_view what) {
  if (p == nullptr && n != 0) {
    throw invalid_argument(fmt::format("{}: {} is NULL but its length is {}", fn, what, n));
  }
}

/// A versioned struct: struct_size must cover this header's fields.
void require_struct_size(std::size_t got, std::size_t want, std::string_view fn,
                         std::string_view what, std::string_view init_macro);

BlockHash to_hash(const kvoffload_block_hash_t& h, std::string_view fn, std::size_t index);
kvoffload_key_t to_c(const Key& key) noexcept;
/// The C API numbers JobKind the same way (checked at compile time).
kvoffload_job_kind_t to_c(JobKind kind) noexcept;
Key from_c(const kvoffload_key_t& key, std::string_view fn, std::size_t index);
/// Checks struct_size and nodes/name (naming `what`), then converts (c_api_config.cpp).
SharedTierConfig from_c(const kvoffload_shared_tier_config_t& c, std::string_view fn,
                        const std::string& what);
/// A scheduler config (what: "config", or "config->scheduler" for a worker's), converted and
/// validated; nothing is started.
SchedulerConfig from_c(const kvoffload_scheduler_config_t& c, std::string_view fn,
                       const std::string& what);

}  // namespace kvoffload::capi
