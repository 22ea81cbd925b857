// The CUDA runtime behind the DeviceRuntime seam: one call per method, statuses passed
// through as cudaError_t values. Host code (compiled by the C++ compiler against cudart); the
// kernels and CUB live in copy_kernels.cu and compaction.cu.

#include <cuda.h>  // driver types for cuMemcpyBatchAsync, resolved at run time
#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>  // header-only: no library to link, a no-op without a profiler

#include <array>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "compaction.cuh"
#include "copy_kernels.cuh"
#include "kvoffload/copy_planner.hpp"
#include "kvoffload/device_runtime.hpp"

namespace kvoffload {
namespace {

static_assert(dev::ok == cudaSuccess && dev::invalid_value == cudaErrorInvalidValue &&
              dev::memory_allocation == cudaErrorMemoryAllocation &&
              dev::invalid_device == cudaErrorInvalidDevice &&
              dev::invalid_resource_handle == cudaErrorInvalidResourceHandle &&
              dev::not_ready == cudaErrorNotReady &&
              dev::illegal_address == cudaErrorIllegalAddress &&
              dev::not_supported == cudaErrorNotSupported && dev::unknown == cudaErrorUnknown);
// cudaStreamPerThread is ((cudaStream_t)0x2) in driver_types.h.
static_assert(per_thread_default_stream == 0x2);
static_assert(sizeof(CopyDescriptor) == sizeof(detail::DevicePiece));

int I(cudaError_t e) {
  return static_cast<int>(e);
}
static_assert(CUDA_ERROR_INVALID_VALUE == 1 && CUDA_ERROR_OUT_OF_MEMORY == 2 &&
              CUDA_ERROR_INVALID_HANDLE == 400 && CUDA_ERROR_ILLEGAL_ADDRESS == 700 &&
              CUDA_ERROR_NOT_SUPPORTED == 801);

// cuMemcpyBatchAsync as the 12.8 driver ABI defines it (with failIdx): requesting that version
// keeps a build with CUDA 13 headers working on any 12.8+ driver.
using BatchFn = CUresult (*)(CUdeviceptr*, CUdeviceptr*, std::size_t*, std::size_t,
                             CUmemcpyAttributes*, std::size_t*, std::size_t, std::size_t*,
                             CUstream);

/// A driver function at the ABI of driver version `version` (the runtime resolves it; the
/// library never links libcuda itself), or null.
template <class Fn>
Fn resolve(const char* name, int version) noexcept {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &status) !=
          cudaSuccess ||
      status != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<Fn>(fn);
}

/// The driver functions the runtime API has no twin for.
struct Driver {
  using DeviceGet = CUresult (*)(CUdevice*, int);
  using PrimaryRetain = CUresult (*)(CUcontext*, CUdevice);
  using Push = CUresult (*)(CUcontext);
  using Pop = CUresult (*)(CUcontext*);
  using ErrorText = CUresult (*)(CUresult, const char**);
  using PrimaryState = CUresult (*)(CUdevice, unsigned*, int*);
  DeviceGet device_get = resolve<DeviceGet>("cuDeviceGet", 12000);
  PrimaryRetain primary_retain = resolve<PrimaryRetain>("cuDevicePrimaryCtxRetain", 12000);
  Push push = resolve<Push>("cuCtxPushCurrent", 12000);
  Pop pop = resolve<Pop>("cuCtxPopCurrent", 12000);
  ErrorText error_name = resolve<ErrorText>("cuGetErrorName", 12000);
  PrimaryState primary_state = resolve<PrimaryState>("cuDevicePrimaryCtxGetState", 12000);
  ErrorText error_string = resolve<ErrorText>("cuGetErrorString", 12000);
  [[nodiscard]] bool can_push() const noexcept {
    return device_get != nullptr && primary_retain != nullptr && push != nullptr && pop != nullptr;
  }
};

/// A CUresult as a DeviceRuntime status: the values CUresult and cudaError_t share, else
/// dev::driver_base + r (describe names those with the driver's names).
int from_driver(CUresult r) noexcept {
  switch (r) {
    case CUDA_SUCCESS: return I(cudaSuccess);
    case CUDA_ERROR_INVALID_VALUE: return I(cudaErrorInvalidValue);
    case CUDA_ERROR_OUT_OF_MEMORY: return I(cudaErrorMemoryAllocation);
    case CUDA_ERROR_INVALID_HANDLE: return I(cudaErrorInvalidResourceHandle);
    case CUDA_ERROR_ILLEGAL_ADDRESS: return I(cudaErrorIllegalAddress);
    case CUDA_ERROR_NOT_SUPPORTED: return I(cudaErrorNotSupported);
    default: return dev::driver_base + static_cast<int>(r);
  }
}

cudaStream_t S(StreamHandle h) {
  return reinterpret_cast<cudaStream_t>(h);
}
cudaEvent_t E(EventHandle h) {
  return reinterpret_cast<cudaEvent_t>(h);
}

class CudaRuntime final : public DeviceRuntime {
 public:
  int device_count() noexcept override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return count;
  }
  int get_device(int* device) noexcept override { return I(cudaGetDevice(device)); }
  int set_device(int device) noexcept override { return I(cudaSetDevice(device)); }
  int push_device(int device) noexcept override {
    const Driver& d = driver();
    if (!d.can_push()) {
      // No driver entry points (never seen): the old way, which may leave a context on the
      // device the thread had before.
      int previous = 0;
      cudaError_t e = cudaGetDevice(&previous);
      auto& stack = fallback_stack();
      if (e == cudaSuccess && stack.size() == stack.capacity()) {
        try {
          stack.reserve(2 * stack.size() + 4);
        } catch (...) {
          return I(cudaErrorMemoryAllocation);
        }
      }
      if (e == cudaSuccess) e = cudaSetDevice(device);
      if (e == cudaSuccess) stack.push_back(previous);  // only what pop_device will undo
      return I(e);
    }
    CUcontext ctx = nullptr;
    {
      // Retained once per device for the process's life: the runtime shares the primary
      // context, so the backend's streams and events live in it.
      std::lock_guard lock(primary_mutex_);
      if (device < 0 || device >= static_cast<int>(primary_.size())) {
        return I(cudaErrorInvalidDevice);
      }
      ctx = primary_[static_cast<std::size_t>(device)];
      if (ctx == nullptr) {
        CUdevice dev = 0;
        CUresult r = d.device_get(&dev, device);
        if (r == CUDA_SUCCESS) r = d.primary_retain(&ctx, dev);
        if (r != CUDA_SUCCESS) return from_driver(r);
        primary_[static_cast<std::size_t>(device)] = ctx;
      }
    }
    return from_driver(d.push(ctx));
  }
  int primary_context_active(int device, bool* active) noexcept override {
    const Driver& d = driver();
    if (d.device_get == nullptr || d.primary_state == nullptr) return I(cudaErrorNotSupported);
    CUdevice dev = 0;
    unsigned flags = 0;
    int on = 0;
    CUresult r = d.device_get(&dev, device);
    if (r == CUDA_SUCCESS) r = d.primary_state(dev, &flags, &on);
    *active = on != 0;
    return from_driver(r);
  }
  int pop_device() noexcept override {
    const Driver& d = driver();
    if (!d.can_push()) {
      auto& stack = fallback_stack();
      if (stack.empty()) return I(cudaErrorInvalidValue);
      const int previous = stack.back();
      stack.pop_back();
      return I(cudaSetDevice(previous));
    }
    CUcontext ctx = nullptr;
    return from_driver(d.pop(&ctx));
  }
  int stream_priority_range(int* least, int* greatest) noexcept override {
    return I(cudaDeviceGetStreamPriorityRange(least, greatest));
  }
  int can_map_host_memory(int device, bool* yes) noexcept override {
    int v = 0;
    const cudaError_t e =
        cudaDeviceGetAttribute(&v, cudaDevAttrCanUseHostPointerForRegisteredMem, device);
    *yes = e == cudaSuccess && v == 1;
    return I(e);
  }
  int host_register(void* ptr, std::size_t bytes) noexcept override {
    const cudaError_t e =
        cudaHostRegister(ptr, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (e != cudaSuccess) (void)cudaGetLastError();  // not left for the next call to find
    return I(e);
  }
  int host_unregister(void* ptr) noexcept override {
    const cudaError_t e = cudaHostUnregister(ptr);
    if (e != cudaSuccess) (void)cudaGetLastError();
    return I(e);
  }
  int host_mapped(const void* ptr, std::size_t bytes, bool* yes) noexcept override {
    *yes = false;
    if (bytes == 0) return I(cudaSuccess);
    // Both ends must be pinned host memory whose device pointer is the host pointer itself
    // (registered with cudaHostRegisterMapped on a system with unified addressing).
    for (const void* p :
         {ptr, static_cast<const void*>(static_cast<const char*>(ptr) + bytes - 1)}) {
      cudaPointerAttributes attr{};
      if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return I(cudaSuccess);
      }
      if (attr.type != cudaMemoryTypeHost) return I(cudaSuccess);
      void* device_ptr = nullptr;
      if (cudaHostGetDevicePointer(&device_ptr, const_cast<void*>(p), 0) != cudaSuccess) {
        (void)cudaGetLastError();
        return I(cudaSuccess);
      }
      if (device_ptr != p) return I(cudaSuccess);
    }
    *yes = true;
    return I(cudaSuccess);
  }
  int stream_create(int priority, StreamHandle* stream) noexcept override {
    cudaStream_t s = nullptr;
    const cudaError_t e = cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority);
    *stream = reinterpret_cast<StreamHandle>(s);
    return I(e);
  }
  int stream_destroy(StreamHandle stream) noexcept override {
    return I(cudaStreamDestroy(S(stream)));
  }
  int stream_synchronize(StreamHandle stream) noexcept override {
    return I(cudaStreamSynchronize(S(stream)));
  }
  int stream_device(StreamHandle stream, int* device) noexcept override {
    return I(cudaStreamGetDevice(S(stream), device));
  }
  void range_push(const char* name) noexcept override { (void)nvtxRangePushA(name); }
  void range_pop() noexcept override { (void)nvtxRangePop(); }
  int stream_capturing(StreamHandle stream, bool* capturing) noexcept override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t e = cudaStreamIsCapturing(S(stream), &status);
    if (e == cudaErrorStreamCaptureImplicit) {  // the legacy stream, a blocking stream capturing
      (void)cudaGetLastError();
      *capturing = true;
      return I(cudaSuccess);
    }
    *capturing = e == cudaSuccess && status != cudaStreamCaptureStatusNone;
    return I(e);
  }
  int pointer_device(const void* ptr, int* device) noexcept override {
    *device = -1;
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
      (void)cudaGetLastError();  // memory CUDA cannot place
      *device = -2;
      return I(cudaSuccess);
    }
    if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) {
      *device = attr.device;
    }
    return I(cudaSuccess);
  }
  int event_create(EventHandle* event) noexcept override {
    cudaEvent_t ev = nullptr;
    const cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    *event = reinterpret_cast<EventHandle>(ev);
    return I(e);
  }
  int event_destroy(EventHandle event) noexcept override { return I(cudaEventDestroy(E(event))); }
  int event_record(EventHandle event, StreamHandle stream) noexcept override {
    return I(cudaEventRecord(E(event), S(stream)));
  }
  int stream_wait_event(StreamHandle stream, EventHandle event) noexcept override {
    return I(cudaStreamWaitEvent(S(stream), E(event), cudaEventWaitDefault));
  }
  int event_query(EventHandle event) noexcept override {
    const cudaError_t e = cudaEventQuery(E(event));
    // Not an error, but do not leave it for the next launch check to find.
    if (e == cudaErrorNotReady) (void)cudaGetLastError();
    return I(e);
  }
  int event_synchronize(EventHandle event) noexcept override {
    return I(cudaEventSynchronize(E(event)));
  }
  int device_synchronize() noexcept override { return I(cudaDeviceSynchronize()); }
  int malloc_device(void** ptr, std::size_t bytes) noexcept override {
    return I(cudaMalloc(ptr, bytes));
  }
  int free_device(void* ptr) noexcept override { return I(cudaFree(ptr)); }
  int malloc_host(void** ptr, std::size_t bytes) noexcept override {
    return I(cudaHostAlloc(ptr, bytes, cudaHostAllocPortable | cudaHostAllocMapped));
  }
  int free_host(void* ptr) noexcept override { return I(cudaFreeHost(ptr)); }
  int malloc_async(void** ptr, std::size_t bytes, StreamHandle stream) noexcept override {
    return I(cudaMallocAsync(ptr, bytes, S(stream)));
  }
  int free_async(void* ptr, StreamHandle stream) noexcept override {
    return I(cudaFreeAsync(ptr, S(stream)));
  }
  int memcpy_async(void* dst, const void* src, std::size_t bytes,
                   StreamHandle stream) noexcept override {
    return I(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, S(stream)));
  }
  bool batch_available() noexcept override {
    std::call_once(batch_once_, [this] { batch_ = resolve<BatchFn>("cuMemcpyBatchAsync", 12080); });
    return batch_ != nullptr;
  }
  int memcpy_batch_async(const CopyDescriptor* copies, std::size_t count, bool src_in_stream_order,
                         StreamHandle stream, std::size_t* fail_index) noexcept override {
    if (!batch_available()) return I(cudaErrorNotSupported);
    if (count == 0) return I(cudaSuccess);
    // The driver takes separate arrays; they are read during the call only.
    thread_local std::vector<CUdeviceptr> dsts, srcs;
    thread_local std::vector<std::size_t> sizes;
    dsts.resize(count);
    srcs.resize(count);
    sizes.resize(count);
    for (std::size_t i = 0; i < count; ++i) {
      dsts[i] = copies[i].dst;
      srcs[i] = copies[i].src;
      sizes[i] = copies[i].bytes;
    }
    CUmemcpyAttributes attr{};
    attr.srcAccessOrder =
        src_in_stream_order ? CU_MEMCPY_SRC_ACCESS_ORDER_STREAM : CU_MEMCPY_SRC_ACCESS_ORDER_ANY;
    std::size_t index = 0;
    const CUresult r = batch_(dsts.data(), srcs.data(), sizes.data(), count, &attr, &index, 1,
                              fail_index, reinterpret_cast<CUstream>(stream));
    return from_driver(r);
  }
  int launch_copy_pieces(const detail::DevicePiece* pieces, std::uint64_t count, int ctas,
                         int threads, StreamHandle stream) noexcept override {
    return detail::launch_copy_pieces(pieces, count, ctas, threads, S(stream));
  }
  int launch_build_pieces(const detail::DeviceJobLayout& layout, const std::int32_t* ids,
                          const std::int64_t* count, const std::int64_t* group_counts,
                          const std::int32_t* host_ids, const int* mismatch,
                          detail::DevicePiece* pieces, std::uint64_t max_pieces, int ctas,
                          int threads, StreamHandle stream) noexcept override {
    return detail::launch_build_pieces(layout, ids, count, group_counts, host_ids, mismatch, pieces,
                                       max_pieces, ctas, threads, S(stream));
  }
  int compaction_temp_bytes(std::int64_t max_ids, int max_groups,
                            std::size_t* bytes) noexcept override {
    return detail::compaction_temp_bytes(max_ids, max_groups, bytes);
  }
  int launch_compact(const CompactArgs& a, StreamHandle stream) noexcept override {
    return detail::compact_block_ids(a.ids, a.n, a.offsets, a.groups, a.expected, a.out, a.max_id,
                                     a.count, a.group_counts, a.mismatch, a.temp, a.temp_bytes,
                                     S(stream));
  }
  int get_last_error() noexcept override { return I(cudaGetLastError()); }
  std::string describe(int status) const override {
    if (status >= dev::driver_base) {
      const auto r = static_cast<CUresult>(status - dev::driver_base);
      const Driver& d = driver();
      const char* name = nullptr;
      const char* text = nullptr;
      if (d.error_name == nullptr || d.error_name(r, &name) != CUDA_SUCCESS) name = nullptr;
      if (d.error_string == nullptr || d.error_string(r, &text) != CUDA_SUCCESS) text = nullptr;
      return fmt::format("{} ({}, driver API)",
                         name != nullptr ? name : fmt::format("CUresult {}", static_cast<int>(r)),
                         text != nullptr ? text : "no description");
    }
    const auto e = static_cast<cudaError_t>(status);
    return fmt::format("{} ({})", cudaGetErrorName(e), cudaGetErrorString(e));
  }

 private:
  static std::vector<int>& fallback_stack() noexcept {
    thread_local std::vector<int> stack;
    return stack;
  }
  static const Driver& driver() noexcept {
    static const Driver d;
    return d;
  }
  std::mutex primary_mutex_;
  std::array<CUcontext, 64> primary_{};
  std::once_flag batch_once_;
  BatchFn batch_ = nullptr;
};

}  // namespace

std::shared_ptr<DeviceRuntime> cuda_runtime() {
  static const std::shared_ptr<DeviceRuntime> runtime = std::make_shared<CudaRuntime>();
  return runtime;
}

}  // namespace kvoffload
