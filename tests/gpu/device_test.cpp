// [gpu] tests run on a machine with a CUDA device (the GPU bundle: scripts/gpu-bundle) and skip
// elsewhere.

#include <catch2/catch_test_macros.hpp>

#include "kvoffload/device.hpp"

TEST_CASE("The library reports the CUDA build it was configured with", "[device]") {
  CHECK(kvoffload::built_with_cuda() == (KVOFFLOAD_TEST_WITH_CUDA != 0));
  if (!kvoffload::built_with_cuda()) CHECK(kvoffload::cuda_device_count() == 0);
}

TEST_CASE("A CUDA build sees the device of a GPU runner", "[gpu][device]") {
  if (kvoffload::cuda_device_count() == 0) SKIP("no CUDA device");
  CHECK(kvoffload::built_with_cuda());
  CHECK(kvoffload::cuda_device_count() >= 1);
}
