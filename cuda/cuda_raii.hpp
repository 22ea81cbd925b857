#pragma once

// RAII for CUDA resources (after RMM's cuda_stream/cuda_stream_view and the DESIGN
// conventions): owning, move-only CudaStream and CudaEvent; a non-owning CudaStreamView that
// cannot be made from a literal 0 (the legacy default stream is never used by accident);
// DeviceScope switching the current device for a scope; a StreamPool handing out streams
// round-robin. Destructors never throw and tolerate a process that is exiting.

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <vector>

namespace kvoffload::detail {

class CudaStreamView {
 public:
  explicit CudaStreamView(cudaStream_t stream) noexcept : stream_(stream) {}
  CudaStreamView(int) = delete;             // no literal 0
  CudaStreamView(std::nullptr_t) = delete;  // no legacy default stream
  [[nodiscard]] cudaStream_t value() const noexcept { return stream_; }

 private:
  cudaStream_t stream_;
};

class CudaStream {
 public:
  /// A non-blocking stream with `priority` (lower numbers are higher priority).
  explicit CudaStream(int priority = 0);
  ~CudaStream();
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  [[nodiscard]] cudaStream_t value() const noexcept { return stream_; }
  [[nodiscard]] CudaStreamView view() const noexcept { return CudaStreamView(stream_); }

 private:
  cudaStream_t stream_ = nullptr;
};

class CudaEvent {
 public:
  CudaEvent();  ///< timing disabled: cheapest to record and query
  ~CudaEvent();
  CudaEvent(CudaEvent&& other) noexcept;
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  void record(CudaStreamView stream);
  /// True if complete; throws cuda_error if the work before it failed.
  [[nodiscard]] bool query() const;
  void synchronize() const;
  [[nodiscard]] cudaEvent_t value() const noexcept { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

/// `count` streams of one priority, handed out round-robin.
class StreamPool {
 public:
  StreamPool(std::size_t count, int priority);
  [[nodiscard]] CudaStreamView next() noexcept;
  [[nodiscard]] CudaStreamView at(std::size_t i) const noexcept { return streams_[i].view(); }
  [[nodiscard]] std::size_t size() const noexcept { return streams_.size(); }

 private:
  std::vector<CudaStream> streams_;
  std::atomic<std::size_t> next_{0};
};

}  // namespace kvoffload::detail
