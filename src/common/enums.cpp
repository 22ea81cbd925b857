#include "kvoffload/enums.hpp"

#include <array>
#include <string>

#include "common/expects.hpp"

namespace kvoffload {
namespace {

// One table per enum, in enumerator order: to_string indexes it, parse searches it.
constexpr std::array<std::string_view, 3> kGroupKind{"full_attention", "sliding_window", "mamba"};
constexpr std::array<std::string_view, 4> kJobKind{"load", "store", "promote", "write"};
constexpr std::array<std::string_view, 2> kBackendKind{"host", "cuda"};
constexpr std::array<std::string_view, 3> kMedium{"host", "disk", "shared"};
constexpr std::array<std::string_view, 3> kDiskIo{"auto", "io_uring", "threads"};
constexpr std::array<std::string_view, 3> kEvictionPolicy{"lru", "arc", "reuse"};
constexpr std::array<std::string_view, 3> kLookupResult{"miss", "pending", "hit"};
constexpr std::array<std::string_view, 3> kHugePages{"off", "prefer", "require"};
constexpr std::array<std::string_view, 3> kPinning{"auto", "off", "require"};
constexpr std::array<std::string_view, 5> kCopyMode{"auto", "batch", "memcpy", "kernel", "staged"};

template <std::size_t N>
std::string_view name_of(const std::array<std::string_view, N>& names, std::uint8_t v) noexcept {
  return v < N ? names[v] : std::string_view("unknown");
}

/// The index of `name` in `names`, or invalid_argument: "<field>: unknown <what> "<name>"
/// (a, b or c)".
template <std::size_t N>
std::uint8_t index_of(const std::array<std::string_view, N>& names, std::string_view name,
                      std::string_view field, std::string_view what) {
  for (std::size_t i = 0; i < N; ++i) {
    if (names[i] == name) return static_cast<std::uint8_t>(i);
  }
  std::string list;
  for (std::size_t i = 0; i < N; ++i) {
    list += i == 0 ? "" : (i + 1 == N ? " or " : ", ");
    list += names[i];
  }
  throw invalid_argument(fmt::format("{}: unknown {} \"{}\" ({})", field, what, name, list));
}

}  // namespace

#define KVOFFLOAD_ENUM_NAMES(Enum, table, parse, what)            \
  std::string_view to_string(Enum v) noexcept {                   \
    return name_of(table, static_cast<std::uint8_t>(v));          \
  }                                                               \
  Enum parse(std::string_view name, std::string_view field) {     \
    return static_cast<Enum>(index_of(table, name, field, what)); \
  }

KVOFFLOAD_ENUM_NAMES(GroupKind, kGroupKind, parse_group_kind, "group kind")
KVOFFLOAD_ENUM_NAMES(JobKind, kJobKind, parse_job_kind, "job kind")
KVOFFLOAD_ENUM_NAMES(BackendKind, kBackendKind, parse_backend_kind, "backend")
KVOFFLOAD_ENUM_NAMES(Medium, kMedium, parse_medium, "medium")
KVOFFLOAD_ENUM_NAMES(DiskIo, kDiskIo, parse_disk_io, "disk I/O engine")
KVOFFLOAD_ENUM_NAMES(EvictionPolicyKind, kEvictionPolicy, parse_eviction_policy, "eviction policy")
KVOFFLOAD_ENUM_NAMES(HugePages, kHugePages, parse_huge_pages, "huge page setting")
KVOFFLOAD_ENUM_NAMES(Pinning, kPinning, parse_pinning, "pinning")
KVOFFLOAD_ENUM_NAMES(CopyMode, kCopyMode, parse_copy_mode, "copy mode")
#undef KVOFFLOAD_ENUM_NAMES

std::string_view to_string(LookupResult v) noexcept {
  return name_of(kLookupResult, static_cast<std::uint8_t>(v));
}

}  // namespace kvoffload
