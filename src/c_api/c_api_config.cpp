// The C API's configuration structs, as C++ configs: one conversion per field type, applied to
// each list of kvoffload/detail/config_fields.hpp (the C structs name their fields as C++
// does). Converting starts nothing: services are started once a config is whole and valid.

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include "c_api/c_api_common.hpp"
#include "kvoffload/detail/config_fields.hpp"

namespace kvoffload::capi {
namespace {

using capi::from_c;  // the shared tier's and the scheduler's (c_api_common.hpp), beside these

// One field of a C struct into its C++ field. A NULL string keeps the C++ default (what the
// *_INIT macros say NULL means); required strings are checked before.
void convert(std::int64_t in, std::int64_t& out, const std::string&) {
  out = in;
}
void convert(std::uint64_t in, std::uint64_t& out, const std::string&) {
  out = in;
}
void convert(int in, int& out, const std::string&) {
  out = in;
}
void convert(int in, bool& out, const std::string&) {
  out = in != 0;
}
void convert(const char* in, std::string& out, const std::string&) {
  if (in != nullptr) out = in;
}
void convert(const char* in, Medium& out, const std::string& what) {
  if (in != nullptr) out = parse_medium(in, what);
}
void convert(const char* in, EvictionPolicyKind& out, const std::string& what) {
  if (in != nullptr) out = parse_eviction_policy(in, what);
}
void convert(const char* in, DiskIo& out, const std::string& what) {
  if (in != nullptr) out = parse_disk_io(in, what);
}

/// True if a struct of `size` bytes (its struct_size) holds the field at [offset, offset + n).
constexpr bool covers(std::size_t size, std::size_t offset, std::size_t n) noexcept {
  return size >= offset + n;
}

GroupKind to_kind(const kvoffload_group_kind_t& kind, std::string_view fn, const std::string& what,
                  std::size_t g) {
  const int k = raw_enum(kind);
  switch (k) {
    case KVOFFLOAD_FULL_ATTENTION: return GroupKind::full_attention;
    case KVOFFLOAD_SLIDING_WINDOW: return GroupKind::sliding_window;
    case KVOFFLOAD_MAMBA: return GroupKind::mamba;
    default: break;
  }
  throw invalid_argument(
      fmt::format("{}: {}->groups[{}].kind is {} (0 full attention, 1 sliding window, 2 mamba)", fn,
                  what, g, k));
}

DiskTierConfig from_c(const kvoffload_disk_tier_config_t& c, std::string_view fn,
                      const std::string& what) {
  require_struct_size(c.struct_size, sizeof(kvoffload_disk_tier_config_t), fn, what,
                      "KVOFFLOAD_DISK_TIER_CONFIG_INIT");
  require(c.path, fn, what + ".path");
  DiskTierConfig out;
#define KVOFFLOAD_FROM_C(name) convert(c.name, out.name, what + "." #name);
  KVOFFLOAD_DISK_TIER_CONFIG_FIELDS(KVOFFLOAD_FROM_C)
#undef KVOFFLOAD_FROM_C
  return out;
}

TierConfig from_c(const kvoffload_tier_config_t& given, std::string_view fn,
                  const std::string& what) {
  // Structs from before the shared and disk fields are accepted (no store then); the fields
  // after their end take their defaults.
  constexpr std::size_t v1_size = offsetof(kvoffload_tier_config_t, shared);
  require_struct_size(given.struct_size, v1_size, fn, what, "KVOFFLOAD_TIER_CONFIG_INIT");
  kvoffload_tier_config_t c = KVOFFLOAD_TIER_CONFIG_INIT;
  std::memcpy(&c, &given, std::min(given.struct_size, sizeof(c)));
  TierConfig out;
#define KVOFFLOAD_FROM_C(name) convert(c.name, out.name, what + "." #name);
  KVOFFLOAD_TIER_CONFIG_FIELDS(KVOFFLOAD_FROM_C)
#undef KVOFFLOAD_FROM_C
  const kvoffload_shared_tier_config_t* shared =
      covers(c.struct_size, offsetof(kvoffload_tier_config_t, shared), sizeof(void*)) ? c.shared
                                                                                      : nullptr;
  const kvoffload_disk_tier_config_t* disk =
      covers(c.struct_size, offsetof(kvoffload_tier_config_t, disk), sizeof(void*)) ? c.disk
                                                                                    : nullptr;
  if (shared != nullptr && out.medium != Medium::shared) {
    throw invalid_argument(
        fmt::format("{}: {}.shared is set but the medium is {}", fn, what, to_string(out.medium)));
  }
  if (disk != nullptr && out.medium != Medium::disk) {
    throw invalid_argument(
        fmt::format("{}: {}.disk is set but the medium is {}", fn, what, to_string(out.medium)));
  }
  if (out.medium == Medium::shared && shared == nullptr) {
    throw invalid_argument(fmt::format(
        "{}: {}.shared is NULL: a shared tier needs its cluster (the scheduler's existence "
        "checks ask it, the workers read and write it)",
        fn, what));
  }
  if (shared != nullptr) out.store = from_c(*shared, fn, what + ".shared");
  if (disk != nullptr) out.store = from_c(*disk, fn, what + ".disk");
  return out;
}

}  // namespace

SharedTierConfig from_c(const kvoffload_shared_tier_config_t& given, std::string_view fn,
                        const std::string& what) {
  // Structs from before secret_file are accepted; the fields after their end take their
  // defaults.
  constexpr std::size_t v1_size = offsetof(kvoffload_shared_tier_config_t, secret_file);
  require_struct_size(given.struct_size, v1_size, fn, what, "KVOFFLOAD_SHARED_TIER_CONFIG_INIT");
  kvoffload_shared_tier_config_t c = KVOFFLOAD_SHARED_TIER_CONFIG_INIT;
  std::memcpy(&c, &given, std::min(given.struct_size, sizeof(c)));
  require(c.nodes, fn, what + ".nodes");
  require(c.name, fn, what + ".name");
  SharedTierConfig out;
#define KVOFFLOAD_FROM_C(name) convert(c.name, out.name, what + "." #name);
  KVOFFLOAD_SHARED_TIER_CONFIG_FIELDS(KVOFFLOAD_FROM_C)
#undef KVOFFLOAD_FROM_C
  return out;
}

SchedulerConfig from_c(const kvoffload_scheduler_config_t& c, std::string_view fn,
                       const std::string& what) {
  // Structs from before threshold_tracker_keys are accepted; that field and the tiers then
  // take their defaults.
  constexpr std::size_t v1_size = offsetof(kvoffload_scheduler_config_t, threshold_tracker_keys);
  require_struct_size(c.struct_size, v1_size, fn, what, "KVOFFLOAD_SCHEDULER_CONFIG_INIT");
  require_array(c.groups, c.num_groups, fn, what + "->groups");
  SchedulerConfig s;
  for (std::size_t g = 0; g < c.num_groups; ++g) {
    s.groups.push_back({to_kind(c.groups[g].kind, fn, what, g), c.groups[g].gpu_block_size,
                        c.groups[g].sliding_window});
  }
#define KVOFFLOAD_FROM_C(name)                                                            \
  if (covers(c.struct_size, offsetof(kvoffload_scheduler_config_t, name), sizeof c.name)) \
    convert(c.name, s.name, what + "->" #name);
  KVOFFLOAD_SCHEDULER_CONFIG_FIELDS(KVOFFLOAD_FROM_C)
#undef KVOFFLOAD_FROM_C
#define KVOFFLOAD_FROM_C(name)                                                            \
  if (covers(c.struct_size, offsetof(kvoffload_scheduler_config_t, name), sizeof c.name)) \
    convert(c.name, s.manager.name, what + "->" #name);
  KVOFFLOAD_MANAGER_CONFIG_FIELDS(KVOFFLOAD_FROM_C)
#undef KVOFFLOAD_FROM_C
  if (covers(c.struct_size, offsetof(kvoffload_scheduler_config_t, num_tiers),
             sizeof c.num_tiers)) {
    require_array(c.tiers, c.num_tiers, fn, what + "->tiers");
    // An array is read with this header's stride: an older, shorter element would put
    // tiers[1] at the wrong address, so only a single tier may be of an older size.
    if (c.num_tiers > 1 && c.tiers[0].struct_size != sizeof(kvoffload_tier_config_t)) {
      throw invalid_argument(fmt::format(
          "{}: {}->tiers[0].struct_size is {}, but an array of tiers needs this library's size "
          "{} (initialize each with KVOFFLOAD_TIER_CONFIG_INIT)",
          fn, what, c.tiers[0].struct_size, sizeof(kvoffload_tier_config_t)));
    }
    for (std::size_t t = 0; t < c.num_tiers; ++t) {
      s.tiers.push_back(from_c(c.tiers[t], fn, fmt::format("{}->tiers[{}]", what, t)));
    }
  }
  s.validate();
  return s;
}

}  // namespace kvoffload::capi
