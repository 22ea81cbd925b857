#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "kvoffload/error.hpp"
#include "kvoffload/job.hpp"

using namespace kvoffload;
using Catch::Matchers::ContainsSubstring;

namespace {

TransferJob job_with(std::vector<std::uint32_t> key_groups, std::vector<GpuBlockId> ids,
                     std::vector<std::int64_t> sizes, std::vector<std::int64_t> indices) {
  TransferJob job;
  job.id = 7;
  for (std::size_t i = 0; i < key_groups.size(); ++i) {
    job.keys.push_back(Key{BlockHash::from_hex("0a"), key_groups[i]});
    job.host_block_ids.push_back(static_cast<HostBlockId>(i));
  }
  job.gpu = GpuSpec{std::move(ids), std::move(sizes), std::move(indices)};
  return job;
}

}  // namespace

TEST_CASE("check_job_invariants accepts the straddle job", "[job]") {
  // f = 3: group 1 starts two sub-blocks into its first host block, 10 ids over 4 host blocks.
  const auto job = job_with({0, 0, 0, 0, 1, 1, 1, 1}, {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11,
                                                       12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22},
                            {12, 10}, {0, 2});
  CHECK_NOTHROW(check_job_invariants(job, 2, 3));
}

TEST_CASE("check_job_invariants rejects what the seed bug produced", "[job]") {
  // vLLM counted f per offloaded block: 12 for group 1 although 2 sub-blocks were null.
  const auto seed_bug =
      job_with({0, 0, 0, 0, 1, 1, 1, 1},
               {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22},
               {12, 12}, {0, 0});
  CHECK_THROWS_WITH(check_job_invariants(seed_bug, 2, 3), ContainsSubstring("job 7"));
  CHECK_THROWS_AS(check_job_invariants(seed_bug, 2, 3), invalid_argument);
}

TEST_CASE("check_job_invariants names the broken rule", "[job]") {
  SECTION("a null id") {
    auto j = job_with({0}, {1, 0, 3}, {3}, {0});
    CHECK_THROWS_WITH(check_job_invariants(j, 1, 3), ContainsSubstring("null block"));
  }
  SECTION("too few host blocks for the group") {
    auto j = job_with({0}, {1, 2, 3, 4}, {4}, {0});
    CHECK_THROWS_WITH(check_job_invariants(j, 1, 3), ContainsSubstring("group 0"));
  }
  SECTION("a missing group size") {
    auto j = job_with({0}, {1}, {1}, {0});
    CHECK_THROWS_WITH(check_job_invariants(j, 2, 1), ContainsSubstring("2 groups"));
  }
  SECTION("keys out of group order") {
    auto j = job_with({1, 0}, {1, 2}, {1, 1}, {0, 0});
    CHECK_THROWS_AS(check_job_invariants(j, 2, 1), invalid_argument);
  }
}
