#pragma once

// Internal: RAII for the CUDA backend's device work through a DeviceRuntime: the device
// current for a scope, and device or pinned allocations freed on scope exit.

#include <cstddef>
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "kvoffload/device_runtime.hpp"
#include "kvoffload/error.hpp"

namespace kvoffload::detail {

/// Makes `device` current for the calling thread for a scope by pushing its primary context,
/// and pops it at the end: the thread is left exactly as it was. (Restoring with set_device
/// would create a context on device 0 for a thread that never had one: a C API caller, or a
/// multi-GPU engine's thread.)
class Scope {
 public:
  Scope(DeviceRuntime& rt, int device) : rt_(rt) {
    const int e = rt.push_device(device);
    if (e != dev::ok) {
      throw cuda_error(
          fmt::format("CUDA backend: making device {} current failed: {}", device, rt.describe(e)));
    }
  }
  ~Scope() { (void)rt_.pop_device(); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  DeviceRuntime& rt_;
};

/// A device allocation or pinned host allocation, freed on scope exit unless released.
class Owned {
 public:
  enum class Kind : std::uint8_t { device, host };
  Owned(DeviceRuntime& rt, Kind kind) : rt_(&rt), kind_(kind) {}
  ~Owned() { reset(); }
  Owned(Owned&& o) noexcept : rt_(o.rt_), kind_(o.kind_), p_(o.p_) { o.p_ = nullptr; }
  Owned& operator=(Owned&& o) noexcept {
    if (this != &o) {
      reset();
      rt_ = o.rt_;
      kind_ = o.kind_;
      p_ = o.p_;
      o.p_ = nullptr;
    }
    return *this;
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  int allocate(std::size_t bytes) {
    reset();
    return kind_ == Kind::device ? rt_->malloc_device(&p_, bytes) : rt_->malloc_host(&p_, bytes);
  }
  void reset() {
    if (p_ == nullptr) return;
    (void)(kind_ == Kind::device ? rt_->free_device(p_) : rt_->free_host(p_));
    p_ = nullptr;
  }
  [[nodiscard]] void* get() const noexcept { return p_; }
  [[nodiscard]] std::byte* bytes() const noexcept { return static_cast<std::byte*>(p_); }

 private:
  DeviceRuntime* rt_;
  Kind kind_;
  void* p_ = nullptr;
};

/// A profiler range (NVTX on the CUDA runtime) for a scope.
class Range {
 public:
  Range(DeviceRuntime& rt, const std::string& name) : rt_(rt) { rt_.range_push(name.c_str()); }
  ~Range() { rt_.range_pop(); }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  DeviceRuntime& rt_;
};

}  // namespace kvoffload::detail
