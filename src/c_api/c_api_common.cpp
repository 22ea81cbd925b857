// The C API's status strings, thread-local error message and conversions.

#include "c_api/c_api_common.hpp"

#include <cstring>

namespace kvoffload::capi {
namespace {
thread_local std::string last_error;  // NOLINT: one message per calling thread, by contract
}

void set_last_error(std::string message) {
  last_error = std::move(message);
}
void clear_last_error() {
  last_error.clear();
}
const char* last_error_cstr() noexcept {
  return last_error.c_str();
}

kvoffload_status_t status_of_current_exception() noexcept {
  ClassifiedError e = classify(std::current_exception());
  try {
    set_last_error(std::move(e.message));
  } catch (...) {  // no memory for the message: the status still says what happened
  }
  return static_cast<kvoffload_status_t>(e.code);
}

void require_struct_size(std::size_t got, std::size_t want, std::string_view fn,
                         std::string_view what, std::string_view init_macro) {
  if (got < want) {
    throw invalid_argument(
        fmt::format("{}: {}->struct_size is {}, expected at least {} (initialize it with {})", fn,
                    what, got, want, init_macro));
  }
}

BlockHash to_hash(const kvoffload_block_hash_t& h, std::string_view fn, std::size_t index) {
  if (h.size < 1 || h.size > KVOFFLOAD_HASH_MAX_BYTES) {
    throw invalid_argument(fmt::format("{}: hash {} has size {} (1 to {} bytes)", fn, index, h.size,
                                       KVOFFLOAD_HASH_MAX_BYTES));
  }
  return BlockHash::from_bytes(std::span(h.bytes, h.size));
}

kvoffload_key_t to_c(const Key& key) noexcept {
  kvoffload_key_t out{};
  std::memcpy(out.hash.bytes, key.hash.data(), key.hash.size());
  out.hash.size = static_cast<std::uint32_t>(key.hash.size());
  out.group = key.group;
  return out;
}

static_assert(static_cast<int>(JobKind::load) == KVOFFLOAD_JOB_LOAD &&
              static_cast<int>(JobKind::store) == KVOFFLOAD_JOB_STORE &&
              static_cast<int>(JobKind::promote) == KVOFFLOAD_JOB_TIER_PROMOTE &&
              static_cast<int>(JobKind::write) == KVOFFLOAD_JOB_TIER_WRITE);

kvoffload_job_kind_t to_c(JobKind kind) noexcept {
  return static_cast<kvoffload_job_kind_t>(kind);
}

Key from_c(const kvoffload_key_t& key, std::string_view fn, std::size_t index) {
  return Key{to_hash(key.hash, fn, index), key.group};
}

}  // namespace kvoffload::capi

extern "C" {

const char* kvoffload_status_string(kvoffload_status_t status) {
  switch (status) {
    case KVOFFLOAD_SUCCESS: return "success";
    case KVOFFLOAD_INVALID_ARGUMENT: return "invalid argument";
    case KVOFFLOAD_OUT_OF_MEMORY: return "out of memory";
    case KVOFFLOAD_CUDA_ERROR: return "CUDA error";
    case KVOFFLOAD_UNSUPPORTED: return "not supported by this build";
    case KVOFFLOAD_INTERNAL_ERROR: return "internal error";
    case KVOFFLOAD_IO_ERROR: return "I/O or system error";
    case KVOFFLOAD_NUM_STATUSES: break;
  }
  return "unknown status";
}

/* Not in kvoffload.h: raises the C++ exception of a status's row of error.hpp's table inside the
   library and returns what the guard makes of it, so tests/c/c_api_test.c can check every row
   through the C layer. */
KVOFFLOAD_C_API kvoffload_status_t kvoffload_internal_raise_for_test(int status,
                                                                     const char* message) {
  return kvoffload::capi::guard([&] {
    kvoffload::throw_error_for_test(static_cast<kvoffload::ErrorCode>(status),
                                    message != nullptr ? message : "");
  });
}

const char* kvoffload_last_error(void) {
  return kvoffload::capi::last_error_cstr();
}

kvoffload_status_t kvoffload_get_version(int* version) {
  return kvoffload::capi::guard([&] {
    kvoffload::capi::require(version, "kvoffload_get_version", "version");
    *version = KVOFFLOAD_VERSION_CODE;
  });
}

}  // extern "C"
