#include "cuda_raii.hpp"

#include <fmt/format.h>

#include "cuda_check.hpp"

namespace kvoffload::detail {

void throw_cuda_error(cudaError_t error, const char* call, const char* file, int line) {
  throw cuda_error(
      fmt::format("CUDA error at {}:{}: {} failed: {}", file, line, call, describe(error)));
}

std::string describe(cudaError_t error) {
  return fmt::format("{} ({})", cudaGetErrorName(error), cudaGetErrorString(error));
}

CudaStream::CudaStream(int priority) {
  KVOFFLOAD_CUDA_TRY(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
}

CudaStream::~CudaStream() {
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);  // fails harmlessly at exit
}

CudaStream::CudaStream(CudaStream&& other) noexcept : stream_(other.stream_) {
  other.stream_ = nullptr;
}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    stream_ = other.stream_;
    other.stream_ = nullptr;
  }
  return *this;
}

CudaEvent::CudaEvent() {
  KVOFFLOAD_CUDA_TRY(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
}

CudaEvent::~CudaEvent() {
  if (event_ != nullptr) (void)cudaEventDestroy(event_);
}

CudaEvent::CudaEvent(CudaEvent&& other) noexcept : event_(other.event_) {
  other.event_ = nullptr;
}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
    event_ = other.event_;
    other.event_ = nullptr;
  }
  return *this;
}

void CudaEvent::record(CudaStreamView stream) {
  KVOFFLOAD_CUDA_TRY(cudaEventRecord(event_, stream.value()));
}

bool CudaEvent::query() const {
  const cudaError_t e = cudaEventQuery(event_);
  if (e == cudaErrorNotReady) return false;
  KVOFFLOAD_CUDA_TRY(e);
  return true;
}

void CudaEvent::synchronize() const {
  KVOFFLOAD_CUDA_TRY(cudaEventSynchronize(event_));
}

DeviceScope::DeviceScope(int device) {
  KVOFFLOAD_CUDA_TRY(cudaGetDevice(&previous_));
  if (previous_ != device) KVOFFLOAD_CUDA_TRY(cudaSetDevice(device));
}

DeviceScope::~DeviceScope() {
  (void)cudaSetDevice(previous_);
}

StreamPool::StreamPool(std::size_t count, int priority) {
  streams_.reserve(count);
  for (std::size_t i = 0; i < count; ++i) streams_.emplace_back(priority);
}

CudaStreamView StreamPool::next() noexcept {
  return streams_[next_.fetch_add(1, std::memory_order_relaxed) % streams_.size()].view();
}

}  // namespace kvoffload::detail
