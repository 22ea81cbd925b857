// The Python config dataclasses as C++ configs, and their defaults: each list of
// kvoffload/detail/config_fields.hpp applied to same-named attributes, so no field is mapped
// by position or given a default of its own here.

#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "bindings.hpp"
#include "kvoffload/byte_size.hpp"
#include "kvoffload/detail/config_fields.hpp"
#include "kvoffload/error.hpp"

namespace nb = nanobind;

namespace kvoffload::python {
namespace {

/// A Python value's type as a reader would name it ("int", "numpy.bool_", "dict").
std::string python_type(nb::handle v) {
  nb::handle type = v.type();
  const auto module = nb::cast<std::string>(nb::str(type.attr("__module__")));
  const auto name = nb::cast<std::string>(nb::str(type.attr("__qualname__")));
  return module == "builtins" ? name : module + "." + name;
}

/// Attribute `name` of `obj`; an object without it (a dict given for a dataclass, say) is an
/// InvalidArgument naming the field.
nb::object field_of(nb::handle obj, const char* name, const std::string& what) {
  if (!nb::hasattr(obj, name)) {
    throw invalid_argument(what + ": expected a kvoffload config with a field \"" + name +
                           "\", got " + python_type(obj));
  }
  return obj.attr(name);
}

/// `v` as T; a wrong type or an int out of T's range is an InvalidArgument naming `field`.
/// A bool is not an int here (True would be 1), though Python's bool is an int's subclass.
template <class T>
T value_as(nb::handle v, const std::string& field) {
  T out{};
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (nb::isinstance<nb::bool_>(v)) {
      throw invalid_argument(field + ": expected an int, got a bool");
    }
    if (nb::isinstance<nb::int_>(v) && !nb::try_cast<T>(v, out)) {
      throw invalid_argument(field + ": " + nb::cast<std::string>(nb::str(v)) + " is out of range");
    }
  }
  if constexpr (std::is_same_v<T, bool>) {
    // numpy's bool scalar ("numpy.bool", "numpy.bool_" before numpy 2) is a bool too.
    const std::string type = python_type(v);
    if (type == "numpy.bool" || type == "numpy.bool_") return PyObject_IsTrue(v.ptr()) == 1;
  }
  // convert: numpy's integer scalars are accepted like Python's ints.
  if (!nb::try_cast<T>(v, out, /*convert=*/!std::is_same_v<T, std::string>)) {
    const char* want = std::is_same_v<T, std::string> ? "a string"
                       : std::is_same_v<T, bool>      ? "a bool"
                                                      : "an int";
    throw invalid_argument(field + ": expected " + want + ", got " + python_type(v));
  }
  return out;
}

template <class T>
T attr_as(nb::handle obj, const char* name, const std::string& what) {
  return value_as<T>(field_of(obj, name, what), what + "." + name);
}

/// The items of a list (or tuple) field; anything else is an InvalidArgument naming it.
std::vector<nb::handle> items_of(nb::handle obj, const char* name, const std::string& what) {
  nb::object v = field_of(obj, name, what);
  if (!nb::isinstance<nb::list>(v) && !nb::isinstance<nb::tuple>(v)) {
    throw invalid_argument(what + "." + name + ": expected a list, got " + python_type(v));
  }
  std::vector<nb::handle> out;
  for (nb::handle item : v) out.push_back(item);
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
  nb::object v = field_of(o, n, w);
  const std::string field = w + "." + n;
  if (nb::isinstance<nb::bool_>(v)) throw invalid_argument(field + ": expected bytes, got a bool");
  if (nb::isinstance<nb::int_>(v)) {
    std::uint64_t bytes = 0;
    // A bound whose 0 means "none" (WorkerConfig's back-pressure): 0 is its default.
    const bool zero_is_none = std::string_view(n) == "max_store_bytes_in_flight";
    if (!nb::try_cast<std::uint64_t>(v, bytes) || (bytes == 0 && !zero_is_none)) {
      throw invalid_argument(field + ": " + nb::cast<std::string>(nb::str(v)) +
                             " is not a positive size below 2^64");
    }
    out = bytes;
    return;
  }
  if (!nb::isinstance<nb::str>(v)) {
    // numpy's integer scalars are ints too.
    std::uint64_t bytes = 0;
    if (nb::try_cast<std::uint64_t>(v, bytes, /*convert=*/true) && bytes > 0) {
      out = bytes;
      return;
    }
    throw invalid_argument(
        field + ": expected bytes (an int or a string such as \"500GiB\"), got " + python_type(v));
  }
  out = parse_bytes(nb::cast<std::string>(v), field);
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
  for (nb::handle group : items_of(obj, "groups", what)) {
    GroupConfig gc;
    const std::string gw = "groups[" + std::to_string(g++) + "]";
#define KVOFFLOAD_READ(name) read(group, #name, gc.name, gw);
    KVOFFLOAD_GROUP_CONFIG_FIELDS(KVOFFLOAD_READ)
#undef KVOFFLOAD_READ
    c.groups.push_back(gc);
  }
  std::size_t t = 0;
  for (nb::handle tier : items_of(obj, "tiers", what)) {
    TierConfig tc;
    const std::string tw = "tiers[" + std::to_string(t++) + "]";
#define KVOFFLOAD_READ(name) read(tier, #name, tc.name, tw);
    KVOFFLOAD_TIER_CONFIG_FIELDS(KVOFFLOAD_READ)
#undef KVOFFLOAD_READ
    nb::object store = field_of(tier, "store", tw);
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
  std::size_t i = 0;
  for (nb::handle t : items_of(obj, "tensors", what)) {
    const std::string tw = "tensors[" + std::to_string(i++) + "]";
    c.tensors.push_back({attr_as<std::uintptr_t>(t, "base", tw),
                         attr_as<std::int64_t>(t, "num_blocks", tw),
                         attr_as<std::int64_t>(t, "page_bytes", tw),
                         attr_as<std::int64_t>(t, "block_stride_bytes", tw)});
  }
  std::size_t g = 0;
  for (nb::handle group : items_of(obj, "groups", what)) {
    const std::string gw = "groups[" + std::to_string(g++) + "]";
    if (!nb::isinstance<nb::list>(group) && !nb::isinstance<nb::tuple>(group)) {
      throw invalid_argument(gw + ": expected a list of (tensor, page bytes), got " +
                             python_type(group));
    }
    std::vector<GroupTensor> gt;
    for (nb::handle pair : group) {
      if (!nb::isinstance<nb::tuple>(pair) && !nb::isinstance<nb::list>(pair)) {
        throw invalid_argument(gw + ": expected (tensor, page bytes) pairs, got " +
                               python_type(pair));
      }
      if (nb::len(pair) != 2) {
        throw invalid_argument(gw + ": expected (tensor, page bytes) pairs, got " +
                               std::to_string(nb::len(pair)) + " items");
      }
      gt.push_back({value_as<std::int32_t>(pair[0], gw + " tensor"),
                    value_as<std::int64_t>(pair[1], gw + " page bytes")});
    }
    c.groups.push_back(std::move(gt));
  }
  // Python resolves the stream object to its handle (kvoffload.stream_handle) first.
  nb::object stream = field_of(obj, "compute_stream", what);
  if (!stream.is_none())
    c.compute_stream = value_as<std::uintptr_t>(stream, what + ".compute_stream");
  std::size_t t = 0;
  for (nb::handle store : items_of(obj, "tiers", what)) {
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
  m.def(
      "_check_derivation",
      [](nb::handle scheduler, nb::handle worker) {
        (void)derive_worker_config(scheduler_config_from_py(scheduler),
                                   worker_config_from_py(worker));
      },
      "kvoffload::derive_worker_config's checks (the config valid, a store per tier, as many "
      "groups), for kvoffload.derive_worker_config.");
}

}  // namespace kvoffload::python
