#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <string>
#include <vector>

#include "kvoffload/enums.hpp"
#include "kvoffload/error.hpp"

using namespace kvoffload;
using Catch::Matchers::ContainsSubstring;

namespace {

// Every enumerator's name parses back to it, names are distinct, and a wrong name is refused
// naming the field and listing the accepted names (written out here, not read from the code).
template <class E, class Parse>
void check_names(const std::vector<E>& values, const std::vector<std::string>& names, Parse parse,
                 const std::string& listed) {
  REQUIRE(values.size() == names.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    CHECK(to_string(values[i]) == names[i]);
    CHECK(parse(names[i], "field") == values[i]);
  }
  CHECK_THROWS_AS(parse("nonsense", "cfg.field"), invalid_argument);
  CHECK_THROWS_WITH(parse("nonsense", "cfg.field"),
                    ContainsSubstring("cfg.field: unknown") &&
                        ContainsSubstring("\"nonsense\" (" + listed + ")"));
  CHECK(to_string(static_cast<E>(200)) == "unknown");
}

}  // namespace

TEST_CASE("Every public enum has names that parse back, and bad names are refused by field",
          "[enums]") {
  check_names<GroupKind>({GroupKind::full_attention, GroupKind::sliding_window, GroupKind::mamba},
                         {"full_attention", "sliding_window", "mamba"}, parse_group_kind,
                         "full_attention, sliding_window or mamba");
  check_names<JobKind>({JobKind::load, JobKind::store, JobKind::promote, JobKind::write},
                       {"load", "store", "promote", "write"}, parse_job_kind,
                       "load, store, promote or write");
  check_names<BackendKind>({BackendKind::host, BackendKind::cuda}, {"host", "cuda"},
                           parse_backend_kind, "host or cuda");
  check_names<Medium>({Medium::host, Medium::disk, Medium::shared}, {"host", "disk", "shared"},
                      parse_medium, "host, disk or shared");
  check_names<DiskIo>({DiskIo::automatic, DiskIo::io_uring, DiskIo::threads},
                      {"auto", "io_uring", "threads"}, parse_disk_io, "auto, io_uring or threads");
  check_names<EvictionPolicyKind>(
      {EvictionPolicyKind::lru, EvictionPolicyKind::arc, EvictionPolicyKind::reuse},
      {"lru", "arc", "reuse"}, parse_eviction_policy, "lru, arc or reuse");
  check_names<HugePages>({HugePages::off, HugePages::prefer, HugePages::require},
                         {"off", "prefer", "require"}, parse_huge_pages, "off, prefer or require");
  check_names<Pinning>({Pinning::automatic, Pinning::off, Pinning::require},
                       {"auto", "off", "require"}, parse_pinning, "auto, off or require");
  check_names<CopyMode>(
      {CopyMode::automatic, CopyMode::batch, CopyMode::memcpy, CopyMode::kernel, CopyMode::staged},
      {"auto", "batch", "memcpy", "kernel", "staged"}, parse_copy_mode,
      "auto, batch, memcpy, kernel or staged");
  CHECK(to_string(LookupResult::pending) == "pending");
  // The C API's numbering (kvoffload.h: KVOFFLOAD_JOB_LOAD 0, _STORE 1, _TIER_PROMOTE 2,
  // _TIER_WRITE 3), and which kinds are a tier job's.
  CHECK(static_cast<int>(JobKind::load) == 0);
  CHECK(static_cast<int>(JobKind::store) == 1);
  CHECK(static_cast<int>(JobKind::promote) == 2);
  CHECK(static_cast<int>(JobKind::write) == 3);
  CHECK_FALSE(is_tier_job(JobKind::load));
  CHECK_FALSE(is_tier_job(JobKind::store));
  CHECK(is_tier_job(JobKind::promote));
  CHECK(is_tier_job(JobKind::write));
}
