// SimDevice: streams as threads over FIFOs, events and waits as CUDA defines them, vector
// clocks for the race checks. One mutex guards all state; operations run outside it.

#include "kvoffload/sim_device.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "kvoffload/copy_planner.hpp"
#include "kvoffload/detail/copy_body.hpp"

namespace kvoffload {
namespace {

using Clock = std::vector<std::uint64_t>;  // per stream index: the last op seen

void join(Clock& into, const Clock& other) {
  if (into.size() < other.size()) into.resize(other.size(), 0);
  for (std::size_t i = 0; i < other.size(); ++i) into[i] = std::max(into[i], other[i]);
}

std::uint64_t at(const Clock& c, std::size_t i) {
  return i < c.size() ? c[i] : 0;
}

bool overlaps(const SimAccess& a, const SimAccess& b) {
  return a.begin < b.end && b.begin < a.end;
}

SimAccess range(const void* p, std::size_t bytes, bool write) {
  const auto b = reinterpret_cast<std::uintptr_t>(p);
  return {b, b + bytes, write};
}

enum class AllocKind : std::uint8_t { device, pinned, registered };

std::atomic<std::uint64_t> next_instance{1};

}  // namespace

struct SimDevice::State {
  struct Stream;
  struct Op {
    std::string name;
    std::uint64_t seq = 0;
    Clock vc;
    Stream* wait_on = nullptr;  // a stream_wait_event
    std::uint64_t wait_seq = 0;
    std::vector<SimAccess> accesses;  // known at enqueue
    // A batch copy with source order "any": these reads may happen as early as the call, so
    // they are ordered only after what the host knew was done then (early_vc).
    std::vector<SimAccess> early_reads;
    Clock early_vc;
    // Computes the data-dependent accesses (kernels) under the lock; non-ok poisons.
    std::function<int(std::vector<SimAccess>&)> plan;
    std::function<void()> run;
  };
  struct Stream {
    StreamHandle handle = 0;
    std::size_t index = 0;  // in clocks
    int device = 0;
    bool destroyed = false;
    bool stop = false;
    std::deque<Op> ops;
    std::uint64_t enqueued = 0, completed = 0;
    Clock vc;  // what work enqueued from now on is ordered after
    std::mt19937_64 rng;
    std::thread thread;
  };
  struct Event {
    int device = 0;
    Stream* stream = nullptr;
    std::uint64_t seq = 0;
    Clock vc;
  };
  struct Alloc {
    std::size_t bytes = 0;
    AllocKind kind = AllocKind::device;
    bool live = true;  // false once a free_async is queued (freed when it runs)
  };
  struct LogEntry {
    std::size_t stream;
    std::uint64_t seq;
    std::string name;
    std::vector<SimAccess> accesses;
  };

  SimConfig config;
  std::uint64_t instance = next_instance.fetch_add(1);
  mutable std::mutex m;
  std::mutex exec_mutex;
  std::condition_variable cv;
  std::vector<std::unique_ptr<Stream>> streams;  // all ever created (index = clock slot)
  std::unordered_map<StreamHandle, Stream*> live_streams;
  std::vector<Stream*> legacy;  // per device
  std::unordered_map<EventHandle, Event> events;
  std::uintptr_t next_handle = 0x1000;
  std::map<std::uintptr_t, Alloc> allocs;
  std::deque<LogEntry> log;
  Clock host_vc;
  std::vector<std::string> violations;
  bool poisoned = false;
  int sticky = dev::ok;
  std::map<std::string, std::pair<int, int>> failures;  // call -> (status, calls to let pass)
  std::set<int> contexts;                               // devices whose primary context exists
  std::atomic<bool> throw_in_describe{false};

  /// A host thread's contexts: a stack of pushed primary contexts over the runtime's device
  /// (set by set_device; -1 until a device is chosen or implicitly initialised).
  struct ThreadContexts {
    std::vector<int> stack;
    int runtime_device = -1;
  };
  static ThreadContexts& thread_contexts(std::uint64_t inst) {
    thread_local std::unordered_map<std::uint64_t, ThreadContexts> per_instance;
    return per_instance[inst];
  }
  /// What cudaGetDevice says: the current context's device, or 0 with none.
  int current_device() const {
    const ThreadContexts& t = thread_contexts(instance);
    if (!t.stack.empty()) return t.stack.back();
    return t.runtime_device >= 0 ? t.runtime_device : 0;
  }
  /// A call that needs a context: on a thread with none, CUDA initialises the primary
  /// context of device 0 (caller holds m).
  void need_context() {
    ThreadContexts& t = thread_contexts(instance);
    if (!t.stack.empty() || t.runtime_device >= 0) return;
    t.runtime_device = 0;
    contexts.insert(0);
  }

  void violate(std::string what) { violations.push_back(std::move(what)); }

  /// The injected failure for `call`, if its turn has come (caller holds m).
  int injected(const char* call) {
    auto it = failures.find(call);
    if (it == failures.end()) return dev::ok;
    if (it->second.second > 0) {
      --it->second.second;
      return dev::ok;
    }
    const int status = it->second.first;
    failures.erase(it);
    return status;
  }

  Stream* find_stream(StreamHandle h, const char* call) {
    need_context();
    if (h == 0 || h == 1) return legacy[static_cast<std::size_t>(current_device())];
    const auto it = live_streams.find(h);
    if (it == live_streams.end()) {
      violate(fmt::format("{}: stream {:#x} does not exist (destroyed or never created)", call, h));
      return nullptr;
    }
    return it->second;
  }
  Event* find_event(EventHandle h, const char* call) {
    const auto it = events.find(h);
    if (it == events.end()) {
      violate(fmt::format("{}: event {:#x} does not exist (destroyed or never created)", call, h));
      return nullptr;
    }
    return &it->second;
  }

  /// The allocation containing [p, p + n): ok, none (pageable host memory), or a range that
  /// straddles an allocation's end (invalid).
  enum class Where : std::uint8_t { inside, outside, straddles };
  Where locate(std::uintptr_t p, std::size_t n, AllocKind* kind = nullptr) const {
    auto it = allocs.upper_bound(p);
    if (it != allocs.begin()) {
      auto prev = std::prev(it);
      if (p < prev->first + prev->second.bytes) {
        if (!prev->second.live) return Where::straddles;  // freed: not a valid range
        if (kind != nullptr) *kind = prev->second.kind;
        return p + n <= prev->first + prev->second.bytes ? Where::inside : Where::straddles;
      }
    }
    if (it != allocs.end() && it->first < p + n) return Where::straddles;
    return Where::outside;
  }
  /// What a kernel may touch: device memory, and pinned host memory when mapped.
  bool device_accessible(std::uintptr_t p, std::size_t n) const {
    if (n == 0) return true;
    AllocKind kind{};
    if (locate(p, n, &kind) != Where::inside) return false;
    return kind == AllocKind::device || config.map_host_memory;
  }

  /// What a kernel launch checks before it is queued, as CUDA does: a healthy context, the
  /// stream (of the current device) and the launch shape. Caller holds m.
  int kernel_stream(const char* call, StreamHandle stream, int ctas, int threads, Stream** out) {
    need_context();
    if (poisoned) return sticky;
    if (const int e = injected(call)) return e;
    Stream* st = find_stream(stream, call);
    if (st == nullptr || st->device != current_device()) return dev::invalid_resource_handle;
    if (ctas < 1 || threads < 32 || threads % 32 != 0 || threads > 1024) return dev::invalid_value;
    *out = st;
    return dev::ok;
  }

  Stream* make_stream(int device) {
    auto st = std::make_unique<Stream>();
    st->handle = next_handle;
    next_handle += 16;
    st->index = streams.size();
    st->device = device;
    st->rng.seed(config.seed * 0x9e3779b97f4a7c15ULL + st->index);
    Stream* raw = st.get();
    streams.push_back(std::move(st));
    raw->thread = std::thread([this, raw] { worker(raw); });
    return raw;
  }

  std::uint64_t enqueue(Stream* st, Op op) {
    op.seq = ++st->enqueued;
    join(st->vc, host_vc);
    if (st->vc.size() <= st->index) st->vc.resize(st->index + 1, 0);
    st->vc[st->index] = op.seq;
    op.vc = st->vc;
    st->ops.push_back(std::move(op));
    cv.notify_all();
    return st->enqueued;
  }

  void check_races(const Stream* st, const Op& op, const std::vector<SimAccess>& acc) {
    for (const LogEntry& e : log) {
      if (e.stream == st->index || at(op.vc, e.stream) >= e.seq) continue;
      for (const SimAccess& a : acc) {
        for (const SimAccess& b : e.accesses) {
          if ((a.write || b.write) && overlaps(a, b)) {
            violate(fmt::format(
                "race: {} (stream {}, op {}) {} [{:#x}, {:#x}) which {} (stream {}, op {}) {} "
                "without ordering",
                op.name, st->index, op.seq, a.write ? "writes" : "reads", a.begin, a.end, e.name,
                e.stream, e.seq, b.write ? "writes" : "reads"));
            return;
          }
        }
      }
    }
  }

  /// The early reads against every write the host had not seen finish at the call, on any
  /// stream, this one included.
  void check_early_reads(const Stream* st, const Op& op) {
    for (const LogEntry& e : log) {
      if (at(op.early_vc, e.stream) >= e.seq) continue;
      for (const SimAccess& a : op.early_reads) {
        for (const SimAccess& b : e.accesses) {
          if (b.write && overlaps(a, b)) {
            violate(fmt::format(
                "race: {} (stream {}, op {}, source order any) reads [{:#x}, {:#x}) which {} "
                "(stream {}, op {}) writes: with source order any the source may be read at the "
                "call, before earlier work on the stream has run",
                op.name, st->index, op.seq, a.begin, a.end, e.name, e.stream, e.seq));
            return;
          }
        }
      }
    }
  }

  void record(const Stream* st, const Op& op, std::vector<SimAccess> acc) {
    if (acc.empty()) return;
    log.push_back({st->index, op.seq, op.name, std::move(acc)});
    if (log.size() > 40000) log.erase(log.begin(), log.begin() + 10000);
  }

  void poison(const Op& op, int status) {
    if (!poisoned) {
      violate(
          fmt::format("fault: {} touched memory a kernel cannot reach; the context is "
                      "poisoned (every later call fails)",
                      op.name));
    }
    poisoned = true;
    sticky = status;
  }

  void worker(Stream* st) {
    std::unique_lock lock(m);
    std::uniform_int_distribution<int> delay(0, std::max(config.max_delay_us, 0));
    for (;;) {
      cv.wait(lock, [&] { return st->stop || !st->ops.empty(); });
      if (st->ops.empty()) return;
      Op& op = st->ops.front();
      if (op.wait_on != nullptr) {
        Stream* other = op.wait_on;
        const std::uint64_t seq = op.wait_seq;
        cv.wait(lock, [&] { return other->completed >= seq; });
      }
      const int us = delay(st->rng);
      if (us > 0) {
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(us));
        lock.lock();
      }
      if (!poisoned && (op.plan || op.run || !op.accesses.empty())) {
        std::vector<SimAccess> acc = std::move(op.accesses);
        const int status = op.plan ? op.plan(acc) : dev::ok;
        if (status != dev::ok) {
          poison(op, status);
        } else {
          check_races(st, op, acc);
          check_early_reads(st, op);
          acc.insert(acc.end(), op.early_reads.begin(), op.early_reads.end());
          record(st, op, std::move(acc));
          if (op.run) {
            lock.unlock();
            {
              // One operation's bytes move at a time: a race between streams is found by the
              // vector clocks above, never by a real data race in this process (so the
              // simulator is clean under ThreadSanitizer even when the program is not).
              std::lock_guard exec(exec_mutex);
              op.run();
            }
            lock.lock();
          }
        }
      }
      st->completed = op.seq;
      st->ops.pop_front();
      cv.notify_all();
    }
  }

  /// Host waits for `seq` on `st`, then knows what `vc` says.
  int host_wait(Stream* st, std::uint64_t seq, const Clock& vc, std::unique_lock<std::mutex>& lk) {
    cv.wait(lk, [&] { return st->completed >= seq; });
    join(host_vc, vc);
    return poisoned ? sticky : dev::ok;
  }

  void purge(std::uintptr_t begin, std::uintptr_t end) {
    for (LogEntry& e : log) {
      std::erase_if(e.accesses, [&](const SimAccess& a) { return a.begin < end && begin < a.end; });
    }
  }

  void drain_all(std::unique_lock<std::mutex>& lk) {
    for (std::size_t i = 0; i < streams.size(); ++i) {  // streams may grow while we wait
      Stream* raw = streams[i].get();
      const std::uint64_t seq = raw->enqueued;
      const Clock vc = raw->vc;
      cv.wait(lk, [&] { return raw->completed >= seq; });
      join(host_vc, vc);
    }
  }

  /// cudaFree / cudaFreeHost: they synchronize, so no queued work may still use the memory.
  int free_now(void* ptr, std::unique_lock<std::mutex>& lock, bool host) {
    if (ptr == nullptr) return dev::ok;
    drain_all(lock);
    const auto it = allocs.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == allocs.end() || !it->second.live || it->second.kind == AllocKind::registered ||
        (it->second.kind == AllocKind::device) == host) {
      violate(fmt::format("{}: {} is not a live {} allocation", host ? "free_host" : "free_device",
                          ptr, host ? "pinned host" : "device"));
      return dev::invalid_value;
    }
    purge(it->first, it->first + it->second.bytes);
    std::free(ptr);
    allocs.erase(it);
    return dev::ok;
  }

  int allocate(void** ptr, std::size_t bytes, AllocKind kind) {
    const std::size_t size = std::max<std::size_t>((bytes + 255) / 256 * 256, 256);
    void* p = std::aligned_alloc(256, size);
    if (p == nullptr) return dev::memory_allocation;
    std::memset(p, 0xcd, size);  // like uninitialized device memory: not zeros
    allocs[reinterpret_cast<std::uintptr_t>(p)] = {size, kind, true};
    *ptr = p;
    return dev::ok;
  }
};

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
  *yes = s_->config.map_host_memory &&
         s_->locate(reinterpret_cast<std::uintptr_t>(ptr), bytes, &kind) == State::Where::inside &&
         kind != AllocKind::device;
  return dev::ok;
}

int SimDevice::stream_create(int /*priority*/, StreamHandle* stream) noexcept {
  std::lock_guard lock(s_->m);
  s_->need_context();
  if (s_->poisoned) return s_->sticky;
  if (const int e = s_->injected("stream_create")) return e;
  State::Stream* st = s_->make_stream(s_->current_device());
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
  return dev::ok;
}

int SimDevice::stream_wait_event(StreamHandle stream, EventHandle event) noexcept {
  std::lock_guard lock(s_->m);
  if (s_->poisoned) return s_->sticky;
  if (const int e = s_->injected("stream_wait_event")) return e;
  State::Event* ev = s_->find_event(event, "stream_wait_event");
  State::Stream* st = s_->find_stream(stream, "stream_wait_event");
  if (ev == nullptr || st == nullptr) return dev::invalid_resource_handle;
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
  if (s_->locate(reinterpret_cast<std::uintptr_t>(dst), bytes) == State::Where::straddles ||
      s_->locate(reinterpret_cast<std::uintptr_t>(src), bytes) == State::Where::straddles) {
    return dev::invalid_value;  // the driver checks ranges against allocations at the call
  }
  if (bytes == 0) return dev::ok;
  State::Op op;
  op.name = "memcpy_async";
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
  std::vector<CopyDescriptor> list(copies, copies + count);
  for (std::size_t i = 0; i < count; ++i) {
    if (s_->locate(list[i].dst, list[i].bytes) == State::Where::straddles ||
        s_->locate(list[i].src, list[i].bytes) == State::Where::straddles) {
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

int SimDevice::launch_copy_pieces(const detail::DevicePiece* pieces, std::uint64_t count, int ctas,
                                  int threads, StreamHandle stream) noexcept {
  std::lock_guard lock(s_->m);
  State::Stream* st = nullptr;
  if (const int e = s_->kernel_stream("launch_copy_pieces", stream, ctas, threads, &st)) return e;
  if (count == 0) return dev::ok;
  const auto warps = static_cast<std::uint64_t>(ctas) * static_cast<std::uint64_t>(threads / 32);
  State::Op op;
  op.name = "copy_pieces kernel";
  op.plan = [this, pieces, count](std::vector<SimAccess>& acc) {
    const auto base = reinterpret_cast<std::uintptr_t>(pieces);
    if (!s_->device_accessible(base, count * sizeof(detail::DevicePiece))) {
      return dev::illegal_address;
    }
    acc.push_back({base, base + count * sizeof(detail::DevicePiece), false});
    for (std::uint64_t i = 0; i < count; ++i) {
      const detail::DevicePiece& p = pieces[i];
      if (p.bytes == 0) continue;
      if (!s_->device_accessible(p.src, p.bytes) || !s_->device_accessible(p.dst, p.bytes)) {
        return dev::illegal_address;
      }
      acc.push_back({p.src, p.src + p.bytes, false});
      acc.push_back({p.dst, p.dst + p.bytes, true});
    }
    return dev::ok;
  };
  op.run = [pieces, count, warps] {
    for (std::uint64_t w = 0; w < warps; ++w) {
      for (unsigned lane = 0; lane < 32; ++lane)
        detail::copy_pieces(pieces, count, w, warps, lane, 32);
    }
  };
  s_->enqueue(st, std::move(op));
  return dev::ok;
}

int SimDevice::launch_build_pieces(const detail::DeviceJobLayout& layout, const std::int32_t* ids,
                                   const std::int64_t* count, const std::int64_t* group_counts,
                                   const std::int32_t* host_ids, const int* mismatch,
                                   detail::DevicePiece* pieces, std::uint64_t max_pieces, int ctas,
                                   int threads, StreamHandle stream) noexcept {
  std::lock_guard lock(s_->m);
  State::Stream* st = nullptr;
  if (const int e = s_->kernel_stream("launch_build_pieces", stream, ctas, threads, &st)) return e;
  if (max_pieces == 0) return dev::ok;
  State::Op op;
  op.name = "build_pieces kernel";
  std::int64_t hosts = 0;
  for (int g = 0; g < layout.groups; ++g) hosts += layout.host_count[g];
  op.plan = [=, this](std::vector<SimAccess>& acc) {
    auto ok = [&](const void* p, std::size_t n, bool write) {
      if (!s_->device_accessible(reinterpret_cast<std::uintptr_t>(p), n)) return false;
      acc.push_back(range(p, n, write));
      return true;
    };
    const bool good =
        ok(mismatch, sizeof(int), false) && ok(count, 8, false) &&
        ok(group_counts, 8 * static_cast<std::size_t>(layout.groups), false) &&
        ok(host_ids, 4 * static_cast<std::size_t>(hosts), false) &&
        ok(ids, 4 * static_cast<std::size_t>(std::max<std::int64_t>(*count, 0)), false) &&
        ok(pieces, max_pieces * sizeof(detail::DevicePiece), true);
    return good ? dev::ok : dev::illegal_address;
  };
  op.run = [=] {
    for (std::uint64_t x = 0; x < max_pieces; ++x) {
      pieces[x] = detail::build_piece(layout, ids, count, group_counts, host_ids, mismatch, x);
    }
  };
  s_->enqueue(st, std::move(op));
  return dev::ok;
}

int SimDevice::compaction_temp_bytes(std::int64_t max_ids, int /*max_groups*/,
                                     std::size_t* bytes) noexcept {
  {
    std::lock_guard lock(s_->m);
    s_->need_context();  // CUB's size query asks the device for its occupancy
  }
  *bytes = static_cast<std::size_t>(std::max<std::int64_t>(max_ids, 1)) * 4 + 256;
  return dev::ok;
}

int SimDevice::launch_compact(const CompactArgs& a, StreamHandle stream) noexcept {
  std::lock_guard lock(s_->m);
  if (s_->poisoned) return s_->sticky;
  if (const int e = s_->injected("launch_compact")) return e;
  State::Stream* st = s_->find_stream(stream, "launch_compact");
  if (st == nullptr) return dev::invalid_resource_handle;
  if (st->device != s_->current_device()) return dev::invalid_resource_handle;
  if (a.n < 0 || a.groups < 1) return dev::invalid_value;
  State::Op op;
  op.name = "compaction kernels";
  const auto G = static_cast<std::size_t>(a.groups);
  const auto n = static_cast<std::size_t>(a.n);
  op.plan = [this, a, G, n](std::vector<SimAccess>& acc) {
    auto ok = [&](const void* p, std::size_t bytes, bool write) {
      if (p == nullptr && bytes == 0) return true;
      if (!s_->device_accessible(reinterpret_cast<std::uintptr_t>(p), bytes)) return false;
      if (bytes > 0) acc.push_back(range(p, bytes, write));
      return true;
    };
    const bool good =
        ok(a.ids, 4 * n, false) && ok(a.offsets, 8 * (G + 1), false) &&
        ok(a.expected, 8 * G, false) && (a.max_id == nullptr || ok(a.max_id, 8 * G, false)) &&
        ok(a.out, 4 * n, true) && ok(a.count, 8, true) && ok(a.group_counts, 8 * G, true) &&
        ok(a.mismatch, sizeof(int), true) && ok(a.temp, a.temp_bytes, true);
    return good ? dev::ok : dev::illegal_address;
  };
  op.run = [a, G] {
    std::int64_t out = 0;
    int bad = 0;
    for (std::size_t g = 0; g < G; ++g) {
      std::int64_t real = 0;
      for (std::int64_t i = a.offsets[g]; i < a.offsets[g + 1]; ++i) {
        const std::int32_t id = a.ids[i];
        if (!detail::NotNullBlock{}(id)) continue;
        ++real;
        a.out[out++] = id;
        if (id < 0 || (a.max_id != nullptr && id > a.max_id[g])) bad = 1;
      }
      a.group_counts[g] = real;
      if (real != a.expected[g]) bad = 1;
    }
    *a.count = out;
    *a.mismatch = bad;
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
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  if (s_->locate(p, bytes) != State::Where::outside) return dev::invalid_value;
  s_->allocs[p] = {bytes, AllocKind::registered, true};
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

bool SimDevice::poisoned() const {
  std::lock_guard lock(s_->m);
  return s_->poisoned;
}

}  // namespace kvoffload
