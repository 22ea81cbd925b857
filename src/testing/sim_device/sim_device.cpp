// SimDevice: streams, events, memory and copies as CUDA defines them, the host-side race
// checks and the test hooks. The state is in sim_device_state.hpp; the kernels in
// sim_kernels.cpp.

#include "kvoffload/testing/sim_device.hpp"

#include <algorithm>
#include <new>

#include <fmt/format.h>

#include "kvoffload/copy_planner.hpp"
#include "testing/sim_device/sim_device_state.hpp"

namespace kvoffload {

using sim::AllocKind;
using sim::at;
using sim::Clock;
using sim::join;
using sim::overlaps;
using sim::range;

SimDevice::SimDevice(const SimConfig& config) : s_(std::make_unique<State>()) {
  s_->config = config;
  s_->config.devices = std::max(config.devices, 1);
  std::lock_guard lock(s_->m);
  for (int d = 0; d < s_->config.devices; ++d) s_->legacy.push_back(s_->make_stream(d));
}

SimDevice::~SimDevice() {
  std::vector<std::thread> threads;
  {
    std::unique_lock lock(s_->m);
    s_->drain_all(lock);
    for (auto& st : s_->streams) st->stop = true;
    s_->cv.notify_all();
    for (auto& st : s_->streams) threads.push_back(std::move(st->thread));
  }
  for (std::thread& t : threads) t.join();
  for (auto& [p, a] : s_->allocs) {
    if (a.kind != AllocKind::registered) std::free(reinterpret_cast<void*>(p));
  }
}

int SimDevice::device_count() noexcept {
  return s_->config.devices;
}

int SimDevice::get_device(int* device) noexcept {
  *device = s_->current_device();
  return dev::ok;
}

int SimDevice::set_device(int device) noexcept {
  if (device < 0 || device >= s_->config.devices) return dev::invalid_device;
  std::lock_guard lock(s_->m);
  State::ThreadContexts& t = State::thread_contexts(s_->instance);
  // cudaSetDevice binds the device's primary context in place of the current one.
  (t.stack.empty() ? t.runtime_device : t.stack.back()) = device;
  s_->contexts.insert(device);
  return dev::ok;
}

int SimDevice::push_device(int device) noexcept {
  if (device < 0 || device >= s_->config.devices) return dev::invalid_device;
  std::lock_guard lock(s_->m);
  State::thread_contexts(s_->instance).stack.push_back(device);
  s_->contexts.insert(device);
  return dev::ok;
}

int SimDevice::pop_device() noexcept {
  State::ThreadContexts& t = State::thread_contexts(s_->instance);
  if (t.stack.empty()) {
    std::lock_guard lock(s_->m);
    s_->violate("pop_device: the thread has no pushed context");
    return dev::invalid_value;
  }
  t.stack.pop_back();
  return dev::ok;
}

int SimDevice::stream_priority_range(int* least, int* greatest) noexcept {
  {
    std::lock_guard lock(s_->m);
    s_->need_context();
  }
  *least = 0;
  *greatest = -5;
  return dev::ok;
}

int SimDevice::can_map_host_memory(int device, bool* yes) noexcept {
  if (device < 0 || device >= s_->config.devices) return dev::invalid_device;
  *yes = s_->config.map_host_memory;
  return dev::ok;
}

int SimDevice::host_mapped(const void* ptr, std::size_t bytes, bool* yes) noexcept {
  std::lock_guard lock(s_->m);
  s_->need_context();
  AllocKind kind{};
  // locate joins adjacent registrations: a pool registered in chunks is mapped end to end.
  *yes = s_->config.map_host_memory && bytes > 0 &&
         s_->locate(reinterpret_cast<std::uintptr_t>(ptr), bytes, &kind) == State::Where::inside &&
         kind != AllocKind::device;
  return dev::ok;
}

int SimDevice::stream_create(int priority, StreamHandle* stream) noexcept {
  std::lock_guard lock(s_->m);
  s_->need_context();
  if (s_->poisoned) return s_->sticky;
  if (const int e = s_->injected("stream_create")) return e;
  State::Stream* st = s_->make_stream(s_->current_device(), priority);
  s_->live_streams[st->handle] = st;
  *stream = st->handle;
  return dev::ok;
}

int SimDevice::stream_destroy(StreamHandle stream) noexcept {
  std::lock_guard lock(s_->m);
  State::Stream* st = s_->find_stream(stream, "stream_destroy");
  if (st == nullptr || stream <= 2) return dev::invalid_resource_handle;
  st->destroyed = true;  // its queued work still runs, as CUDA promises
  s_->live_streams.erase(stream);
  return dev::ok;
}

int SimDevice::stream_synchronize(StreamHandle stream) noexcept {
  std::unique_lock lock(s_->m);
  State::Stream* st = s_->find_stream(stream, "stream_synchronize");
  if (st == nullptr) return dev::invalid_resource_handle;
  const Clock vc = st->vc;
  return s_->host_wait(st, st->enqueued, vc, lock);
}

int SimDevice::stream_device(StreamHandle stream, int* device) noexcept {
  std::lock_guard lock(s_->m);
  State::Stream* st = s_->find_stream(stream, "stream_device");
  if (st == nullptr) return dev::invalid_resource_handle;
  *device = st->device;
  return dev::ok;
}

int SimDevice::stream_capturing(StreamHandle stream, bool* capturing) noexcept {
  std::lock_guard lock(s_->m);
  State::Stream* st = s_->find_stream(stream, "stream_capturing");
  if (st == nullptr) return dev::invalid_resource_handle;
  *capturing = st->capturing;
  return dev::ok;
}

int SimDevice::pointer_device(const void* ptr, int* device) noexcept {
  std::lock_guard lock(s_->m);
  s_->need_context();
  *device = -1;
  AllocKind kind{};
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  if (s_->locate(p, 1, &kind) != State::Where::inside || kind != AllocKind::device) {
    return dev::ok;
  }
  *device = std::prev(s_->allocs.upper_bound(p))->second.device;
  return dev::ok;
}

int SimDevice::event_create(EventHandle* event) noexcept {
  std::lock_guard lock(s_->m);
  s_->need_context();
  if (s_->poisoned) return s_->sticky;
  if (const int e = s_->injected("event_create")) return e;
  const EventHandle h = s_->next_handle;
  s_->next_handle += 16;
  s_->events[h] = State::Event{s_->current_device(), nullptr, 0, {}};
  *event = h;
  return dev::ok;
}

int SimDevice::event_destroy(EventHandle event) noexcept {
  std::lock_guard lock(s_->m);
  s_->need_context();
  if (s_->find_event(event, "event_destroy") == nullptr) return dev::invalid_resource_handle;
  s_->events.erase(event);
  return dev::ok;
}

int SimDevice::event_record(EventHandle event, StreamHandle stream) noexcept {
  std::lock_guard lock(s_->m);
  if (s_->poisoned) return s_->sticky;
  if (const int e = s_->injected("event_record")) return e;
  State::Event* ev = s_->find_event(event, "event_record");
  State::Stream* st = s_->find_stream(stream, "event_record");
  if (ev == nullptr || st == nullptr) return dev::invalid_resource_handle;
  if (ev->device != st->device) {
    s_->violate(fmt::format("event_record: event of device {} recorded on a stream of device {}",
                            ev->device, st->device));
    return dev::invalid_resource_handle;
  }
  ev->stream = st;
  ev->seq = st->enqueued;
  ev->vc = st->vc;
  ev->captured = st->capturing;
  return dev::ok;
}

int SimDevice::stream_wait_event(StreamHandle stream, EventHandle event) noexcept {
  std::lock_guard lock(s_->m);
  if (s_->poisoned) return s_->sticky;
  if (const int e = s_->injected("stream_wait_event")) return e;
  State::Event* ev = s_->find_event(event, "stream_wait_event");
  State::Stream* st = s_->find_stream(stream, "stream_wait_event");
  if (ev == nullptr || st == nullptr) return dev::invalid_resource_handle;
  if (ev->captured && ev->stream != st) {
    s_->violate(fmt::format(
        "stream_wait_event: stream {:#x} waits for an event recorded while stream {:#x} was "
        "capturing a graph: it joins that capture, and its work runs only when the graph does",
        stream, ev->stream->handle));
  }
  if (ev->stream == nullptr || ev->seq == 0) return dev::ok;  // nothing captured
  State::Op op;
  op.name = "wait_event";
  op.wait_on = ev->stream;
  op.wait_seq = ev->seq;
  join(st->vc, ev->vc);
  s_->enqueue(st, std::move(op));
  return dev::ok;
}

int SimDevice::event_query(EventHandle event) noexcept {
  std::lock_guard lock(s_->m);
  s_->need_context();
  State::Event* ev = s_->find_event(event, "event_query");
  if (ev == nullptr) return dev::invalid_resource_handle;
  if (const int e = s_->injected("event_query")) return e;
  if (s_->poisoned) return s_->sticky;
  if (ev->stream == nullptr) return dev::ok;
  if (ev->stream->completed < ev->seq) return dev::not_ready;
  join(s_->host_vc, ev->vc);
  return dev::ok;
}

int SimDevice::event_synchronize(EventHandle event) noexcept {
  std::unique_lock lock(s_->m);
  s_->need_context();
  State::Event* ev = s_->find_event(event, "event_synchronize");
  if (ev == nullptr) return dev::invalid_resource_handle;
  if (const int e = s_->injected("event_synchronize")) return e;
  if (ev->stream == nullptr) return s_->poisoned ? s_->sticky : dev::ok;
  State::Stream* st = ev->stream;
  const std::uint64_t seq = ev->seq;
  const Clock vc = ev->vc;
  return s_->host_wait(st, seq, vc, lock);
}

int SimDevice::device_synchronize() noexcept {
  std::unique_lock lock(s_->m);
  s_->need_context();
  s_->drain_all(lock);
  return s_->poisoned ? s_->sticky : dev::ok;
}

int SimDevice::malloc_device(void** ptr, std::size_t bytes) noexcept {
  std::lock_guard lock(s_->m);
  s_->need_context();
  if (s_->poisoned) return s_->sticky;
  if (const int e = s_->injected("malloc_device")) return e;
  return s_->allocate(ptr, bytes, AllocKind::device);
}

int SimDevice::malloc_host(void** ptr, std::size_t bytes) noexcept {
  std::lock_guard lock(s_->m);
  s_->need_context();
  if (s_->poisoned) return s_->sticky;
  if (const int e = s_->injected("malloc_host")) return e;
  return s_->allocate(ptr, bytes, AllocKind::pinned);
}

int SimDevice::free_device(void* ptr) noexcept {
  std::unique_lock lock(s_->m);
  s_->need_context();
  return s_->free_now(ptr, lock, false);
}

int SimDevice::free_host(void* ptr) noexcept {
  std::unique_lock lock(s_->m);
  s_->need_context();
  return s_->free_now(ptr, lock, true);
}

int SimDevice::malloc_async(void** ptr, std::size_t bytes, StreamHandle stream) noexcept {
  std::lock_guard lock(s_->m);
  if (s_->poisoned) return s_->sticky;
  if (const int e = s_->injected("malloc_async")) return e;
  State::Stream* st = s_->find_stream(stream, "malloc_async");
  if (st == nullptr) return dev::invalid_resource_handle;
  return s_->allocate(ptr, bytes, AllocKind::device);
}

int SimDevice::free_async(void* ptr, StreamHandle stream) noexcept {
  std::lock_guard lock(s_->m);
  if (s_->poisoned) return s_->sticky;
  State::Stream* st = s_->find_stream(stream, "free_async");
  if (st == nullptr) return dev::invalid_resource_handle;
  const auto it = s_->allocs.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == s_->allocs.end() || !it->second.live || it->second.kind != AllocKind::device) {
    s_->violate(fmt::format("free_async: {} is not a live device allocation", ptr));
    return dev::invalid_value;
  }
  State::Op op;
  op.name = "free_async";
  op.plan = [this, p = it->first](std::vector<SimAccess>&) {
    // Runs under the lock, in stream order: the memory goes now.
    const auto found = s_->allocs.find(p);
    s_->purge(p, p + found->second.bytes);
    std::free(reinterpret_cast<void*>(p));
    s_->allocs.erase(found);
    return dev::ok;
  };
  s_->enqueue(st, std::move(op));
  return dev::ok;
}

int SimDevice::memcpy_async(void* dst, const void* src, std::size_t bytes,
                            StreamHandle stream) noexcept {
  std::lock_guard lock(s_->m);
  if (s_->poisoned) return s_->sticky;
  if (const int e = s_->injected("memcpy_async")) return e;
  State::Stream* st = s_->find_stream(stream, "memcpy_async");
  if (st == nullptr) return dev::invalid_resource_handle;
  if (s_->copy_straddles(reinterpret_cast<std::uintptr_t>(dst), bytes) ||
      s_->copy_straddles(reinterpret_cast<std::uintptr_t>(src), bytes)) {
    return dev::invalid_value;  // the driver checks ranges against allocations at the call
  }
  if (bytes == 0) return dev::ok;
  State::Op op;
  op.name = "memcpy_async";
  op.dmas = 1;
  op.accesses = {range(src, bytes, false), range(dst, bytes, true)};
  op.run = [dst, src, bytes] { std::memcpy(dst, src, bytes); };
  s_->enqueue(st, std::move(op));
  return dev::ok;
}

bool SimDevice::batch_available() noexcept {
  return s_->config.batch_available;
}

int SimDevice::memcpy_batch_async(const CopyDescriptor* copies, std::size_t count,
                                  bool src_in_stream_order, StreamHandle stream,
                                  std::size_t* fail_index) noexcept {
  std::lock_guard lock(s_->m);
  if (s_->poisoned) return s_->sticky;
  if (!s_->config.batch_available) return dev::not_supported;
  if (const int e = s_->injected("memcpy_batch_async")) return e;
  State::Stream* st = s_->find_stream(stream, "memcpy_batch_async");
  if (st == nullptr) return dev::invalid_resource_handle;
  State::Op op;
  op.name = "memcpy_batch_async";
  op.dmas = count;
  std::vector<CopyDescriptor> list(copies, copies + count);
  for (std::size_t i = 0; i < count; ++i) {
    if (s_->copy_straddles(list[i].dst, list[i].bytes) ||
        s_->copy_straddles(list[i].src, list[i].bytes)) {
      *fail_index = i;
      return dev::invalid_value;
    }
    const SimAccess read{list[i].src, list[i].src + list[i].bytes, false};
    (src_in_stream_order ? op.accesses : op.early_reads).push_back(read);
    op.accesses.push_back({list[i].dst, list[i].dst + list[i].bytes, true});
  }
  if (!src_in_stream_order) op.early_vc = s_->host_vc;
  op.run = [list = std::move(list)] {
    for (const CopyDescriptor& c : list) {
      std::memcpy(reinterpret_cast<void*>(c.dst), reinterpret_cast<const void*>(c.src), c.bytes);
    }
  };
  s_->enqueue(st, std::move(op));
  return dev::ok;
}

int SimDevice::get_last_error() noexcept {
  std::lock_guard lock(s_->m);
  return s_->poisoned ? s_->sticky : dev::ok;
}

std::string SimDevice::describe(int status) const {
  if (s_->throw_in_describe.exchange(false)) throw std::bad_alloc();
  switch (status) {
    case dev::ok: return "cudaSuccess (simulated)";
    case dev::invalid_value: return "cudaErrorInvalidValue (simulated: invalid argument)";
    case dev::memory_allocation: return "cudaErrorMemoryAllocation (simulated: out of memory)";
    case dev::invalid_device: return "cudaErrorInvalidDevice (simulated: invalid device ordinal)";
    case dev::invalid_resource_handle:
      return "cudaErrorInvalidResourceHandle (simulated: invalid resource handle)";
    case dev::not_ready: return "cudaErrorNotReady (simulated: device not ready)";
    case dev::illegal_address:
      return "cudaErrorIllegalAddress (simulated: an illegal memory access was encountered)";
    case dev::not_supported: return "cudaErrorNotSupported (simulated: operation not supported)";
    default: return fmt::format("cudaError {} (simulated)", status);
  }
}

void SimDevice::host_access(const void* ptr, std::size_t bytes, bool write) noexcept {
  if (bytes == 0) return;
  std::lock_guard lock(s_->m);
  const SimAccess h = range(ptr, bytes, write);
  auto clash = [&](const SimAccess& a) { return (a.write || write) && overlaps(a, h); };
  for (const State::LogEntry& e : s_->log) {
    if (at(s_->host_vc, e.stream) >= e.seq) continue;
    for (const SimAccess& a : e.accesses) {
      if (clash(a)) {
        s_->violate(
            fmt::format("race: the host {} [{:#x}, {:#x}) which {} (stream {}, op {}) "
                        "{}, and the host has not waited for it",
                        write ? "writes" : "reads", h.begin, h.end, e.name, e.stream, e.seq,
                        a.write ? "writes" : "reads"));
        return;
      }
    }
  }
  for (const auto& st : s_->streams) {
    for (const State::Op& op : st->ops) {
      std::vector<SimAccess> all = op.accesses;
      all.insert(all.end(), op.early_reads.begin(), op.early_reads.end());
      for (const SimAccess& a : all) {
        if (clash(a)) {
          s_->violate(
              fmt::format("race: the host {} [{:#x}, {:#x}) which queued {} (stream "
                          "{}, op {}) {}",
                          write ? "writes" : "reads", h.begin, h.end, op.name, st->index, op.seq,
                          a.write ? "writes" : "reads"));
          return;
        }
      }
    }
  }
}

int SimDevice::host_register(void* ptr, std::size_t bytes) noexcept {
  std::lock_guard lock(s_->m);
  s_->need_context();
  if (s_->poisoned) return s_->sticky;
  if (const int e = s_->injected("host_register")) return e;
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  if (bytes == 0 || s_->locate(p, bytes) != State::Where::outside) return dev::invalid_value;
  s_->allocs[p] = {bytes, AllocKind::registered, 0, true};
  return dev::ok;
}

int SimDevice::host_unregister(void* ptr) noexcept {
  std::unique_lock lock(s_->m);
  s_->need_context();
  const auto it = s_->allocs.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == s_->allocs.end() || it->second.kind != AllocKind::registered) {
    return dev::invalid_value;
  }
  s_->drain_all(lock);
  s_->purge(it->first, it->first + it->second.bytes);
  s_->allocs.erase(it);
  return dev::ok;
}

int SimDevice::launch(StreamHandle stream, std::string name, std::vector<SimAccess> accesses,
                      std::function<void()> run) {
  std::lock_guard lock(s_->m);
  if (s_->poisoned) return s_->sticky;
  State::Stream* st = s_->find_stream(stream, "launch");
  if (st == nullptr) return dev::invalid_resource_handle;
  State::Op op;
  op.name = std::move(name);
  op.plan = [acc = std::move(accesses)](std::vector<SimAccess>& out) {
    out = acc;
    return dev::ok;
  };
  op.run = std::move(run);
  s_->enqueue(st, std::move(op));
  return dev::ok;
}

void SimDevice::inject_throw_in_describe() {
  s_->throw_in_describe = true;
}

void SimDevice::inject_failure(const std::string& call, int status, int after) {
  std::lock_guard lock(s_->m);
  s_->failures[call] = {status, after};
}

std::vector<std::string> SimDevice::violations() const {
  std::lock_guard lock(s_->m);
  return s_->violations;
}

std::size_t SimDevice::live_streams() const {
  std::lock_guard lock(s_->m);
  return s_->live_streams.size();
}

std::size_t SimDevice::live_events() const {
  std::lock_guard lock(s_->m);
  return s_->events.size();
}

std::size_t SimDevice::live_registrations() const {
  std::lock_guard lock(s_->m);
  return static_cast<std::size_t>(
      std::count_if(s_->allocs.begin(), s_->allocs.end(),
                    [](const auto& a) { return a.second.kind == AllocKind::registered; }));
}

std::size_t SimDevice::live_allocations() const {
  std::lock_guard lock(s_->m);
  return static_cast<std::size_t>(
      std::count_if(s_->allocs.begin(), s_->allocs.end(),
                    [](const auto& a) { return a.second.kind != AllocKind::registered; }));
}

int SimDevice::primary_context_active(int device, bool* active) noexcept {
  if (device < 0 || device >= s_->config.devices) return dev::invalid_device;
  std::lock_guard lock(s_->m);
  *active = s_->contexts.count(device) != 0;
  return dev::ok;
}

void SimDevice::range_push(const char* name) noexcept {
  std::lock_guard lock(s_->m);
  try {
    s_->ranges.emplace_back(name);
  } catch (...) {  // out of memory: the name is lost, the count is kept
  }
  ++s_->open_ranges;
}

void SimDevice::range_pop() noexcept {
  std::lock_guard lock(s_->m);
  if (s_->open_ranges == 0) {
    try {
      s_->violate("range_pop without a range open");
    } catch (...) {
    }
    return;
  }
  --s_->open_ranges;
}

std::vector<std::string> SimDevice::ranges() const {
  std::lock_guard lock(s_->m);
  return s_->ranges;
}

std::size_t SimDevice::open_ranges() const {
  std::lock_guard lock(s_->m);
  return s_->open_ranges;
}

int SimDevice::begin_capture(StreamHandle stream) {
  std::lock_guard lock(s_->m);
  State::Stream* st = s_->find_stream(stream, "begin_capture");
  if (st == nullptr) return dev::invalid_resource_handle;
  st->capturing = true;
  return dev::ok;
}

int SimDevice::end_capture(StreamHandle stream) {
  std::lock_guard lock(s_->m);
  State::Stream* st = s_->find_stream(stream, "end_capture");
  if (st == nullptr) return dev::invalid_resource_handle;
  st->capturing = false;
  return dev::ok;
}

bool SimDevice::poisoned() const {
  std::lock_guard lock(s_->m);
  return s_->poisoned;
}

}  // namespace kvoffload
