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

#include "kvoffload/error.hpp"
#include "kvoffload/kvoffload.h"
#include "kvoffload/types.hpp"

namespace kvoffload::capi {

/// Thrown by C entry points for what this build or machine cannot do.
class unsupported : public error {
 public:
  using error::error;
};

void set_last_error(std::string message);
void clear_last_error();
const char* last_error_cstr() noexcept;

/// Runs f (returning void), mapping exceptions to statuses.
template <class F>
kvoffload_status_t guard(F&& f) noexcept {
  try {
    clear_last_error();
    f();
    return KVOFFLOAD_SUCCESS;
  } catch (const invalid_argument& e) {
    set_last_error(e.what());
    return KVOFFLOAD_INVALID_ARGUMENT;
  } catch (const out_of_memory& e) {
    set_last_error(e.what());
    return KVOFFLOAD_OUT_OF_MEMORY;
  } catch (const std::bad_alloc&) {
    set_last_error("out of host memory");
    return KVOFFLOAD_OUT_OF_MEMORY;
  } catch (const unsupported& e) {
    set_last_error(e.what());
    return KVOFFLOAD_UNSUPPORTED;
  } catch (const cuda_error& e) {
    set_last_error(e.what());
    return KVOFFLOAD_CUDA_ERROR;
  } catch (const std::exception& e) {
    set_last_error(e.what());
    return KVOFFLOAD_INTERNAL_ERROR;
  } catch (...) {
    set_last_error("unknown exception");
    return KVOFFLOAD_INTERNAL_ERROR;
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
Key from_c(const kvoffload_key_t& key, std::string_view fn, std::size_t index);

}  // namespace kvoffload::capi
