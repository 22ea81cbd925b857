#pragma once

// Internal: the simulated device's state (SimDevice::State), shared by sim_device.cpp (streams,
// events, memory, copies, the host-side checks) and sim_kernels.cpp (the copy kernels and the
// compaction run on the CPU). Streams are threads over FIFOs; vector clocks order operations
// for the race checks; one mutex guards everything, and operations run outside it.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <sys/prctl.h>

#include "kvoffload/testing/sim_device.hpp"

namespace kvoffload {
namespace sim {

using Clock = std::vector<std::uint64_t>;  // per stream index: the last op seen

inline void join(Clock& into, const Clock& other) {
  if (into.size() < other.size()) into.resize(other.size(), 0);
  for (std::size_t i = 0; i < other.size(); ++i) into[i] = std::max(into[i], other[i]);
}

inline std::uint64_t at(const Clock& c, std::size_t i) {
  return i < c.size() ? c[i] : 0;
}

inline bool overlaps(const SimAccess& a, const SimAccess& b) {
  return a.begin < b.end && b.begin < a.end;
}

inline SimAccess range(const void* p, std::size_t bytes, bool write) {
  const auto b = reinterpret_cast<std::uintptr_t>(p);
  return {b, b + bytes, write};
}

enum class AllocKind : std::uint8_t { device, pinned, registered };

/// The simulated device's one copy engine: an operation's bytes move while it holds the gate,
/// and of the operations waiting, one of the highest stream priority (CUDA's numbering: lower
/// is higher) enters first. This is the timing model behind the backend's loads-first rule:
/// a load queued behind a flood of stores waits for the operation running, not for the queue.
class ExecGate {
 public:
  /// Holds the gate for a scope (released if the operation throws).
  class Hold {
   public:
    Hold(ExecGate& gate, int priority) : gate_(gate) { gate_.enter(priority); }
    ~Hold() { gate_.leave(); }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    ExecGate& gate_;
  };

  void enter(int priority) {
    std::unique_lock lock(m_);
    const auto me = waiting_.insert(priority);
    cv_.wait(lock, [&] { return !busy_ && *waiting_.begin() == priority; });
    waiting_.erase(me);
    busy_ = true;
  }
  void leave() {
    {
      std::lock_guard lock(m_);
      busy_ = false;
    }
    cv_.notify_all();
  }
  /// Operations waiting to enter (for tests).
  std::size_t waiting() {
    std::lock_guard lock(m_);
    return waiting_.size();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::multiset<int> waiting_;
  bool busy_ = false;
};

inline std::atomic<std::uint64_t> next_instance{1};

}  // namespace sim

struct SimDevice::State {
  using Clock = sim::Clock;
  using AllocKind = sim::AllocKind;

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
    // The timing model (SimConfig::links 2): DMAs the operation makes, or a copy kernel.
    std::uint64_t dmas = 0;
    bool kernel_copy = false;
  };
  struct Stream {
    StreamHandle handle = 0;
    std::size_t index = 0;  // in clocks
    int device = 0;
    int priority = 0;  // stream_create's; the copy engine serves lower numbers first
    bool destroyed = false;
    bool stop = false;
    bool capturing = false;  // begin_capture .. end_capture (a test hook)
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
    bool captured = false;  // recorded on a capturing stream: a node of its graph
  };
  struct Alloc {
    std::size_t bytes = 0;
    AllocKind kind = AllocKind::device;
    int device = 0;    // a device allocation's device
    bool live = true;  // false once a free_async is queued (freed when it runs)
  };
  struct LogEntry {
    std::size_t stream;
    std::uint64_t seq;
    std::string name;
    std::vector<SimAccess> accesses;
  };

  SimConfig config;
  std::uint64_t instance = sim::next_instance.fetch_add(1);
  mutable std::mutex m;
  sim::ExecGate exec_gate;
  std::mutex links[2];  // SimConfig::links 2: host-to-device, device-to-host
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
  std::vector<std::string> ranges;  // profiler ranges pushed, in order
  std::size_t open_ranges = 0;
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
  /// Where [p, p + n) lies. Adjacent registrations (a host pool registered in chunks) join
  /// into one range for what a kernel or host_mapped sees (the memory is contiguous and all of
  /// it pinned and mapped), but not for a copy call: CUDA refuses a cudaMemcpy*Async whose
  /// host range crosses from one cudaHostRegister range into the next (seen on an H200).
  enum class Join { registrations, none };
  Where locate(std::uintptr_t p, std::size_t n, AllocKind* kind = nullptr,
               Join joining = Join::registrations) const {
    auto it = allocs.upper_bound(p);
    if (it != allocs.begin()) {
      auto prev = std::prev(it);
      if (p < prev->first + prev->second.bytes) {
        if (!prev->second.live) return Where::straddles;  // freed: not a valid range
        if (kind != nullptr) *kind = prev->second.kind;
        std::uintptr_t end = prev->first + prev->second.bytes;
        while (joining == Join::registrations && p + n > end &&
               prev->second.kind == AllocKind::registered) {
          const auto next = std::next(prev);
          if (next == allocs.end() || next->first != end || !next->second.live ||
              next->second.kind != AllocKind::registered) {
            break;
          }
          prev = next;
          end = prev->first + prev->second.bytes;
        }
        return p + n <= end ? Where::inside : Where::straddles;
      }
    }
    if (it != allocs.end() && it->first < p + n) return Where::straddles;
    return Where::outside;
  }
  /// A copy call's range that CUDA refuses at the call: part inside an allocation and part
  /// outside, or across two registrations.
  bool copy_straddles(std::uintptr_t p, std::size_t n) const {
    return locate(p, n, nullptr, Join::none) == Where::straddles;
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

  Stream* make_stream(int device, int priority = 0) {
    auto st = std::make_unique<Stream>();
    st->priority = priority;
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
    sim::join(st->vc, host_vc);
    if (st->vc.size() <= st->index) st->vc.resize(st->index + 1, 0);
    st->vc[st->index] = op.seq;
    op.vc = st->vc;
    st->ops.push_back(std::move(op));
    cv.notify_all();
    return st->enqueued;
  }

  void check_races(const Stream* st, const Op& op, const std::vector<SimAccess>& acc) {
    for (const LogEntry& e : log) {
      if (e.stream == st->index || sim::at(op.vc, e.stream) >= e.seq) continue;
      for (const SimAccess& a : acc) {
        for (const SimAccess& b : e.accesses) {
          if ((a.write || b.write) && sim::overlaps(a, b)) {
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
      if (sim::at(op.early_vc, e.stream) >= e.seq) continue;
      for (const SimAccess& a : op.early_reads) {
        for (const SimAccess& b : e.accesses) {
          if (b.write && sim::overlaps(a, b)) {
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
    // The copy engine's timing model sleeps for each operation's bytes: without this, Linux's
    // default timer slack (50 us) would add to every operation's time.
    if (config.copy_gbps > 0) (void)::prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
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
          std::uint64_t written = 0;  // for the copy engine's bandwidth (copy_gbps)
          const bool touches_memory = !acc.empty();
          for (const SimAccess& a : acc) {
            if (a.write) written += a.end - a.begin;
          }
          const LinkTime link = link_time(op, acc);
          record(st, op, std::move(acc));
          if (op.run) {
            lock.unlock();
            {
              // One operation's bytes move at a time: a race between streams is found by the
              // vector clocks above, never by a real data race in this process (so the
              // simulator is clean under ThreadSanitizer even when the program is not).
              // An operation that touches no memory (the engine's long kernel that a test
              // holds open) moves no bytes: it runs beside the copy engine, as on a GPU.
              std::optional<sim::ExecGate::Hold> exec;
              if (touches_memory) exec.emplace(exec_gate, config.honor_priority ? st->priority : 0);
              const auto start = std::chrono::steady_clock::now();
              op.run();
              if (config.copy_gbps > 0 && config.links == 1) {
                std::this_thread::sleep_until(
                    start + std::chrono::nanoseconds(static_cast<std::int64_t>(
                                static_cast<double>(written) / config.copy_gbps)));
              }
            }
            if (link.seconds > 0) {  // links 2: its bytes cross their direction's link
              const std::lock_guard held(links[link.direction]);
              std::this_thread::sleep_for(
                  std::chrono::nanoseconds(static_cast<std::int64_t>(link.seconds * 1e9)));
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

  /// SimConfig::links 2: how long an operation holds its direction's link (0 for one that moves
  /// no bytes between host and device). Caller holds m.
  struct LinkTime {
    double seconds = 0;
    int direction = 0;  // 0 host-to-device, 1 device-to-host
  };
  LinkTime link_time(const Op& op, const std::vector<SimAccess>& acc) const {
    if (config.links != 2 || config.copy_gbps <= 0) return {};
    auto on_host = [&](const SimAccess& a) {
      AllocKind kind{};
      return locate(a.begin, a.end - a.begin, &kind) != Where::inside || kind != AllocKind::device;
    };
    bool reads_host = false;
    for (const SimAccess& a : acc) reads_host = reads_host || (!a.write && on_host(a));
    std::uint64_t to_device = 0, to_host = 0;
    for (const SimAccess& a : acc) {
      if (!a.write) continue;
      if (on_host(a)) {
        to_host += a.end - a.begin;
      } else if (reads_host) {
        to_device += a.end - a.begin;
      }
    }
    const std::uint64_t bytes = std::max(to_device, to_host);
    if (bytes == 0) return {};
    const double gbps =
        op.kernel_copy && config.kernel_gbps > 0 ? config.kernel_gbps : config.copy_gbps;
    const double seconds = static_cast<double>(bytes) / (gbps * 1e9) +
                           static_cast<double>(op.dmas) * config.dma_op_us * 1e-6;
    return {seconds, to_host > to_device ? 1 : 0};
  }

  /// Host waits for `seq` on `st`, then knows what `vc` says.
  int host_wait(Stream* st, std::uint64_t seq, const Clock& vc, std::unique_lock<std::mutex>& lk) {
    cv.wait(lk, [&] { return st->completed >= seq; });
    sim::join(host_vc, vc);
    return poisoned ? sticky : dev::ok;
  }

  void purge(std::uintptr_t begin, std::uintptr_t end) {
    for (LogEntry& e : log) {
      std::erase_if(e.accesses, [&](const SimAccess& a) { return a.begin < end && begin < a.end; });
    }
  }

  void drain_all(std::unique_lock<std::mutex>& lk) {
    // streams may grow while we wait: index, not iterators
    for (std::size_t i = 0; i < streams.size(); ++i) {  // NOLINT(modernize-loop-convert)
      Stream* raw = streams[i].get();
      const std::uint64_t seq = raw->enqueued;
      const Clock vc = raw->vc;
      cv.wait(lk, [&] { return raw->completed >= seq; });
      sim::join(host_vc, vc);
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
    allocs[reinterpret_cast<std::uintptr_t>(p)] = {size, kind, current_device(), true};
    *ptr = p;
    return dev::ok;
  }
};

}  // namespace kvoffload
