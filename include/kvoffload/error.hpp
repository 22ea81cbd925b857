#pragma once

// kvoffload's errors, one table for C++, C and Python (tests/common/error_table_test.cpp,
// tests/c/c_api_test.c and python/tests/test_errors.py check every row from each layer):
//
//   C++ exception                  C status (ErrorCode)        Python class (kvoffload.)
//   invalid_argument               KVOFFLOAD_INVALID_ARGUMENT  InvalidArgument, a ValueError
//   out_of_memory, std::bad_alloc  KVOFFLOAD_OUT_OF_MEMORY     OutOfMemory, a MemoryError
//   cuda_error                     KVOFFLOAD_CUDA_ERROR        CudaError
//   unsupported                    KVOFFLOAD_UNSUPPORTED       Unsupported
//   error (a broken internal       KVOFFLOAD_INTERNAL_ERROR    InternalError
//   invariant), any other exception
//   io_error, std::filesystem::    KVOFFLOAD_IO_ERROR          IoError, an OSError
//   filesystem_error, std::ios_base::failure
//
// Every Python class derives from kvoffload.Error. In Python, exceptions that are neither
// kvoffload's nor std::bad_alloc (a std::out_of_range from the standard library, say) keep
// nanobind's translation. classify() is the one place that maps an
// exception to its row; the C API's guard and the Python binding both call it.

#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

#include "kvoffload/export.hpp"

namespace kvoffload {

/// Base of every exception kvoffload throws. Messages name the request, job, group or field
/// that was wrong.
class KVOFFLOAD_EXPORT error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  ~error() override;
};

/// Bad input from the caller: an invalid configuration, an unknown request or job, block ids
/// that break the contract. The object that threw is unchanged.
class KVOFFLOAD_EXPORT invalid_argument : public error {
 public:
  using error::error;
  ~invalid_argument() override;
};

/// A CUDA runtime or driver call failed.
class KVOFFLOAD_EXPORT cuda_error : public error {
 public:
  using error::error;
  ~cuda_error() override;
};

/// Host or device memory could not be allocated.
class KVOFFLOAD_EXPORT out_of_memory : public error {
 public:
  using error::error;
  ~out_of_memory() override;
};

/// Not available in this build or on this machine: the CUDA backend without a CUDA build or
/// without a visible device.
class KVOFFLOAD_EXPORT unsupported : public error {
 public:
  using error::error;
  ~unsupported() override;
};

/// The operating system refused: a file or directory that cannot be created, opened, read or
/// written (a disk tier's). Not a bug in kvoffload: the message names the path and the
/// system's reason.
class KVOFFLOAD_EXPORT io_error : public error {
 public:
  using error::error;
  ~io_error() override;
};

/// A row of the table above. The values are the C API's kvoffload_status_t.
enum class ErrorCode : int {
  ok = 0,
  invalid_argument = 1,
  out_of_memory = 2,
  cuda_error = 3,
  unsupported = 4,
  internal = 5,
  io_error = 6,
};

/// "ok", "invalid_argument", "out_of_memory", "cuda_error", "unsupported", "internal",
/// "io_error".
KVOFFLOAD_EXPORT std::string_view to_string(ErrorCode code) noexcept;

struct ClassifiedError {
  ErrorCode code = ErrorCode::internal;
  std::string message;
};

/// The row of an exception (null: ok) and its message. Never throws.
KVOFFLOAD_EXPORT ClassifiedError classify(const std::exception_ptr& e) noexcept;

/// Throws the C++ exception of `code`'s row with `message` (the base `error` for internal,
/// nothing for ok). For tests of the table through the C and Python layers.
KVOFFLOAD_EXPORT void throw_error_for_test(ErrorCode code, const std::string& message);

}  // namespace kvoffload
