#pragma once

// A simulated CUDA device on the CPU, for testing the CUDA backend (and an engine's use of it)
// on machines without a GPU. Each stream is a FIFO run by its own thread with seeded random
// delays; events and cross-stream waits follow CUDA's rules (an event captures the work queued
// when it is recorded; a wait orders only the work queued after it); "device memory" is host
// memory; the copy kernels and the compaction run their __host__ __device__ bodies on the CPU.
// It reports what a real device punishes or silently gets wrong, as violations():
//   - an operation that reads or writes bytes that an unordered operation on another stream
//     writes (or writes bytes it reads): a data race between streams (vector clocks);
//   - a host access (host_access) to bytes that queued or unordered device work still uses;
//   - use of a destroyed stream or event, or a stream and event of different devices;
//   - a batch copy with source order "any" whose sources another operation writes after the
//     host last synchronized with it (CUDA may read them at the call);
//   - a kernel touching memory that is neither device memory nor mapped pinned host memory,
//     which, as on a GPU, also poisons the context: every later call fails with
//     illegal_address.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvoffload/device_runtime.hpp"
#include "kvoffload/export.hpp"

namespace kvoffload {

struct SimConfig {
  std::uint64_t seed = 1;
  int devices = 1;
  int max_delay_us = 40;        ///< each operation waits a random 0..max_delay_us first
  bool batch_available = true;  ///< cuMemcpyBatchAsync present
  bool map_host_memory = true;  ///< registered host memory is device-accessible
  /// The copy engine serves waiting operations by stream priority (false: in no particular
  /// order; kvoffload-bench loads compares both).
  bool honor_priority = true;
  /// The copy engine's bandwidth in GB/s: an operation holds it at least (bytes written) /
  /// copy_gbps, so timing follows bytes rather than the simulator's own bookkeeping (0: as
  /// fast as memcpy, the tests' setting).
  double copy_gbps = 0;
  /// The timing model's shape (with copy_gbps): 1, one copy engine for everything (the
  /// operation holds it while its bytes move); 2, a link per direction, as a GPU's copy engines
  /// over full-duplex PCIe: host-to-device and device-to-host bytes move at once, each at
  /// copy_gbps (device-to-device bytes are free), so two-way cost models can be tested.
  int links = 1;
  /// With links 2: what a copy kernel reaches over the link (0: copy_gbps), and the fixed cost
  /// of each DMA (a memcpy, or each copy of a batch), which makes small DMAs slow.
  double kernel_gbps = 0;
  double dma_op_us = 0;
};

/// A byte range an operation touches.
struct SimAccess {
  std::uintptr_t begin = 0;
  std::uintptr_t end = 0;
  bool write = false;
};

/// Thread-safe, like the CUDA runtime. Destruction drains every stream.
class KVOFFLOAD_EXPORT SimDevice final : public DeviceRuntime {
 public:
  explicit SimDevice(const SimConfig& config = {});
  ~SimDevice() override;
  SimDevice(const SimDevice&) = delete;
  SimDevice& operator=(const SimDevice&) = delete;

  // ---- DeviceRuntime ----
  int device_count() noexcept override;
  int get_device(int* device) noexcept override;
  int set_device(int device) noexcept override;
  int push_device(int device) noexcept override;
  int pop_device() noexcept override;
  /// Created by set_device, push_device, or a call on a thread with no context (which CUDA
  /// runs on device 0).
  int primary_context_active(int device, bool* active) noexcept override;
  int stream_priority_range(int* least, int* greatest) noexcept override;
  int can_map_host_memory(int device, bool* yes) noexcept override;
  int host_mapped(const void* ptr, std::size_t bytes, bool* yes) noexcept override;
  /// Marks host memory as pinned (and mapped if config.map_host_memory).
  int host_register(void* ptr, std::size_t bytes) noexcept override;
  int host_unregister(void* ptr) noexcept override;
  int stream_create(int priority, StreamHandle* stream) noexcept override;
  int stream_destroy(StreamHandle stream) noexcept override;
  int stream_synchronize(StreamHandle stream) noexcept override;
  int stream_device(StreamHandle stream, int* device) noexcept override;
  int stream_capturing(StreamHandle stream, bool* capturing) noexcept override;
  void range_push(const char* name) noexcept override;
  void range_pop() noexcept override;
  int pointer_device(const void* ptr, int* device) noexcept override;
  int event_create(EventHandle* event) noexcept override;
  int event_destroy(EventHandle event) noexcept override;
  int event_record(EventHandle event, StreamHandle stream) noexcept override;
  int stream_wait_event(StreamHandle stream, EventHandle event) noexcept override;
  int event_query(EventHandle event) noexcept override;
  int event_synchronize(EventHandle event) noexcept override;
  int device_synchronize() noexcept override;
  int malloc_device(void** ptr, std::size_t bytes) noexcept override;
  int free_device(void* ptr) noexcept override;
  int malloc_host(void** ptr, std::size_t bytes) noexcept override;
  int free_host(void* ptr) noexcept override;
  int malloc_async(void** ptr, std::size_t bytes, StreamHandle stream) noexcept override;
  int free_async(void* ptr, StreamHandle stream) noexcept override;
  int memcpy_async(void* dst, const void* src, std::size_t bytes,
                   StreamHandle stream) noexcept override;
  bool batch_available() noexcept override;
  int memcpy_batch_async(const CopyDescriptor* copies, std::size_t count, bool src_in_stream_order,
                         StreamHandle stream, std::size_t* fail_index) noexcept override;
  int launch_copy_pieces(const detail::DevicePiece* pieces, std::uint64_t count, int ctas,
                         int threads, StreamHandle stream) noexcept override;
  int launch_build_pieces(const detail::DeviceJobLayout& layout, const std::int32_t* ids,
                          const std::int64_t* count, const std::int64_t* group_counts,
                          const std::int32_t* host_ids, const int* mismatch,
                          detail::DevicePiece* pieces, std::uint64_t max_pieces, int ctas,
                          int threads, StreamHandle stream) noexcept override;
  int compaction_temp_bytes(std::int64_t max_ids, int max_groups,
                            std::size_t* bytes) noexcept override;
  int launch_compact(const CompactArgs& args, StreamHandle stream) noexcept override;
  int get_last_error() noexcept override;
  std::string describe(int status) const override;
  void host_access(const void* ptr, std::size_t bytes, bool write) noexcept override;

  // ---- test hooks ----
  /// A simulated kernel (the engine's forward pass, say): `run` executes on the stream's
  /// thread in stream order; `accesses` are checked for races like any operation's. With no
  /// accesses it may block (a test holding the engine's work open): it runs outside the copy
  /// engine, so other streams go on.
  int launch(StreamHandle stream, std::string name, std::vector<SimAccess> accesses,
             std::function<void()> run);
  /// The `after`+1-th next call named `call` ("memcpy_async", "malloc_host", "event_record",
  /// "launch_copy_pieces", ...) fails synchronously with `status`.
  void inject_failure(const std::string& call, int status, int after = 0);
  /// The next describe() throws std::bad_alloc: an allocation failing on a caller's error
  /// path (formatting a message), which no status code reports.
  void inject_throw_in_describe();
  /// Everything reported so far (see the file comment); empty for a correct program.
  [[nodiscard]] std::vector<std::string> violations() const;
  /// Live streams, events and allocations the program created (leak checks).
  [[nodiscard]] std::size_t live_streams() const;
  [[nodiscard]] std::size_t live_events() const;
  [[nodiscard]] std::size_t live_allocations() const;
  /// Host ranges registered (host_register) and not unregistered.
  [[nodiscard]] std::size_t live_registrations() const;
  /// A graph capture on `stream` (cudaStreamBeginCapture .. EndCapture): stream_capturing
  /// says so, and a wait on another stream for an event recorded on it meanwhile is a
  /// violation (it would join the capture). The stream's work still runs.
  int begin_capture(StreamHandle stream);
  int end_capture(StreamHandle stream);
  /// The names of the profiler ranges pushed so far, in order, and how many are still open.
  [[nodiscard]] std::vector<std::string> ranges() const;
  [[nodiscard]] std::size_t open_ranges() const;
  /// Whether a fault poisoned the context.
  [[nodiscard]] bool poisoned() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace kvoffload
