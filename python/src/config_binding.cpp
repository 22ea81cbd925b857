// The Python config dataclasses as C++ configs, and their defaults: each list of
// kvoffload/detail/config_fields.hpp applied to same-named attributes, so no field is mapped
// by position or given a default of its own here.

#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>

#include "bindings.hpp"
#include "kvoffload/byte_size.hpp"
#include "kvoffload/detail/config_fields.hpp"
#include "kvoffload/error.hpp"

namespace nb = nanobind;

namespace kvoffload::python {
namespace {

/// Attribute `name` of `obj` as T; a wrong type is an InvalidArgument naming the field.
template <class T>
T attr_as(nb::handle obj, const char* name, const std::string& what) {
  nb::object v = obj.attr(name);
  T out{};
  if (!nb::try_cast<T>(v, out)) {
    throw invalid_argument(what + "." + name + ": expected " +
                           (std::is_same_v<T, std::string> ? std::string("a string")
                            : std::is_same_v<T, bool>      ? std::string("a bool")
                                                           : std::string("an int")) +
                           ", got " + nb::cast<std::string>(nb::str(v.type().attr("__name__"))));
  }
  return out;
}

void read(nb::handle o, const char* n, std::int64_t& out, const std::string& w) {
  out = attr_as<std::int64_t>(o, n, w);
}
void read(nb::handle o, const char* n, int& out, const std::string& w) {
  out = attr_as<int>(o, n, w);
}
void read(nb::handle o, const char* n, bool& out, const std::string& w) {
  out = attr_as<bool>(o, n, w);
}
void read(nb::handle o, const char* n, std::string& out, const std::string& w) {
  out = attr_as<std::string>(o, n, w);
}
/// A byte count: an int, or a string the library's parser reads ("500GiB").
void read(nb::handle o, const char* n, std::uint64_t& out, const std::string& w) {
  nb::object v = o.attr(n);
  const std::string field = w + "." + n;
  if (nb::isinstance<nb::bool_>(v)) throw invalid_argument(field + ": expected bytes, got a bool");
  if (nb::isinstance<nb::int_>(v)) {
    const auto bytes = nb::cast<std::int64_t>(v);
    if (bytes <= 0)
      throw invalid_argument(field + ": " + std::to_string(bytes) + " is not positive");
    out = static_cast<std::uint64_t>(bytes);
    return;
  }
  out = parse_bytes(nb::cast<std::string>(nb::str(v)), field);
}
#define KVOFFLOAD_READ_ENUM(Type, parse)                                    \
  void read(nb::handle o, const char* n, Type& out, const std::string& w) { \
    out = parse(attr_as<std::string>(o, n, w), w + "." + n);                \
  }
KVOFFLOAD_READ_ENUM(GroupKind, parse_group_kind)
KVOFFLOAD_READ_ENUM(Medium, parse_medium)
KVOFFLOAD_READ_ENUM(EvictionPolicyKind, parse_eviction_policy)
KVOFFLOAD_READ_ENUM(DiskIo, parse_disk_io)
KVOFFLOAD_READ_ENUM(BackendKind, parse_backend_kind)
KVOFFLOAD_READ_ENUM(CopyMode, parse_copy_mode)
#undef KVOFFLOAD_READ_ENUM

/// A C++ default as the dataclass spells it: enums by name.
template <class T>
nb::object to_py(const T& v) {
  if constexpr (std::is_enum_v<T>) {
    return nb::cast(std::string(to_string(v)));
  } else {
    return nb::cast(v);
  }
}

/// A tier's store: a DiskTierConfig or a SharedTierConfig (by its class attribute `medium`).
TierStore store_from_py(nb::handle obj, const std::string& what) {
  Medium medium = Medium::host;
  read(obj, "medium", medium, what);
  if (medium == Medium::disk) {
    DiskTierConfig c;
#define KVOFFLOAD_READ(name) read(obj, #name, c.name, what);
    KVOFFLOAD_DISK_TIER_CONFIG_FIELDS(KVOFFLOAD_READ)
#undef KVOFFLOAD_READ
    return c;
  }
  if (medium == Medium::shared) return shared_config_from_py(obj, what);
  throw invalid_argument(what + ": a DiskTierConfig or a SharedTierConfig, not a " +
                         std::string(to_string(medium)) + " store");
}

}  // namespace

SharedTierConfig shared_config_from_py(nb::handle obj, const std::string& what) {
  SharedTierConfig c;
#define KVOFFLOAD_READ(name) read(obj, #name, c.name, what);
  KVOFFLOAD_SHARED_TIER_CONFIG_FIELDS(KVOFFLOAD_READ)
#undef KVOFFLOAD_READ
  return c;
}

SchedulerConfig scheduler_config_from_py(nb::handle obj) {
  SchedulerConfig c;
  const std::string what = "SchedulerConfig";
#define KVOFFLOAD_READ(name) read(obj, #name, c.name, what);
  KVOFFLOAD_SCHEDULER_CONFIG_FIELDS(KVOFFLOAD_READ)
#undef KVOFFLOAD_READ
#define KVOFFLOAD_READ(name) read(obj, #name, c.manager.name, what);
  KVOFFLOAD_MANAGER_CONFIG_FIELDS(KVOFFLOAD_READ)
#undef KVOFFLOAD_READ
  std::size_t g = 0;
  for (nb::handle group : obj.attr("groups")) {
    GroupConfig gc;
    const std::string gw = "groups[" + std::to_string(g++) + "]";
#define KVOFFLOAD_READ(name) read(group, #name, gc.name, gw);
    KVOFFLOAD_GROUP_CONFIG_FIELDS(KVOFFLOAD_READ)
#undef KVOFFLOAD_READ
    c.groups.push_back(gc);
  }
  std::size_t t = 0;
  for (nb::handle tier : obj.attr("tiers")) {
    TierConfig tc;
    const std::string tw = "tiers[" + std::to_string(t++) + "]";
#define KVOFFLOAD_READ(name) read(tier, #name, tc.name, tw);
    KVOFFLOAD_TIER_CONFIG_FIELDS(KVOFFLOAD_READ)
#undef KVOFFLOAD_READ
    nb::object store = tier.attr("store");
    if (!store.is_none()) tc.store = store_from_py(store, tw + ".store");
    c.tiers.push_back(std::move(tc));
  }
  return c;
}

WorkerConfig worker_config_from_py(nb::handle obj) {
  WorkerConfig c;
  const std::string what = "WorkerConfig";
#define KVOFFLOAD_READ(name) read(obj, #name, c.name, what);
  KVOFFLOAD_WORKER_CONFIG_FIELDS(KVOFFLOAD_READ)
#undef KVOFFLOAD_READ
  for (nb::handle t : obj.attr("tensors")) {
    c.tensors.push_back({nb::cast<std::uintptr_t>(t.attr("base")),
                         nb::cast<std::int64_t>(t.attr("num_blocks")),
                         nb::cast<std::int64_t>(t.attr("page_bytes")),
                         nb::cast<std::int64_t>(t.attr("block_stride_bytes"))});
  }
  for (nb::handle g : obj.attr("groups")) {
    std::vector<GroupTensor> gt;
    for (nb::handle pair : g) {
      gt.push_back({nb::cast<std::int32_t>(pair[0]), nb::cast<std::int64_t>(pair[1])});
    }
    c.groups.push_back(std::move(gt));
  }
  // Python resolves the stream object to its handle (kvoffload.stream_handle) first.
  nb::object stream = obj.attr("compute_stream");
  if (!stream.is_none()) c.compute_stream = nb::cast<std::uintptr_t>(stream);
  std::size_t t = 0;
  for (nb::handle store : obj.attr("tiers")) {
    c.tiers.push_back(store_from_py(store, "tiers[" + std::to_string(t++) + "]"));
  }
  return c;
}

namespace {

// d[name] = c's default for each field of LIST, and the statements after it.
#define KVOFFLOAD_PUT(name) d[#name] = to_py(c.name);
#define KVOFFLOAD_DEFAULTS_OF(Type, LIST, ...) \
  out[#Type] = [] {                            \
    const Type c;                              \
    nb::dict d;                                \
    LIST(KVOFFLOAD_PUT)                        \
    __VA_ARGS__                                \
    return d;                                  \
  }()

/// Each dataclass's C++ defaults, field by field under the same names.
nb::dict config_defaults() {
  nb::dict out;
  KVOFFLOAD_DEFAULTS_OF(GroupConfig, KVOFFLOAD_GROUP_CONFIG_FIELDS);
  KVOFFLOAD_DEFAULTS_OF(TierConfig, KVOFFLOAD_TIER_CONFIG_FIELDS, d["store"] = nb::none(););
  KVOFFLOAD_DEFAULTS_OF(DiskTierConfig, KVOFFLOAD_DISK_TIER_CONFIG_FIELDS);
  KVOFFLOAD_DEFAULTS_OF(SharedTierConfig, KVOFFLOAD_SHARED_TIER_CONFIG_FIELDS);
  KVOFFLOAD_DEFAULTS_OF(
      WorkerConfig, KVOFFLOAD_WORKER_CONFIG_FIELDS,
      d["compute_stream"] = c.compute_stream ? nb::cast(*c.compute_stream) : nb::none();
      d["tiers"] = nb::list(););
  {
    const SchedulerConfig c;
    nb::dict d;
    KVOFFLOAD_SCHEDULER_CONFIG_FIELDS(KVOFFLOAD_PUT)
#define KVOFFLOAD_PUT_MANAGER(name) d[#name] = to_py(c.manager.name);
    KVOFFLOAD_MANAGER_CONFIG_FIELDS(KVOFFLOAD_PUT_MANAGER)
    // A default model or default tiers would not match the dataclass's empty lists.
    d["groups"] = c.groups.empty() ? nb::object(nb::list()) : nb::none();
    d["tiers"] = c.tiers.empty() ? nb::object(nb::list()) : nb::none();
    out["SchedulerConfig"] = d;
  }
#undef KVOFFLOAD_PUT_MANAGER
  return out;
}
#undef KVOFFLOAD_DEFAULTS_OF
#undef KVOFFLOAD_PUT

}  // namespace

void bind_config(nb::module_& m) {
  m.def("_config_defaults", &config_defaults,
        "Every config's C++ defaults by field, for the test that keeps the dataclasses equal.");
}

}  // namespace kvoffload::python
