// Python binding of the worker side: a Worker over KV tensors given by address and shape
// (so PyTorch or NumPy tensors work without a dependency on either).

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <tuple>
#include <vector>

#include "bindings.hpp"
#include "kvoffload/error.hpp"
#include "kvoffload/metrics_text.hpp"
#include "kvoffload/transfer_engine.hpp"
#include "kvoffload/worker.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace kvoffload::python {

void bind_worker(nb::module_& m) {
  nb::class_<Worker>(m, "_Worker")
      .def(
          "__init__",
          [](Worker* self, nb::handle config) { new (self) Worker(worker_config_from_py(config)); },
          "config"_a, "A kvoffload.WorkerConfig, its compute_stream a handle (or None).")
      .def(
          "metrics_text",
          [](const Worker& w, const LabelPairs& labels) {
            return metrics_text(w, metric_labels(labels));
          },
          "labels"_a = LabelPairs{})
      .def("stats",
           [](const Worker& w) {
             const TransferStats s = w.stats();
             nb::dict d;
             d["store_jobs"] = s.store_jobs;
             d["load_jobs"] = s.load_jobs;
             d["failed_jobs"] = s.failed_jobs;
             d["bytes_stored"] = s.bytes_stored;
             d["bytes_loaded"] = s.bytes_loaded;
             d["store_seconds"] = s.store_seconds;
             d["load_seconds"] = s.load_seconds;
             d["stores_shed"] = s.stores_shed;
             return d;
           })
      .def("store_pressure", &Worker::store_pressure)
      .def(
          "shared_tier_stats",
          [](const Worker& w, std::size_t t) {
            const SharedTierStats s = w.shared_tier(t).shared_stats();
            nb::dict d;
            d["reads"] = s.reads;
            d["read_misses"] = s.read_misses;
            d["bad_values"] = s.bad_values;
            d["read_errors"] = s.read_errors;
            d["writes"] = s.writes;
            d["write_errors"] = s.write_errors;
            d["bytes_read"] = s.bytes_read;
            d["bytes_written"] = s.bytes_written;
            d["connect_errors"] = s.connect_errors;
            d["tls_errors"] = s.tls_errors;
            d["auth_errors"] = s.auth_errors;
            d["io_errors"] = s.io_errors;
            d["timeouts"] = s.timeouts;
            d["protocol_errors"] = s.protocol_errors;
            d["oversized"] = s.oversized;
            return d;
          },
          "tier"_a)
      .def("set_compute_stream", &Worker::set_compute_stream, "stream"_a.none())
      .def(
          "cuda_stats",
          [](const Worker& w) -> nb::object {
            const auto s = w.cuda_stats();
            if (!s) return nb::none();
            nb::dict d;
            d["jobs_batch"] = s->jobs_batch;
            d["jobs_memcpy"] = s->jobs_memcpy;
            d["jobs_kernel"] = s->jobs_kernel;
            d["jobs_staged"] = s->jobs_staged;
            d["jobs_device_table"] = s->jobs_device_table;
            d["staged_fell_back"] = s->staged_fell_back;
            d["ring_fell_back"] = s->ring_fell_back;
            return d;
          },
          "The CUDA backend's counts of the modes its jobs used; None for the host backend.")
      .def(
          "check_matches",
          [](const Worker& w, nb::handle scheduler) {
            w.check_matches(scheduler_config_from_py(scheduler));
          },
          "scheduler"_a)
      .def("submit", &Worker::submit, "job"_a)
      .def("submit_tier", &Worker::submit_tier, "job"_a)
      .def("clear_tiers", &Worker::clear_tiers)
      .def("layout_description", &Worker::layout_description)
      .def_prop_ro("num_tiers", &Worker::num_tiers)
      .def(
          "tier_scan",
          [](const Worker& w, std::size_t t) { return scan_to_list(w.tier(t).scanned()); },
          "tier"_a)
      .def("release_tier_scan", &Worker::release_tier_scan, "tier"_a)
      .def(
          "tier_slots", [](const Worker& w, std::size_t t) { return w.tier(t).num_slots(); },
          "tier"_a)
      .def(
          "tier_io",
          [](const Worker& w, std::size_t t) {
            return std::string(to_string(w.disk_tier(t).io()));
          },
          "tier"_a)
      .def("start_step", &Worker::start_step)
      .def("get_finished",
           [](Worker& w) {
             nb::list out;
             for (const FinishedTransfer& f : w.get_finished()) {
               out.append(
                   nb::make_tuple(f.job, std::string(to_string(f.kind)), f.ok, f.error, f.bytes));
             }
             return out;
           })
      .def(
          "wait", [](Worker& w, const std::vector<JobId>& jobs) { w.wait(jobs); }, "jobs"_a,
          nb::call_guard<nb::gil_scoped_release>())
      .def(
          "host_block",
          [](const Worker& w, HostBlockId id) {
            const std::span<std::byte> b = w.host_block(id);
            const std::size_t shape[1] = {b.size()};
            return nb::ndarray<nb::numpy, std::uint8_t, nb::ndim<1>>(
                reinterpret_cast<std::uint8_t*>(b.data()), 1, shape, nb::handle());
          },
          "block"_a, nb::rv_policy::reference_internal)
      .def_prop_ro("num_host_blocks", &Worker::num_host_blocks);
}

}  // namespace kvoffload::python
