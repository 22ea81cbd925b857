#include "kvoffload/host_backend.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common/expects.hpp"
#include "transfer/copy_task_queue.hpp"

namespace kvoffload {

struct HostBackend::Job {
  Ticket ticket = 0;
  CopyPlan plan;
  std::size_t tasks_left = 0;  // guarded by mutex_
  bool done = false;           // guarded by mutex_
  bool ok = true;
  std::string error;
  std::chrono::steady_clock::time_point start;
  double seconds = 0;
};

namespace {

/// Pieces from this size are copied with streaming (non-temporal) stores.
constexpr std::size_t kStreamMin = 4096;

/// A piece's copy. KV pages moved here are not read back by this core soon, so large pieces
/// use streaming stores: they skip the read-for-ownership of each destination line and leave
/// the caches alone (glibc's memcpy does so only for copies of many MiB; issue 30 part 3).
/// The caller fences (copy_done) before the job is reported.
void copy_piece(std::uintptr_t dst, std::uintptr_t src, std::size_t n) {
#if defined(__SSE2__)
  if (n >= kStreamMin) {
    auto* d = reinterpret_cast<std::uint8_t*>(dst);
    const auto* s = reinterpret_cast<const std::uint8_t*>(src);
    // To 16 bytes (what _mm_stream_si128 needs). Aligning to a cache line instead measured
    // slower for 4 KiB pieces 16 bytes past one (the copy bench's buffers: 0.80 of the all-core
    // ceiling against 0.92): two small memcpys per piece cost more than split lines.
    const std::size_t head = std::min<std::size_t>(n, (16 - (dst & 15)) & 15);
    std::memcpy(d, s, head);
    std::size_t i = head;
    for (; i + 64 <= n; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    std::memcpy(d + i, s + i, n - i);
    return;
  }
#endif
  std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
}

/// Orders a task's streaming stores before its job is reported done (they are weakly
/// ordered; the lock that publishes "done" does not order them).
void copy_done() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

/// Why a plan cannot run, or empty.
std::string invalid_descriptor(const CopyPlan& plan) {
  for (std::size_t i = 0; i < plan.descriptors.size(); ++i) {
    const CopyDescriptor& d = plan.descriptors[i];
    if (d.bytes == 0) continue;
    if (d.src == 0 || d.dst == 0) {
      return fmt::format("job {}: descriptor {} has a null address", plan.job, i);
    }
    if (d.src < d.dst + d.bytes && d.dst < d.src + d.bytes) {
      return fmt::format("job {}: descriptor {} copies between overlapping ranges", plan.job, i);
    }
  }
  return {};
}

}  // namespace

HostBackend::HostBackend(const HostBackendConfig& config)
    : config_(config), tasks_(std::make_unique<detail::CopyTaskQueue<Task>>()) {
  KVOFFLOAD_EXPECTS(config.threads >= 0, "threads must not be negative, got {}", config.threads);
  KVOFFLOAD_EXPECTS(config.task_bytes >= 4096, "task_bytes must be at least 4096, got {}",
                    config.task_bytes);
  const int n = config.threads > 0
                    ? config.threads
                    : static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  workers_.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) workers_.emplace_back([this] { run_worker(); });
}

HostBackend::~HostBackend() {
  shutdown(false);
}

Ticket HostBackend::submit(CopyPlan plan) {
  auto job = std::make_unique<Job>();
  job->plan = std::move(plan);
  job->start = std::chrono::steady_clock::now();
  std::string invalid = invalid_descriptor(job->plan);

  std::lock_guard lock(mutex_);
  job->ticket = next_ticket_++;
  Job* j = job.get();
  const auto dir = static_cast<std::size_t>(j->plan.kind);
  in_order_[dir].push_back(std::move(job));
  if (stopping_ || !invalid.empty()) {
    j->ok = false;
    j->error = stopping_ ? "backend is shut down" : std::move(invalid);
    j->done = true;
    job_done_.notify_all();
    return j->ticket;
  }
  // Cut into tasks of about task_bytes: whole descriptors grouped, big ones sliced.
  const std::vector<CopyDescriptor>& d = j->plan.descriptors;
  const std::uint64_t target = config_.task_bytes;
  // Without loads_first every task joins the one (store) queue: submission order.
  const JobKind queue_kind = config_.loads_first ? j->plan.kind : JobKind::store;
  std::size_t i = 0;
  while (i < d.size()) {
    if (d[i].bytes >= target) {
      for (std::uint64_t off = 0; off < d[i].bytes; off += target) {
        tasks_->push(queue_kind, {j, i, i + 1, off, std::min(target, d[i].bytes - off)});
        ++j->tasks_left;
      }
      ++i;
      continue;
    }
    std::size_t end = i;
    std::uint64_t bytes = 0;
    while (end < d.size() && d[end].bytes < target && bytes + d[end].bytes <= target) {
      bytes += d[end++].bytes;
    }
    if (end == i) ++end;
    tasks_->push(queue_kind, {j, i, end, 0, 0});
    ++j->tasks_left;
    i = end;
  }
  if (j->tasks_left == 0) {
    j->done = true;
    job_done_.notify_all();
  } else {
    work_ready_.notify_all();
  }
  return j->ticket;
}

void HostBackend::run_worker() {
  for (;;) {
    Task task{};
    {
      std::unique_lock lock(mutex_);
      work_ready_.wait(lock, [this] { return stopping_ || !tasks_->empty(); });
      std::optional<Task> next = tasks_->pop();  // loads first
      if (!next) return;                         // stopping, nothing left
      task = *next;
    }
    const std::vector<CopyDescriptor>& d = task.job->plan.descriptors;
    if (task.last == task.first + 1 && task.length > 0) {
      const CopyDescriptor& c = d[task.first];
      copy_piece(c.dst + task.offset, c.src + task.offset, task.length);
    } else {
      for (std::size_t k = task.first; k < task.last; ++k) {
        copy_piece(d[k].dst, d[k].src, d[k].bytes);
      }
    }
    copy_done();
    finish_task(*task.job);
  }
}

void HostBackend::finish_task(Job& job) {
  std::lock_guard lock(mutex_);
  if (--job.tasks_left == 0) {
    job.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - job.start).count();
    job.done = true;
    job_done_.notify_all();
  }
}

void HostBackend::poll(std::vector<BackendResult>& finished) {
  std::lock_guard lock(mutex_);
  for (auto& queue : in_order_) {
    while (!queue.empty() && queue.front()->done) {
      Job& j = *queue.front();
      finished.push_back({j.ticket, j.plan.job, j.plan.kind, j.ok, std::move(j.error),
                          j.ok ? j.plan.total_bytes : 0, j.seconds});
      queue.pop_front();
    }
  }
}

void HostBackend::wait(Ticket ticket) {
  std::unique_lock lock(mutex_);
  job_done_.wait(lock, [&] {
    for (const auto& queue : in_order_) {
      for (const auto& j : queue) {
        if (j->ticket == ticket) return j->done;
      }
    }
    return true;  // already polled, or never issued
  });
}

void HostBackend::shutdown(bool drain) {
  {
    std::unique_lock lock(mutex_);
    if (drain) {
      job_done_.wait(lock, [this] {
        return std::all_of(std::begin(in_order_), std::end(in_order_), [](const auto& q) {
          return std::all_of(q.begin(), q.end(), [](const auto& j) { return j->done; });
        });
      });
    }
    stopping_ = true;
    // Tasks still queued never run: their plans fail.
    tasks_->drain([](const Task& t) {
      t.job->ok = false;
      t.job->error = "cancelled: the backend was shut down";
      if (--t.job->tasks_left == 0) t.job->done = true;
    });
  }
  work_ready_.notify_all();
  for (std::thread& w : workers_) {
    if (w.joinable()) w.join();
  }
  job_done_.notify_all();
}

}  // namespace kvoffload
