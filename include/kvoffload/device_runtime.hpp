#pragma once

// The seam between the CUDA backend's logic and a device: every stream, event, copy, kernel
// launch and allocation the backend makes goes through a DeviceRuntime. Two implementations:
// cuda_runtime() calls the CUDA runtime (a CUDA build only), and SimDevice (sim_device.hpp)
// runs the same operations on the CPU with CUDA's ordering rules, so the backend's
// orchestration is tested on machines without a GPU.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kvoffload/export.hpp"
#include "kvoffload/types.hpp"

namespace kvoffload {

struct CopyDescriptor;
namespace detail {
struct DevicePiece;
struct DeviceJobLayout;
}  // namespace detail

/// Status codes of a DeviceRuntime: cudaError_t values (the ones the backend tells apart).
namespace dev {
inline constexpr int ok = 0;
inline constexpr int invalid_value = 1;
inline constexpr int memory_allocation = 2;
inline constexpr int invalid_device = 101;
inline constexpr int invalid_resource_handle = 400;
inline constexpr int not_ready = 600;
inline constexpr int illegal_address = 700;
inline constexpr int not_supported = 801;
inline constexpr int unknown = 999;
/// cudaErrorStreamCapture* (900-908): a call refused because a graph capture is under way (a
/// query or a synchronize while another thread captures in global mode, say). Not a fault:
/// work already queued still runs; ask again after the capture.
[[nodiscard]] inline constexpr bool capture_status(int status) {
  return status >= 900 && status <= 908;
}
/// A driver-API status (CUresult) r that has no runtime twin is reported as driver_base + r,
/// so describe() names it with the driver's own names.
inline constexpr int driver_base = 1 << 20;
}  // namespace dev

/// cudaStreamPerThread's handle value: it names a different stream on every host thread, so
/// the backend refuses it as a compute stream.
inline constexpr StreamHandle per_thread_default_stream = 2;

/// The GPU compaction's arguments (all pointers device memory except where said).
struct CompactArgs {
  const std::int32_t* ids = nullptr;  ///< n GPU block ids, null blocks (0) included
  std::int64_t n = 0;
  const std::int64_t* offsets = nullptr;  ///< groups + 1: group g at [offsets[g], offsets[g+1])
  int groups = 0;
  const std::int64_t* expected = nullptr;  ///< groups: the job's group_sizes
  const std::int64_t* max_id = nullptr;    ///< groups, or null: ids above it are a mismatch
  std::int32_t* out = nullptr;             ///< n: the non-null ids, in order
  std::int64_t* count = nullptr;           ///< 1: how many
  std::int64_t* group_counts = nullptr;    ///< groups: non-null ids per group
  int* mismatch = nullptr;  ///< 1: set to 1 if a count differs or an id is out of range, else 0
  void* temp = nullptr;
  std::size_t temp_bytes = 0;
};

/// All calls are thread-safe and never throw; they return a dev:: status (a cudaError_t).
/// Streams are non-blocking (they never order against the legacy stream implicitly).
class KVOFFLOAD_EXPORT DeviceRuntime {
 public:
  virtual ~DeviceRuntime();

  [[nodiscard]] virtual int device_count() noexcept = 0;
  /// The calling thread's current device (0 when it has none, as CUDA says).
  virtual int get_device(int* device) noexcept = 0;
  /// Makes `device` current for the calling thread, creating its primary context.
  virtual int set_device(int device) noexcept = 0;
  /// Pushes `device`'s primary context onto the calling thread's context stack (cuCtxPush),
  /// and pops it again: a library switching devices for a call this way leaves the thread
  /// exactly as it found it, and never creates a context on a device the thread never used
  /// (set_device to restore device 0 would, on a thread that had no context at all).
  virtual int push_device(int device) noexcept = 0;
  virtual int pop_device() noexcept = 0;
  /// Whether `device`'s primary context exists (in this process), without creating it.
  virtual int primary_context_active(int device, bool* active) noexcept = 0;
  virtual int stream_priority_range(int* least, int* greatest) noexcept = 0;
  /// Whether `device` can use registered host pointers directly (the kernel modes need it).
  virtual int can_map_host_memory(int device, bool* yes) noexcept = 0;
  /// Whether [ptr, ptr + bytes) is registered (or allocated) pinned memory that kernels on the
  /// current device reach at the same address.
  virtual int host_mapped(const void* ptr, std::size_t bytes, bool* yes) noexcept = 0;
  /// Page-locks [ptr, ptr + bytes) of ordinary host memory for every device and maps it into
  /// their address spaces (cudaHostRegister, Portable | Mapped), in the current context. A
  /// failure leaves nothing registered and no error pending for the next call.
  virtual int host_register(void* ptr, std::size_t bytes) noexcept = 0;
  /// Undoes host_register(ptr) (cudaHostUnregister); ptr is the start of one registration.
  virtual int host_unregister(void* ptr) noexcept = 0;

  /// Streams and events belong to the current device.
  virtual int stream_create(int priority, StreamHandle* stream) noexcept = 0;
  virtual int stream_destroy(StreamHandle stream) noexcept = 0;
  virtual int stream_synchronize(StreamHandle stream) noexcept = 0;
  /// The device `stream` belongs to (cudaStreamGetDevice); the legacy stream 0 is the current
  /// device's.
  virtual int stream_device(StreamHandle stream, int* device) noexcept = 0;
  /// Whether `stream` is capturing a CUDA graph (cudaStreamIsCapturing: active or invalidated,
  /// or the legacy stream while a blocking stream captures). Work ordered after a capturing
  /// stream (an event recorded on it and waited for elsewhere) joins the capture instead of
  /// running.
  virtual int stream_capturing(StreamHandle stream, bool* capturing) noexcept = 0;
  /// The device whose memory holds `ptr` (cudaPointerGetAttributes: device or managed
  /// memory), -1 for host memory (pinned or not), -2 when the query fails (memory CUDA cannot
  /// place).
  virtual int pointer_device(const void* ptr, int* device) noexcept = 0;
  virtual int event_create(EventHandle* event) noexcept = 0;
  virtual int event_destroy(EventHandle event) noexcept = 0;
  /// Captures the work queued on `stream` so far (stream and event of one device).
  virtual int event_record(EventHandle event, StreamHandle stream) noexcept = 0;
  /// Later work on `stream` waits for the work the event captured at this call.
  virtual int stream_wait_event(StreamHandle stream, EventHandle event) noexcept = 0;
  /// ok when the captured work is done, not_ready before (never left as a pending error).
  virtual int event_query(EventHandle event) noexcept = 0;
  virtual int event_synchronize(EventHandle event) noexcept = 0;
  /// Waits for every stream of the current device.
  virtual int device_synchronize() noexcept = 0;

  virtual int malloc_device(void** ptr, std::size_t bytes) noexcept = 0;
  virtual int free_device(void* ptr) noexcept = 0;
  /// Pinned host memory, mapped into the device's address space.
  virtual int malloc_host(void** ptr, std::size_t bytes) noexcept = 0;
  virtual int free_host(void* ptr) noexcept = 0;
  /// Stream-ordered device allocations.
  virtual int malloc_async(void** ptr, std::size_t bytes, StreamHandle stream) noexcept = 0;
  virtual int free_async(void* ptr, StreamHandle stream) noexcept = 0;

  virtual int memcpy_async(void* dst, const void* src, std::size_t bytes,
                           StreamHandle stream) noexcept = 0;
  [[nodiscard]] virtual bool batch_available() noexcept = 0;
  /// One batched copy (cuMemcpyBatchAsync). Sources are read in stream order when
  /// `src_in_stream_order`; else at any time after the call, even before work queued earlier
  /// on the stream has run (for pinned host blocks nobody writes). On failure *fail_index names
  /// the copy.
  virtual int memcpy_batch_async(const CopyDescriptor* copies, std::size_t count,
                                 bool src_in_stream_order, StreamHandle stream,
                                 std::size_t* fail_index) noexcept = 0;

  /// The copy kernel over a device-resident piece array.
  virtual int launch_copy_pieces(const detail::DevicePiece* pieces, std::uint64_t count, int ctas,
                                 int threads, StreamHandle stream) noexcept = 0;
  /// The device-table path's piece builder (detail::build_piece per piece); writes empty pieces
  /// when *mismatch is set.
  virtual int launch_build_pieces(const detail::DeviceJobLayout& layout, const std::int32_t* ids,
                                  const std::int64_t* count, const std::int64_t* group_counts,
                                  const std::int32_t* host_ids, const int* mismatch,
                                  detail::DevicePiece* pieces, std::uint64_t max_pieces, int ctas,
                                  int threads, StreamHandle stream) noexcept = 0;
  virtual int compaction_temp_bytes(std::int64_t max_ids, int max_groups,
                                    std::size_t* bytes) noexcept = 0;
  virtual int launch_compact(const CompactArgs& args, StreamHandle stream) noexcept = 0;

  /// Returns and clears the calling thread's last error.
  virtual int get_last_error() noexcept = 0;
  /// "cudaErrorInvalidValue (invalid argument)".
  [[nodiscard]] virtual std::string describe(int status) const = 0;
  /// The backend is about to read (or write) host memory that device work may use: a
  /// simulated device checks that no queued or unordered device work still uses it. The CUDA
  /// runtime does nothing.
  virtual void host_access(const void* /*ptr*/, std::size_t /*bytes*/, bool /*write*/) noexcept {}
  /// Names the host work from now until the matching range_pop for profilers (an NVTX range
  /// in Nsight Systems); ranges nest like a stack. Default: nothing.
  virtual void range_push(const char* /*name*/) noexcept {}
  virtual void range_pop() noexcept {}
};

/// The CUDA runtime as a DeviceRuntime (one shared instance). Throws cuda_error in a build
/// without CUDA.
KVOFFLOAD_EXPORT std::shared_ptr<DeviceRuntime> cuda_runtime();

}  // namespace kvoffload
