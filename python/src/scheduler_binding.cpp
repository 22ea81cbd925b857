// Python binding of the scheduler side: Scheduler, its request/report inputs and the jobs it
// emits. Jobs expose their id arrays as read-only NumPy views into the job (no copy).

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <tuple>
#include <vector>

#include "bindings.hpp"
#include "kvoffload/detail/stats_fields.hpp"
#include "kvoffload/error.hpp"
#include "kvoffload/metrics_text.hpp"
#include "kvoffload/scheduler.hpp"
#include "kvoffload/tiers/disk_tier.hpp"
#include "kvoffload/tiers/shared_presence.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace kvoffload::python {
namespace {

template <class T>
using View = nb::ndarray<nb::numpy, const T, nb::ndim<1>>;

template <class T>
View<T> view(const std::vector<T>& v) {
  const std::size_t shape[1] = {v.size()};
  return View<T>(v.data(), 1, shape, nb::handle());
}

nb::bytes to_bytes(const BlockHash& h) {
  return nb::bytes(reinterpret_cast<const char*>(h.data()), h.size());
}

nb::list keys_to_list(const std::vector<Key>& keys) {
  nb::list out;
  for (const Key& k : keys) out.append(nb::make_tuple(to_bytes(k.hash), k.group));
  return out;
}

std::string fmt_hash_error(std::string_view what, std::size_t i, std::size_t size) {
  return std::string(what) + ": block hash " + std::to_string(i) + " has " + std::to_string(size) +
         " bytes (1 to 32)";
}

BlockHash to_hash(const nb::bytes& b, std::string_view what, std::size_t i) {
  if (b.size() < 1 || b.size() > BlockHash::max_size) {
    throw invalid_argument(fmt_hash_error(what, i, b.size()));
  }
  return BlockHash::from_bytes(
      std::span(reinterpret_cast<const std::uint8_t*>(b.c_str()), b.size()));
}

std::vector<BlockHash> to_hashes(const std::vector<nb::bytes>& hashes, std::string_view what) {
  std::vector<BlockHash> out;
  out.reserve(hashes.size());
  for (std::size_t i = 0; i < hashes.size(); ++i) out.push_back(to_hash(hashes[i], what, i));
  return out;
}

std::string kind_name(JobKind k) {
  return std::string(to_string(k));
}

nb::dict to_dict(const TierStats& t) {
  nb::dict d;
#define KVOFFLOAD_DICT_FIELD(name) d[#name] = t.name;
  KVOFFLOAD_TIER_STATS_FIELDS(KVOFFLOAD_DICT_FIELD)
#undef KVOFFLOAD_DICT_FIELD
  return d;
}

nb::dict to_dict(const CacheStats& c) {
  nb::dict d;
#define KVOFFLOAD_DICT_FIELD(name) d[#name] = c.name;
  KVOFFLOAD_CACHE_STATS_FIELDS(KVOFFLOAD_DICT_FIELD)
#undef KVOFFLOAD_DICT_FIELD
  return d;
}

nb::object key_or_none(const std::optional<Key>& k) {
  if (!k) return nb::none();
  return nb::make_tuple(to_bytes(k->hash), k->group);
}

}  // namespace

nb::tuple step_to_tuple(StepResult&& r) {
  nb::list loads, stores, tier_jobs;
  for (TransferJob& j : r.load_jobs) loads.append(nb::cast(std::move(j)));
  for (TransferJob& j : r.store_jobs) stores.append(nb::cast(std::move(j)));
  for (TierJob& j : r.tier_jobs) tier_jobs.append(nb::cast(std::move(j)));
  return nb::make_tuple(loads, stores, r.flush, tier_jobs);
}

nb::list scan_to_list(const std::vector<std::optional<Key>>& scan) {
  nb::list out;
  for (const auto& k : scan) out.append(key_or_none(k));
  return out;
}

namespace {

/// A scan from Python: per slot, None or a (hash, group) key; `what` names the caller.
std::vector<std::optional<Key>> list_to_scan(const nb::list& slots, std::string_view what) {
  std::vector<std::optional<Key>> keys(slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].is_none()) continue;
    const auto pair = nb::cast<std::pair<nb::bytes, std::uint32_t>>(slots[i]);
    keys[i] = Key{to_hash(pair.first, what, i), pair.second};
  }
  return keys;
}

void bind_tier_job(nb::module_& m) {
  using TierState = std::tuple<JobId, std::string, std::uint32_t, std::string,
                               std::vector<std::pair<nb::bytes, std::uint32_t>>,
                               std::vector<HostBlockId>, std::vector<std::int64_t>, std::uint64_t>;
  nb::class_<TierJob>(m, "TierJob",
                      "A promotion (tier to host memory) or a write (host memory to a tier).")
      .def_ro("id", &TierJob::id)
      .def_prop_ro("kind", [](const TierJob& j) { return std::string(to_string(j.kind)); })
      .def_ro("tier", &TierJob::tier)
      .def_ro("request_id", &TierJob::request_id)
      .def_ro("epoch", &TierJob::epoch)
      .def_prop_ro("keys", [](const TierJob& j) { return keys_to_list(j.keys); })
      .def_prop_ro(
          "host_block_ids", [](const TierJob& j) { return view(j.host_block_ids); },
          nb::rv_policy::reference_internal)
      .def_prop_ro(
          "slots", [](const TierJob& j) { return view(j.slots); },
          nb::rv_policy::reference_internal)
      .def("__repr__",
           [](const TierJob& j) {
             return "TierJob(id=" + std::to_string(j.id) + ", kind='" +
                    std::string(to_string(j.kind)) + "', tier=" + std::to_string(j.tier) +
                    ", blocks=" + std::to_string(j.keys.size()) + ")";
           })
      .def("__getstate__",
           [](const TierJob& j) {
             std::vector<std::pair<nb::bytes, std::uint32_t>> keys;
             for (const Key& k : j.keys) keys.emplace_back(to_bytes(k.hash), k.group);
             return TierState(j.id, std::string(to_string(j.kind)), j.tier, j.request_id,
                              std::move(keys), j.host_block_ids, j.slots, j.epoch);
           })
      .def("__setstate__", [](TierJob& j, const TierState& state) {
        new (&j) TierJob();
        const auto& [id, kind, tier, request, keys, hosts, slots, epoch] = state;
        j.id = id;
        j.kind = parse_job_kind(kind, "TierJob: kind");
        if (!is_tier_job(j.kind)) {
          throw invalid_argument("TierJob: kind \"" + kind +
                                 "\" is not a tier job's (promote or write)");
        }
        j.tier = tier;
        j.request_id = request;
        for (std::size_t i = 0; i < keys.size(); ++i) {
          j.keys.push_back(Key{to_hash(keys[i].first, "TierJob", i), keys[i].second});
        }
        j.host_block_ids = hosts;
        j.slots = slots;
        j.epoch = epoch;
      });
}

/// A transfer job from its parts (pickling and the constructor); a tier job's kind is refused.
TransferJob make_job(JobId id, const std::string& kind, const std::string& request,
                     const std::vector<std::pair<nb::bytes, std::uint32_t>>& keys,
                     const std::vector<GpuBlockId>& ids, const std::vector<std::int64_t>& sizes,
                     const std::vector<std::int64_t>& indices,
                     const std::vector<HostBlockId>& hosts) {
  TransferJob j;
  j.id = id;
  j.kind = parse_job_kind(kind, "Job: kind");
  if (is_tier_job(j.kind)) {
    throw invalid_argument("Job: kind \"" + kind +
                           "\" is a tier job's (TierJob, submit_tier), not a transfer's (load "
                           "or store)");
  }
  j.request_id = request;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    j.keys.push_back(Key{to_hash(keys[i].first, "Job", i), keys[i].second});
  }
  j.gpu.block_ids = ids;
  j.gpu.group_sizes = sizes;
  j.gpu.block_indices = indices;
  j.host_block_ids = hosts;
  return j;
}

}  // namespace

void bind_scheduler(nb::module_& m) {
  m.def(
      "merge_rank_scans",
      [](const std::vector<nb::list>& ranks) {
        std::vector<std::vector<std::optional<Key>>> scans;
        scans.reserve(ranks.size());
        for (const nb::list& r : ranks) scans.push_back(list_to_scan(r, "merge_rank_scans"));
        return scan_to_list(merge_rank_scans(scans));
      },
      "ranks"_a,
      "A disk tier's scans of several ranks (one list per rank, slot by slot) as one: a slot "
      "holds a key only where every rank's slot holds that same key.");
  bind_tier_job(m);
  nb::class_<TransferJob>(m, "Job", "A load or store job, as the scheduler emitted it.")
      .def_ro("id", &TransferJob::id)
      .def_prop_ro("kind", [](const TransferJob& j) { return kind_name(j.kind); })
      .def_ro("request_id", &TransferJob::request_id)
      .def_prop_ro(
          "keys", [](const TransferJob& j) { return keys_to_list(j.keys); },
          "(hash bytes, group) per host block, group-major")
      .def_prop_ro(
          "gpu_block_ids", [](const TransferJob& j) { return view(j.gpu.block_ids); },
          nb::rv_policy::reference_internal)
      .def_prop_ro(
          "group_sizes", [](const TransferJob& j) { return view(j.gpu.group_sizes); },
          nb::rv_policy::reference_internal)
      .def_prop_ro(
          "block_indices", [](const TransferJob& j) { return view(j.gpu.block_indices); },
          nb::rv_policy::reference_internal)
      .def_prop_ro(
          "host_block_ids", [](const TransferJob& j) { return view(j.host_block_ids); },
          nb::rv_policy::reference_internal)
      .def("__repr__",
           [](const TransferJob& j) {
             return "Job(id=" + std::to_string(j.id) + ", kind='" + kind_name(j.kind) +
                    "', request_id='" + j.request_id +
                    "', host_blocks=" + std::to_string(j.host_block_ids.size()) +
                    ", gpu_blocks=" + std::to_string(j.gpu.block_ids.size()) + ")";
           })
      // Pickling, so that a step's jobs travel from an engine's scheduler process to its
      // workers (vLLM pickles connector metadata). Workers check every job again on submit.
      .def("__getstate__",
           [](const TransferJob& j) {
             std::vector<std::pair<nb::bytes, std::uint32_t>> keys;
             for (const Key& k : j.keys) keys.emplace_back(to_bytes(k.hash), k.group);
             return std::make_tuple(j.id, kind_name(j.kind), j.request_id, std::move(keys),
                                    j.gpu.block_ids, j.gpu.group_sizes, j.gpu.block_indices,
                                    j.host_block_ids);
           })
      .def("__setstate__",
           [](TransferJob& j,
              const std::tuple<JobId, std::string, std::string,
                               std::vector<std::pair<nb::bytes, std::uint32_t>>,
                               std::vector<GpuBlockId>, std::vector<std::int64_t>,
                               std::vector<std::int64_t>, std::vector<HostBlockId>>& state) {
             const auto& [id, kind, request, keys, ids, sizes, indices, hosts] = state;
             new (&j) TransferJob(make_job(id, kind, request, keys, ids, sizes, indices, hosts));
           })
      // A job built by hand (tests, tools, an engine of one's own): checked on submit like
      // any other.
      .def(
          "__init__",
          [](TransferJob* j, JobId id, const std::string& kind,
             const std::vector<std::pair<nb::bytes, std::uint32_t>>& keys,
             const std::vector<GpuBlockId>& ids, const std::vector<std::int64_t>& sizes,
             const std::vector<std::int64_t>& indices, const std::vector<HostBlockId>& hosts,
             const std::string& request) {
            new (j) TransferJob(make_job(id, kind, request, keys, ids, sizes, indices, hosts));
          },
          "id"_a, "kind"_a, "keys"_a, "gpu_block_ids"_a, "group_sizes"_a, "block_indices"_a,
          "host_block_ids"_a, "request_id"_a = "",
          "keys: (hash bytes, group) per host block, group-major; kind: \"load\" or \"store\".");

  nb::class_<Scheduler>(m, "_Scheduler")
      .def(
          "__init__",
          [](Scheduler* self, nb::handle config) {
            // The whole config first (nothing started), then its services.
            const SchedulerConfig c = scheduler_config_from_py(config);
            new (self) Scheduler(c, make_scheduler_services(c));
          },
          "config"_a, "A kvoffload.SchedulerConfig.")
      .def(
          "update_request",
          [](Scheduler& s, std::string_view id, std::int64_t num_tokens,
             const std::vector<nb::bytes>& hashes, bool remote_decode) {
            s.update_request(id, num_tokens, to_hashes(hashes, "update_request"), remote_decode);
          },
          "request_id"_a, "num_tokens"_a, "block_hashes"_a, "remote_decode"_a = false)
      .def(
          "extend_request",
          [](Scheduler& s, std::string_view id, std::int64_t num_tokens,
             const std::vector<nb::bytes>& hashes) {
            s.extend_request(id, num_tokens, to_hashes(hashes, "extend_request"));
          },
          "request_id"_a, "num_tokens"_a, "new_hashes"_a)
      .def("lookup", &Scheduler::lookup, "request_id"_a, "num_computed_tokens"_a)
      .def(
          "on_allocated",
          [](Scheduler& s, std::string_view id,
             const std::vector<std::pair<std::vector<GpuBlockId>, std::int64_t>>& groups,
             std::int64_t num_external_tokens) {
            std::vector<AllocatedGroup> g;
            g.reserve(groups.size());
            for (const auto& [ids, computed] : groups) g.push_back({ids, computed});
            s.on_allocated(id, g, num_external_tokens);
          },
          "request_id"_a, "groups"_a, "num_external_tokens"_a)
      .def(
          "build_step",
          [](Scheduler& s,
             const std::vector<std::tuple<std::string, std::int64_t, std::int64_t,
                                          std::vector<std::vector<GpuBlockId>>, bool>>& scheduled,
             const std::vector<std::string>& preempted) {
            std::vector<ScheduledRequest> entries;
            entries.reserve(scheduled.size());
            for (const auto& [id, computed, count, ids, resumed] : scheduled) {
              entries.push_back({id, computed, count, ids, resumed});
            }
            return step_to_tuple(s.build_step(entries, preempted));
          },
          "scheduled"_a, "preempted"_a)
      .def(
          "on_completed",
          [](Scheduler& s, const std::vector<std::tuple<JobId, std::int64_t, bool>>& reports) {
            std::vector<JobReport> r;
            r.reserve(reports.size());
            for (const auto& [job, count, ok] : reports) r.push_back({job, count, ok});
            nb::list out;
            for (const CompletedJob& c : s.on_completed(r)) {
              out.append(nb::make_tuple(c.job, kind_name(c.kind), c.request_id, c.ok));
            }
            return out;
          },
          "reports"_a)
      .def("on_finished", &Scheduler::on_finished, "request_id"_a)
      .def("limit_stores", &Scheduler::limit_stores, "request_id"_a, "max_tokens"_a)
      .def("limit_state_stores", &Scheduler::limit_state_stores, "request_id"_a, "final_tokens"_a)
      .def("limit_loads", &Scheduler::limit_loads, "request_id"_a, "max_tokens"_a)
      .def("hint_continues", &Scheduler::hint_continues, "request_id"_a, "continues"_a)
      .def("set_time", &Scheduler::set_time, "seconds"_a)
      .def("set_store_pressure", &Scheduler::set_store_pressure, "on"_a)
      .def(
          "handed_out", [](Scheduler& s, const std::vector<GpuBlockId>& ids) { s.handed_out(ids); },
          "block_ids"_a)
      .def("store_pressure", &Scheduler::store_pressure)
      .def("reset_cache", [](Scheduler& s) { s.reset_cache(); })
      .def(
          "reset_weights", [](Scheduler& s, std::string_view w) { s.reset_cache(w); }, "weights"_a)
      .def_prop_ro("epoch", &Scheduler::epoch)
      .def("take_events",
           [](Scheduler& s) {
             nb::list out;
             for (const ManagerEvent& e : s.take_events()) {
               out.append(nb::make_tuple(e.removed, keys_to_list(e.keys),
                                         std::string(to_string(e.medium))));
             }
             return out;
           })
      .def("stats", [](const Scheduler& s) { return to_dict(s.cache_stats()); })
      .def(
          "partly_written",
          [](const Scheduler& s, const std::vector<std::pair<nb::bytes, std::uint32_t>>& keys) {
            // Per key: held in host memory without its leading sub-blocks (valid_from > 0,
            // SEMANTICS 6.8), so not a whole block.
            std::vector<bool> out(keys.size(), false);
            for (std::size_t i = 0; i < keys.size(); ++i) {
              std::uint16_t valid_from = 0;
              const Key k{to_hash(keys[i].first, "partly_written", i), keys[i].second};
              out[i] = s.manager().peek(k, valid_from) != LookupResult::miss && valid_from > 0;
            }
            return out;
          },
          "keys"_a)
      .def(
          "metrics_text",
          [](const Scheduler& s, const LabelPairs& labels) {
            return metrics_text(s, metric_labels(labels));
          },
          "labels"_a = LabelPairs{})
      .def(
          "tier_stats", [](const Scheduler& s, std::size_t t) { return to_dict(s.tier_stats(t)); },
          "tier"_a)
      .def(
          "restore_tier",
          [](Scheduler& s, std::size_t t, const nb::list& slots) {
            return s.restore_tier(t, list_to_scan(slots, "restore_tier"));
          },
          "tier"_a, "slots"_a)
      .def_prop_ro("num_requests", &Scheduler::num_requests)
      .def_prop_ro("num_jobs_in_flight", &Scheduler::num_jobs_in_flight);
}

}  // namespace kvoffload::python
