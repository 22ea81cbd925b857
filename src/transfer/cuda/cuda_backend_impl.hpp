#pragma once

// Internal: the CUDA backend's state (CudaBackend::Impl), shared by its files:
// cuda_backend.cpp (construction, submit, poll, wait, shutdown) and cuda_device_table.cpp (the
// device-table path). Every CUDA call goes through the DeviceRuntime.

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "common/expects.hpp"
#include "common/logging.hpp"
#include "kvoffload/cuda_backend.hpp"
#include "kvoffload/detail/copy_body.hpp"
#include "kvoffload/device_runtime.hpp"
#include "transfer/cuda/device_scope.hpp"
#include "transfer/cuda/ring_allocator.hpp"

namespace kvoffload {
namespace detail {

inline std::uint64_t align16(std::uint64_t n) {
  return (n + 15) / 16 * 16;
}

inline std::uint64_t align64(std::uint64_t n) {
  return (n + 63) / 64 * 64;
}

/// The copy kernels' largest grid: enough for any copy, and ctas * threads / 32 warps stay far
/// from wrapping (a zero warp count would make the kernel spin forever).
inline constexpr int kMaxKernelCtas = 65535;

}  // namespace detail

struct CudaBackend::Impl {
  using DevicePiece = detail::DevicePiece;
  using Owned = detail::Owned;
  using Scope = detail::Scope;

  /// A job's slices of its stream's upload rings, allocated once at setup: pinned host bytes
  /// (a piece array, device-table inputs) and device bytes (where the kernel reads them, and
  /// the device-table path's scratch). No job allocates memory of its own.
  struct Upload {
    std::size_t stream = 0;
    std::optional<std::uint64_t> host_offset, device_offset;
    std::byte* host = nullptr;
    std::byte* device = nullptr;
  };

  /// The staged path's unit of DMA: a run of adjacent host bytes the job touches (within one
  /// host registration), laid out as they are in the pool at `offset` in the job's staging.
  struct HostRun {
    std::uintptr_t host = 0;
    std::uint64_t bytes = 0;
    std::uint64_t offset = 0;
  };

  struct Job {
    std::shared_ptr<DeviceRuntime> rt;
    Ticket ticket = 0;
    CopyPlan plan;
    CopyMode mode = CopyMode::memcpy;
    EventHandle done = 0;
    bool recorded = false;
    // Failed until its completion event is recorded, so a submission that throws half-way
    // (out of memory, say) is never reported ok with nothing copied. Then: failed when
    // polled, or cancelled.
    bool failed = true;
    std::string error;  // empty while failed: the submission did not complete
    bool cancelled = false;
    std::chrono::steady_clock::time_point start;
    Upload upload;                         // the piece array or device-table inputs
    std::optional<std::uint64_t> staging;  // staged: offset in the staging buffer
    std::uint64_t staging_bytes = 0;       // staged: its host runs at 16-byte boundaries
    std::vector<HostRun> runs;             // staged: by host address
    const int* mismatch = nullptr;         // device-table: the pinned flag the device writes
    bool released = false;
    ~Job() {
      if (done != 0) (void)rt->event_destroy(done);
    }
  };
  using JobPtr = std::shared_ptr<Job>;

  Impl(const CudaBackendConfig& c, std::shared_ptr<DeviceRuntime> runtime)
      : rt(std::move(runtime)),
        config(c),
        device_staging(*rt, Owned::Kind::device),
        ring_memory(*rt, Owned::Kind::host),
        device_ring_memory(*rt, Owned::Kind::device) {}

  ~Impl() {
    try {
      Scope scope(*rt, config.device);
      for (StreamHandle s : streams) (void)rt->stream_synchronize(s);
      // Jobs nobody polled still hold ring slices.
      for (auto& queue : in_order) {
        for (JobPtr& j : queue) release(*j);
        queue.clear();
      }
      if (compute_ready != 0) (void)rt->event_destroy(compute_ready);
      for (const auto& [mark, ev] : marks) {
        if (ev != 0) (void)rt->event_destroy(ev);
      }
      for (const EventHandle ev : switched_from) (void)rt->event_destroy(ev);
      for (const EventHandle ev : spare_events) (void)rt->event_destroy(ev);
      device_staging.reset();
      ring_memory.reset();
      device_ring_memory.reset();
      for (StreamHandle s : streams) (void)rt->stream_destroy(s);
      if (mark_stream != 0) (void)rt->stream_destroy(mark_stream);
    } catch (const std::exception& e) {
      detail::logger().error("CUDA backend: shutdown failed: {}", e.what());
    }
  }

  void check(int e, const char* what) const {
    if (e != dev::ok) {
      (void)rt->get_last_error();
      throw cuda_error(fmt::format("CUDA backend on device {}: {} failed: {}", config.device, what,
                                   rt->describe(e)));
    }
  }

  /// Streams, rings, staging; the host region check. Throws (RAII frees what was made).
  void setup() {
    Scope scope(*rt, config.device);
    int least = 0, greatest = 0;
    check(rt->stream_priority_range(&least, &greatest), "stream_priority_range");
    for (int i = 0; i < config.store_streams + config.load_streams; ++i) {
      StreamHandle s = 0;
      check(rt->stream_create(i < config.store_streams ? least : greatest, &s), "stream_create");
      streams.push_back(s);
    }
    bool mappable = false;
    check(rt->can_map_host_memory(config.device, &mappable), "can_map_host_memory");
    kernel_ok = mappable;
    if (!mappable) {
      detail::logger().warn(
          "CUDA backend: device {} cannot use registered host pointers; kernel, staged and "
          "device-table modes are off",
          config.device);
    } else if (config.host_bytes > 0) {
      bool mapped = false;
      check(rt->host_mapped(reinterpret_cast<const void*>(config.host_base), config.host_bytes,
                            &mapped),
            "host_mapped");
      if (!mapped) {
        kernel_ok = false;
        detail::logger().warn(
            "CUDA backend: the host region ({} bytes) is not pinned and mapped for device {} "
            "(an unpinned pool?); kernel, staged and device-table modes are off, copies use "
            "the copy engines",
            config.host_bytes, config.device);
      }
    }
    batch_ok = rt->batch_available();
    if (config.ring_bytes > 0 && kernel_ok) {
      // Each stream's rings start on a 64-byte boundary whatever ring_bytes is. Only the
      // kernel and device-table paths upload anything.
      ring_stride = detail::align64(config.ring_bytes);
      const std::size_t n = streams.size();
      const auto all = static_cast<std::size_t>(ring_stride) * n;
      check(ring_memory.allocate(all), "malloc_host (upload rings)");
      check(device_ring_memory.allocate(all), "malloc_device (upload rings)");
      for (std::size_t i = 0; i < n; ++i) {
        rings.emplace_back(config.ring_bytes);
        device_rings.emplace_back(config.ring_bytes);
      }
    }
    // Staging only when a job can be staged: automatic mode never stages without
    // staged_min_pieces (64 MiB of device memory nothing would use).
    const bool staging_used = config.mode == CopyMode::staged ||
                              (config.mode == CopyMode::automatic && config.staged_min_pieces > 0);
    if (kernel_ok && staging_used && config.staging_bytes > 0) {
      check(device_staging.allocate(config.staging_bytes), "malloc_device (staging)");
      staging_ring = detail::RingAllocator(config.staging_bytes);
    }
    if (config.compute_stream) set_compute(config.compute_stream);
  }

  void set_compute(std::optional<StreamHandle> stream) {
    KVOFFLOAD_EXPECTS(!stream || *stream != per_thread_default_stream,
                      "compute_stream: cudaStreamPerThread names a different stream on each "
                      "thread; pass the engine's stream itself (torch.cuda.current_stream())");
    if (!stream || stream == compute) {
      compute = stream;
      return;
    }
    Scope scope(*rt, config.device);  // the event belongs to the backend's device
    if (*stream > 1) {  // 0 and 1 name the legacy stream of the device current at each call
      int device = -1;
      check(rt->stream_device(*stream, &device), "stream_device (compute stream)");
      KVOFFLOAD_EXPECTS(device == config.device,
                        "compute_stream {:#x} belongs to device {}, but the backend is on device "
                        "{}: a wait across devices would order nothing",
                        *stream, device, config.device);
    }
    if (compute_ready == 0)
      check(rt->event_create(&compute_ready), "event_create (compute stream)");
    prune_switched_from();
    if (compute) {
      // The old stream's work so far (a forward pass whose stores are still deferred, or that
      // still reads blocks a load of this step overwrites) stays waited for by every job
      // from now on, until it is done: whichever order the engine switches streams and
      // starts its deferred stores in.
      EventHandle ev = 0;
      check(take_event(&ev), "event_create (previous compute stream)");
      // An event recorded on a capturing stream is a node of its graph: waiting for it would
      // join the capture. Its work is not running anyway.
      const int e = capturing(*compute) ? dev::invalid_value : rt->event_record(ev, *compute);
      if (e == dev::ok) {
        switched_from.push_back(ev);
      } else {  // the engine destroyed it already: nothing more can be ordered after it
        (void)rt->get_last_error();
        spare_events.push_back(ev);
        detail::logger().warn(
            "CUDA backend: the previous compute stream {:#x} could not be recorded ({}); jobs "
            "from now on wait only for {:#x}",
            *compute, rt->describe(e), *stream);
      }
    }
    compute = stream;
  }

  std::size_t pick_stream(bool store) {
    if (store) {
      return next_store++ % static_cast<std::size_t>(config.store_streams);
    }
    return static_cast<std::size_t>(config.store_streams) +
           next_load++ % static_cast<std::size_t>(config.load_streams);
  }

  /// Reserves `host` pinned and `device` device bytes of stream `si`'s upload rings for the
  /// job: both, or neither (false: the rings are full now, or too small for the job).
  bool reserve_upload(Job& job, std::size_t si, std::size_t host, std::size_t device) {
    if (rings.empty()) return false;
    const auto h = rings[si].allocate(host);
    if (!h) return false;
    const auto d = device_rings[si].allocate(device);
    if (!d) {
      rings[si].release(*h);
      return false;
    }
    job.upload.stream = si;
    job.upload.host_offset = h;
    job.upload.device_offset = d;
    job.upload.host = ring_memory.bytes() + si * ring_stride + *h;
    job.upload.device = device_ring_memory.bytes() + si * ring_stride + *d;
    return true;
  }

  /// Gives back what the job held; only once its device work has finished (or never ran).
  void release(Job& job) {
    if (job.released) return;
    job.released = true;
    if (job.upload.host_offset) rings[job.upload.stream].release(*job.upload.host_offset);
    if (job.upload.device_offset) {
      device_rings[job.upload.stream].release(*job.upload.device_offset);
    }
    job.upload = {};
    if (job.staging) staging_ring.release(*job.staging);
    job.staging.reset();
  }

  /// Drops the switched-from events whose work is done (kept for reuse), and any that cannot
  /// be asked (an error: logged; nothing more can be ordered after it).
  void prune_switched_from() {
    std::erase_if(switched_from, [&](EventHandle ev) {
      const int q = rt->event_query(ev);
      if (q == dev::not_ready) return false;
      if (dev::capture_status(q)) {  // a capture elsewhere forbids the query now: ask later
        (void)rt->get_last_error();
        return false;
      }
      if (q != dev::ok) {
        (void)rt->get_last_error();
        detail::logger().warn("CUDA backend: an event of a previous compute stream failed: {}",
                              rt->describe(q));
      }
      spare_events.push_back(ev);
      return true;
    });
  }

  /// An event for reuse, or a new one.
  int take_event(EventHandle* ev) {
    if (!spare_events.empty()) {
      *ev = spare_events.back();
      spare_events.pop_back();
      return dev::ok;
    }
    return rt->event_create(ev);
  }

  /// Records the engine's work so far (the compute stream's, and the work up to the switch of
  /// streams it switched away from that is not done yet) in one event: on the compute stream
  /// itself, or, with switched-from streams, on the backend's mark stream after waits for
  /// them all. Returns 0 when there is nothing to wait for; throws cuda_error on a failed call
  /// (the event goes back to the spares).
  ComputeMark mark() {
    if (!compute || skip_compute_wait || stopping) return 0;
    Scope scope(*rt, config.device);
    if (capturing(*compute)) {  // no event: the store is refused when it starts
      const ComputeMark id = next_mark++;
      marks.emplace(id, EventHandle{0});
      return id;
    }
    prune_switched_from();
    EventHandle ev = 0;
    check(take_event(&ev), "event_create (compute mark)");
    int e = dev::ok;
    if (switched_from.empty()) {
      e = rt->event_record(ev, *compute);
    } else {
      if (mark_stream == 0) e = rt->stream_create(0, &mark_stream);
      if (e == dev::ok) e = rt->event_record(compute_ready, *compute);
      if (e == dev::ok) e = rt->stream_wait_event(mark_stream, compute_ready);
      for (std::size_t i = 0; e == dev::ok && i < switched_from.size(); ++i) {
        e = rt->stream_wait_event(mark_stream, switched_from[i]);
      }
      if (e == dev::ok) e = rt->event_record(ev, mark_stream);
    }
    if (e != dev::ok) {
      spare_events.push_back(ev);
      check(e, "marking the compute stream");
    }
    const ComputeMark id = next_mark++;
    marks.emplace(id, ev);
    return id;
  }

  /// Whether `stream` is capturing a CUDA graph (a failed query counts as not: the calls that
  /// follow fail on their own).
  bool capturing(StreamHandle stream) {
    bool yes = false;
    if (rt->stream_capturing(stream, &yes) != dev::ok) {
      (void)rt->get_last_error();
      return false;
    }
    return yes;
  }

  /// A plan's mark, taken out of the table for its submission: nullopt for none (or an id
  /// the table does not hold), else its event (0: marked while the compute stream captured a
  /// graph). give_back returns the event to the spares once the submission is done with it.
  std::optional<EventHandle> take_mark(ComputeMark mark_id) {
    if (mark_id == 0) return std::nullopt;
    const auto it = marks.find(mark_id);
    if (it == marks.end()) return std::nullopt;
    const EventHandle ev = it->second;
    marks.erase(it);
    return ev;
  }
  void give_back(std::optional<EventHandle> ev) noexcept {
    if (!ev || *ev == 0) return;  // 0 is no event: never a spare
    try {
      spare_events.push_back(*ev);
    } catch (...) {  // out of memory: one event is never reused, nothing else is lost
    }
  }

  /// False, with the job's error set, for a job that would have to wait for a compute stream
  /// capturing a CUDA graph: the wait would join the capture (the copy would run only when the
  /// graph is launched, if ever), so the job is refused and nothing is queued. A deferred
  /// store marked while the stream captured (`mark` 0) is refused when it starts.
  bool capture_free(Job& job, bool must, std::optional<EventHandle> mark) {
    if (mark && *mark == 0) {
      ++stats.refused_capturing;
      job.error = fmt::format(
          "job {}: refused: the compute stream {:#x} was capturing a CUDA graph when this "
          "deferred store was submitted, so there is no forward pass to order it after",
          job.plan.job, compute.value_or(0));
      return false;
    }
    if (mark || !compute || !must || skip_compute_wait || !capturing(*compute)) return true;
    ++stats.refused_capturing;
    job.error = fmt::format(
        "job {}: refused: the compute stream {:#x} is capturing a CUDA graph, and a copy "
        "ordered after it would join the capture instead of running (submit jobs before or "
        "after a capture, not during one)",
        job.plan.job, *compute);
    return false;
  }

  /// Waits (on the device) for the engine's compute work, if the job must: the work up to
  /// `mark` when it has one (a deferred store, marked at its submission), else the compute
  /// stream's work queued so far and the streams the engine switched away from, until their
  /// work up to the switch is done.
  int wait_for_compute(StreamHandle stream, bool must, std::optional<EventHandle> mark) {
    if (mark) {
      // The wait takes the event's work as of now: the event can be given back at once.
      return skip_compute_wait || *mark == 0 ? dev::ok : rt->stream_wait_event(stream, *mark);
    }
    if (!compute || !must || skip_compute_wait) return dev::ok;
    int e = rt->event_record(compute_ready, *compute);
    if (e == dev::ok) e = rt->stream_wait_event(stream, compute_ready);
    if (e == dev::ok) prune_switched_from();
    for (std::size_t i = 0; e == dev::ok && i < switched_from.size(); ++i) {
      e = rt->stream_wait_event(stream, switched_from[i]);
    }
    return e;
  }

  /// The staged path's layout: the job's host ranges by address, adjacent ones merged into
  /// runs unless a registration seam lies between (CUDA refuses a copy across one), each run
  /// at a 16-byte boundary of the job's staging. Returns the staging bytes it needs.
  std::uint64_t plan_runs(Job& job) const {
    const bool store = job.plan.kind == JobKind::store;
    const auto& ds = job.plan.descriptors;
    auto host_of = [store](const CopyDescriptor& d) { return store ? d.dst : d.src; };
    std::vector<std::size_t> order(ds.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return host_of(ds[a]) < host_of(ds[b]); });
    const std::uint64_t seam = config.host_registration_bytes;
    auto registration = [&](std::uintptr_t h) {
      return seam == 0 ? 0 : (h - config.host_base) / seam;
    };
    job.runs.clear();
    for (const std::size_t i : order) {
      const std::uintptr_t h = host_of(ds[i]);
      if (!job.runs.empty()) {
        HostRun& last = job.runs.back();
        if (last.host + last.bytes == h && registration(last.host) == registration(h)) {
          last.bytes += ds[i].bytes;
          continue;
        }
      }
      job.runs.push_back({h, ds[i].bytes, 0});
    }
    std::uint64_t offset = 0;
    for (HostRun& r : job.runs) {
      r.offset = offset;
      offset += detail::align16(r.bytes);
    }
    return offset;
  }

  /// The staged path's DMAs: one per host run, between the pool and the job's staging (stores
  /// after the gather kernel, loads before the scatter kernel), batched where the driver can.
  int copy_runs(Job& job, StreamHandle stream) {
    const bool store = job.plan.kind == JobKind::store;
    const std::uint64_t staging =
        reinterpret_cast<std::uint64_t>(device_staging.get()) + *job.staging;
    std::vector<CopyDescriptor> dmas;
    dmas.reserve(job.runs.size());
    for (const HostRun& r : job.runs) {
      dmas.push_back(store ? CopyDescriptor{staging + r.offset, r.host, r.bytes}
                           : CopyDescriptor{r.host, staging + r.offset, r.bytes});
    }
    if (batch_ok) {
      std::size_t fail = 0;
      // A store's DMAs read what the gather kernel wrote just before: in stream order.
      return rt->memcpy_batch_async(dmas.data(), dmas.size(), store, stream, &fail);
    }
    for (const CopyDescriptor& d : dmas) {
      const int e = rt->memcpy_async(reinterpret_cast<void*>(d.dst),
                                     reinterpret_cast<const void*>(d.src), d.bytes, stream);
      if (e != dev::ok) return e;
    }
    return dev::ok;
  }

  /// Where a staged piece's host bytes lie in the job's staging (runs are sorted by host).
  std::uint64_t staged_address(const Job& job, std::uintptr_t host) const {
    auto it = std::upper_bound(job.runs.begin(), job.runs.end(), host,
                               [](std::uintptr_t h, const HostRun& r) { return h < r.host; });
    const HostRun& r = *std::prev(it);
    return reinterpret_cast<std::uint64_t>(device_staging.get()) + *job.staging + r.offset +
           (host - r.host);
  }

  /// Enqueues the job's copies on `stream`; returns the first failing status.
  int enqueue(Job& job, std::size_t si) {
    const StreamHandle stream = streams[si];
    const CopyPlan& plan = job.plan;
    const bool store = plan.kind == JobKind::store;
    switch (job.mode) {
      case CopyMode::memcpy:
        for (const CopyDescriptor& d : plan.descriptors) {
          const int e = rt->memcpy_async(reinterpret_cast<void*>(d.dst),
                                         reinterpret_cast<const void*>(d.src), d.bytes, stream);
          if (e != dev::ok) return e;
        }
        return dev::ok;
      case CopyMode::batch: {
        if (plan.descriptors.empty()) return dev::ok;
        std::size_t fail = 0;
        // Stores read live KV: in stream order. Loads read pinned host blocks nobody writes.
        const int e = rt->memcpy_batch_async(plan.descriptors.data(), plan.descriptors.size(),
                                             store, stream, &fail);
        if (e != dev::ok) {
          job.error = fmt::format("job {} (batch mode): copy {} of {} refused: {}", plan.job, fail,
                                  plan.descriptors.size(), rt->describe(e));
        }
        return e;
      }
      case CopyMode::kernel:
      case CopyMode::staged: {
        const std::size_t n = plan.descriptors.size();
        if (n == 0) return dev::ok;
        const std::size_t bytes = n * sizeof(DevicePiece);
        if (job.upload.host == nullptr) return dev::invalid_value;  // submit reserved it
        rt->host_access(job.upload.host, bytes, true);
        auto* pieces = reinterpret_cast<DevicePiece*>(job.upload.host);
        const bool staged = job.mode == CopyMode::staged;
        for (std::size_t i = 0; i < n; ++i) {
          const CopyDescriptor& d = plan.descriptors[i];
          pieces[i] = {d.src, d.dst, d.bytes};
          // Staged: the kernel gathers a store's pages into staging laid out as the host
          // runs, or scatters a load's pages out of it.
          if (staged && store) pieces[i].dst = staged_address(job, d.dst);
          if (staged && !store) pieces[i].src = staged_address(job, d.src);
        }
        int e = dev::ok;
        if (staged && !store) e = copy_runs(job, stream);  // the host runs in first
        if (e == dev::ok) e = rt->memcpy_async(job.upload.device, pieces, bytes, stream);
        if (e == dev::ok) {
          e = rt->launch_copy_pieces(reinterpret_cast<const DevicePiece*>(job.upload.device), n,
                                     config.kernel_ctas, config.kernel_threads, stream);
        }
        if (e == dev::ok && staged && store) e = copy_runs(job, stream);  // then out to the pool
        return e;
      }
      case CopyMode::automatic: break;
    }
    return dev::invalid_value;
  }

  /// A submission that threw after the job was queued: let what it queued finish before the
  /// job's memory goes back. The job never recorded its event, so it is still failed, as every
  /// job is until then; poll reports it once, as "submission did not complete".
  void abandon(Job& job, std::optional<std::size_t> si, const char* why) noexcept {
    if (si) {
      settle(job, *si);
    } else {
      (void)rt->get_last_error();
      release(job);
    }
    try {
      job.error = fmt::format("job {}: submission did not complete: {}", job.plan.job, why);
    } catch (...) {
      job.error.clear();  // poll still names the job
    }
  }

  /// After a failed call: clear the error, let queued work finish, fail the job.
  void fail_submission(Job& job, std::size_t si, int e, std::string_view what) {
    job.failed = true;
    if (job.error.empty())
      job.error = fmt::format("job {} ({}): {}", job.plan.job, what, rt->describe(e));
    settle(job, si);  // copies already queued may still run
  }

  /// A failed submission's buffers go back only once what it queued has finished: the stream
  /// is synchronized; if a graph capture elsewhere refuses that, the job's event is recorded
  /// and poll gives them back once it is done (the job stays failed); if even that is refused,
  /// they are never given back (they may still be read; a ring that stays full sends later
  /// jobs to the copy engines).
  void settle(Job& job, std::size_t si) noexcept {
    (void)rt->get_last_error();
    const int e = rt->stream_synchronize(streams[si]);
    (void)rt->get_last_error();
    if (!dev::capture_status(e)) {
      release(job);
      return;
    }
    if (job.done != 0 && rt->event_record(job.done, streams[si]) == dev::ok) {
      job.recorded = true;
      return;
    }
    (void)rt->get_last_error();
    job.released = true;  // release() is now a no-op: the slices stay taken
  }

  void count_mode(CopyMode mode) {
    switch (mode) {
      case CopyMode::batch: ++stats.jobs_batch; break;
      case CopyMode::memcpy: ++stats.jobs_memcpy; break;
      case CopyMode::kernel: ++stats.jobs_kernel; break;
      case CopyMode::staged: ++stats.jobs_staged; break;
      case CopyMode::automatic: break;
    }
  }

  std::shared_ptr<DeviceRuntime> rt;
  CudaBackendConfig config;
  std::vector<StreamHandle> streams;  // store streams, then load streams
  std::size_t next_store = 0, next_load = 0;
  bool kernel_ok = false, batch_ok = false;
  Owned device_staging, ring_memory, device_ring_memory;
  std::uint64_t ring_stride = 0;  // bytes between two streams' rings (64-byte aligned)
  // Per stream, over ring_memory (pinned) and device_ring_memory.
  std::vector<detail::RingAllocator> rings, device_rings;
  detail::RingAllocator staging_ring;
  std::optional<StreamHandle> compute;
  EventHandle compute_ready = 0;
  // Deferred stores' marks (mark()), by id, until their plan is submitted or dropped; the
  // stream that joins a mark's waits when the engine switched compute streams.
  std::unordered_map<ComputeMark, EventHandle> marks;
  ComputeMark next_mark = 1;
  StreamHandle mark_stream = 0;
  // Events recorded on compute streams the engine switched away from, not yet seen done;
  // and done ones kept for reuse.
  std::vector<EventHandle> switched_from, spare_events;
  bool skip_compute_wait = false;
  mutable std::mutex mutex;
  std::deque<JobPtr> in_order[2];
  Ticket next_ticket = 1;
  bool stopping = false;
  CudaBackendStats stats;
};

}  // namespace kvoffload
