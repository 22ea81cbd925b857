#include "kvoffload/error.hpp"

#include <filesystem>
#include <ios>
#include <new>

namespace kvoffload {

// Out-of-line destructors anchor the vtables (and type_info) in the shared library, so an
// exception thrown inside it is caught by type in the engine.
error::~error() = default;
invalid_argument::~invalid_argument() = default;
cuda_error::~cuda_error() = default;
out_of_memory::~out_of_memory() = default;
unsupported::~unsupported() = default;
io_error::~io_error() = default;

std::string_view to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::ok: return "ok";
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::out_of_memory: return "out_of_memory";
    case ErrorCode::cuda_error: return "cuda_error";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::internal: return "internal";
    case ErrorCode::io_error: return "io_error";
  }
  return "unknown";
}

ClassifiedError classify(const std::exception_ptr& e) noexcept {
  if (!e) return {ErrorCode::ok, {}};
  try {
    try {
      std::rethrow_exception(e);
    } catch (const invalid_argument& x) {
      return {ErrorCode::invalid_argument, x.what()};
    } catch (const out_of_memory& x) {
      return {ErrorCode::out_of_memory, x.what()};
    } catch (const std::bad_alloc&) {
      return {ErrorCode::out_of_memory, "out of host memory"};
    } catch (const cuda_error& x) {
      return {ErrorCode::cuda_error, x.what()};
    } catch (const unsupported& x) {
      return {ErrorCode::unsupported, x.what()};
    } catch (const io_error& x) {
      return {ErrorCode::io_error, x.what()};
    } catch (const std::filesystem::filesystem_error& x) {
      return {ErrorCode::io_error, x.what()};
    } catch (const std::ios_base::failure& x) {
      // Other std::system_errors (a thread joined twice, a mutex misused) are bugs: internal.
      return {ErrorCode::io_error, x.what()};
    } catch (const std::exception& x) {
      return {ErrorCode::internal, x.what()};
    } catch (...) {
      return {ErrorCode::internal, "unknown exception"};
    }
  } catch (...) {  // copying a message ran out of memory
    return {ErrorCode::out_of_memory, {}};
  }
}

void throw_error_for_test(ErrorCode code, const std::string& message) {
  switch (code) {
    case ErrorCode::ok: return;
    case ErrorCode::invalid_argument: throw invalid_argument(message);
    case ErrorCode::out_of_memory: throw out_of_memory(message);
    case ErrorCode::cuda_error: throw cuda_error(message);
    case ErrorCode::unsupported: throw unsupported(message);
    case ErrorCode::internal: throw error(message);
    case ErrorCode::io_error: throw io_error(message);
  }
  throw invalid_argument("throw_error_for_test: unknown code " +
                         std::to_string(static_cast<int>(code)));
}

}  // namespace kvoffload
