#include <catch2/catch_test_macros.hpp>

#include <filesystem>
#include <new>
#include <stdexcept>
#include <system_error>

#include "kvoffload/device.hpp"
#include "kvoffload/error.hpp"
#include "kvoffload/scheduler.hpp"
#include "kvoffload/worker.hpp"

using namespace kvoffload;

namespace {

ClassifiedError classify_call(void (*fn)()) {
  try {
    fn();
  } catch (...) {
    return classify(std::current_exception());
  }
  return classify(nullptr);
}

}  // namespace

TEST_CASE("error.hpp's table: each C++ exception maps to its code, message kept", "[errors]") {
  // The table, written out (C status values from kvoffload.h).
  const std::pair<ErrorCode, int> rows[] = {
      {ErrorCode::invalid_argument, 1}, {ErrorCode::out_of_memory, 2}, {ErrorCode::cuda_error, 3},
      {ErrorCode::unsupported, 4},      {ErrorCode::internal, 5},      {ErrorCode::io_error, 6},
  };
  for (const auto& [code, status] : rows) {
    CAPTURE(to_string(code));
    CHECK(static_cast<int>(code) == status);
    try {
      throw_error_for_test(code, "row message");
      FAIL("nothing thrown");
    } catch (...) {
      const ClassifiedError e = classify(std::current_exception());
      CHECK(e.code == code);
      CHECK(e.message == "row message");
    }
  }
  CHECK(classify_call([] { throw std::bad_alloc(); }).code == ErrorCode::out_of_memory);
  CHECK(classify_call([] { throw std::runtime_error("x"); }).code == ErrorCode::internal);
  CHECK(classify_call([] { throw 42; }).code == ErrorCode::internal);
  CHECK(classify_call([] {
          throw std::filesystem::filesystem_error(
              "create_directories", std::make_error_code(std::errc::permission_denied));
        }).code == ErrorCode::io_error);
  // Other std::system_errors are the library misusing the standard library: bugs.
  CHECK(classify_call([] {
          throw std::system_error(std::make_error_code(std::errc::operation_not_permitted));
        }).code == ErrorCode::internal);
  CHECK(classify_call([] {}).code == ErrorCode::ok);
  // The exception classes are the library's error, so one catch takes them all.
  CHECK_THROWS_AS(throw_error_for_test(ErrorCode::unsupported, "u"), error);
}

TEST_CASE("Real failures land in their rows: bad config, CUDA backend without CUDA", "[errors]") {
  SchedulerConfig bad;
  bad.manager.host_blocks = 0;
  const ClassifiedError e = [&] {
    try {
      Scheduler s(bad);
    } catch (...) {
      return classify(std::current_exception());
    }
    return classify(nullptr);
  }();
  CHECK(e.code == ErrorCode::invalid_argument);

  if (cuda_device_count() > 0) SKIP("a CUDA device is visible: the CUDA backend is supported");
  std::vector<std::uint8_t> gpu(8 * 64);
  WorkerConfig c;
  c.tensors = {{reinterpret_cast<std::uintptr_t>(gpu.data()), 8, 64, 64}};
  c.groups = {{{0, 64}}};
  c.host_blocks = 4;
  c.backend = BackendKind::cuda;
  CHECK_THROWS_AS(Worker(c), unsupported);
}
