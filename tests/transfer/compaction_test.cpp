// The GPU compaction's logic through Thrust on its CPU backend, with the predicate the CUB
// kernels use, against a plain reference.

#include <algorithm>
#include <random>

#include <thrust/copy.h>
#include <thrust/execution_policy.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/reduce.h>
#include <catch2/catch_test_macros.hpp>

#include "kvoffload/detail/copy_body.hpp"

using kvoffload::detail::NotNullBlock;

namespace {

struct IsReal {
  std::int64_t operator()(std::int32_t id) const { return NotNullBlock{}(id) ? 1 : 0; }
};

}  // namespace

TEST_CASE("Compaction drops null ids and counts each group, for 1 to 1M ids", "[compaction]") {
  std::mt19937 rng(11);
  for (const std::int64_t n : {1, 7, 1000, 65536, 1 << 20}) {
    const int groups = 1 + static_cast<int>(rng() % 4);
    std::vector<std::int64_t> offsets{0};
    for (int g = 1; g < groups; ++g)
      offsets.push_back(static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(n + 1)));
    offsets.push_back(n);
    std::sort(offsets.begin(), offsets.end());
    // Window groups: a leading run of nulls, as the engine's block tables have.
    std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
    for (int g = 0; g < groups; ++g) {
      const std::int64_t len = offsets[g + 1] - offsets[g];
      const std::int64_t nulls =
          len == 0 ? 0 : static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(len + 1));
      for (std::int64_t i = 0; i < len; ++i) {
        ids[static_cast<std::size_t>(offsets[g] + i)] =
            i < nulls ? 0 : static_cast<std::int32_t>(1 + rng() % 100000);
      }
    }
    std::vector<std::int32_t> out(ids.size());
    const auto end =
        thrust::copy_if(thrust::host, ids.begin(), ids.end(), out.begin(), NotNullBlock{});
    out.resize(static_cast<std::size_t>(end - out.begin()));
    std::vector<std::int64_t> counts(static_cast<std::size_t>(groups));
    for (int g = 0; g < groups; ++g) {
      auto first = thrust::make_transform_iterator(ids.begin() + offsets[g], IsReal{});
      counts[static_cast<std::size_t>(g)] = thrust::reduce(
          thrust::host, first, first + (offsets[g + 1] - offsets[g]), std::int64_t{0});
    }
    // The reference.
    std::vector<std::int32_t> want;
    std::vector<std::int64_t> want_counts(static_cast<std::size_t>(groups), 0);
    for (int g = 0; g < groups; ++g) {
      for (std::int64_t i = offsets[g]; i < offsets[g + 1]; ++i) {
        if (ids[static_cast<std::size_t>(i)] != 0) {
          want.push_back(ids[static_cast<std::size_t>(i)]);
          ++want_counts[static_cast<std::size_t>(g)];
        }
      }
    }
    INFO(n << " ids in " << groups << " groups");
    CHECK(out == want);
    CHECK(counts == want_counts);
  }
}
