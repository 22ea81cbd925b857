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
#include "kvoffload/worker.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace kvoffload::python {

void bind_worker(nb::module_& m) {
  m.def(
      "_worker_config_defaults",
      [] {
        const WorkerConfig c;
        nb::dict d;
        d["host_blocks"] = c.host_blocks;
        d["block_size_factor"] = c.block_size_factor;
        d["backend"] = std::string(to_string(c.backend));
        d["threads"] = c.threads;
        d["cuda_device"] = c.cuda_device;
        d["defer_stores"] = c.defer_stores;
        d["compute_stream"] = c.compute_stream ? nb::cast(*c.compute_stream) : nb::none();
        d["loads_wait_for_compute"] = c.loads_wait_for_compute;
        d["copy_mode"] = std::string(to_string(c.copy_mode));
        d["disk_tiers"] = nb::list();
        d["shared_tiers"] = nb::list();
        return d;
      },
      "kvoffload::WorkerConfig's defaults, for the test that keeps WorkerConfig equal.");

  m.def(
      "_shared_tier_config_defaults",
      [] {
        const SharedTierConfig c;
        nb::dict d;
        d["tp_rank"] = c.tp_rank;
        d["tp_size"] = c.tp_size;
        d["connect_timeout_ms"] = c.connect_timeout_ms;
        d["reply_timeout_ms"] = c.reply_timeout_ms;
        d["in_flight"] = c.in_flight;
        return d;
      },
      "kvoffload::SharedTierConfig's defaults (nodes and name have none).");

  nb::class_<Worker>(m, "_Worker")
      .def(
          "__init__",
          [](Worker* self,
             const std::vector<
                 std::tuple<std::uintptr_t, std::int64_t, std::int64_t, std::int64_t>>& tensors,
             const std::vector<std::vector<std::pair<std::int32_t, std::int64_t>>>& groups,
             std::int64_t block_size_factor, std::int64_t host_blocks, const std::string& backend,
             int threads, int cuda_device, bool defer_stores,
             std::optional<std::uintptr_t> compute_stream, bool loads_wait_for_compute,
             const std::string& copy_mode, const std::vector<nb::tuple>& disk_tiers,
             const std::vector<SharedTuple>& shared_tiers) {
            WorkerConfig c;
            for (const SharedTuple& t : shared_tiers) c.shared_tiers.push_back(shared_config(t));
            for (std::size_t t = 0; t < disk_tiers.size(); ++t) {
              const nb::tuple& d = disk_tiers[t];
              DiskTierConfig dc;
              dc.path = nb::cast<std::string>(d[0]);
              dc.capacity_bytes = nb::cast<std::uint64_t>(d[1]);
              dc.model = nb::cast<std::string>(d[2]);
              dc.dtype = nb::cast<std::string>(d[3]);
              dc.tp_rank = nb::cast<int>(d[4]);
              dc.tp_size = nb::cast<int>(d[5]);
              dc.io = parse_disk_io(nb::cast<std::string>(d[6]),
                                    "disk_tiers[" + std::to_string(t) + "].io");
              dc.io_depth = nb::cast<int>(d[7]);
              dc.io_threads = nb::cast<int>(d[8]);
              dc.direct_io = nb::cast<bool>(d[9]);
              c.disk_tiers.push_back(dc);
            }
            for (const auto& [base, blocks, page, stride] : tensors) {
              c.tensors.push_back({base, blocks, page, stride});
            }
            for (const auto& g : groups) {
              std::vector<GroupTensor> gt;
              for (const auto& [tensor, page] : g) gt.push_back({tensor, page});
              c.groups.push_back(std::move(gt));
            }
            c.block_size_factor = block_size_factor;
            c.host_blocks = host_blocks;
            c.backend = parse_backend_kind(backend, "worker: backend");
            c.threads = threads;
            c.cuda_device = cuda_device;
            c.defer_stores = defer_stores;
            c.compute_stream = compute_stream;
            c.loads_wait_for_compute = loads_wait_for_compute;
            c.copy_mode = parse_copy_mode(copy_mode, "worker: copy_mode");
            new (self) Worker(c);
          },
          "tensors"_a, "groups"_a, "block_size_factor"_a, "host_blocks"_a, "backend"_a, "threads"_a,
          "cuda_device"_a, "defer_stores"_a, "compute_stream"_a.none(), "loads_wait_for_compute"_a,
          "copy_mode"_a = "auto", "disk_tiers"_a = std::vector<nb::tuple>{},
          "shared_tiers"_a = std::vector<SharedTuple>{})
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
      .def("submit", &Worker::submit, "job"_a)
      .def("submit_tier", &Worker::submit_tier, "job"_a)
      .def("clear_tiers", &Worker::clear_tiers)
      .def_prop_ro("num_tiers", &Worker::num_tiers)
      .def(
          "tier_scan",
          [](const Worker& w, std::size_t t) { return scan_to_list(w.tier(t).scanned()); },
          "tier"_a)
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
