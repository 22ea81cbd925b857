// DeviceCompactor: the GPU compaction of a device-resident block table on its own, one
// temporary buffer for all calls, each call ordered after the one before through an event.

#include <algorithm>
#include <mutex>

#include <fmt/format.h>

#include "common/expects.hpp"
#include "common/logging.hpp"
#include "kvoffload/cuda_backend.hpp"
#include "kvoffload/device_runtime.hpp"
#include "transfer/cuda/device_scope.hpp"

namespace kvoffload {

using detail::Scope;

DeviceCompactor::DeviceCompactor(std::int64_t max_ids, int max_groups,
                                 std::shared_ptr<DeviceRuntime> runtime, int device)
    : rt_(runtime != nullptr ? std::move(runtime) : cuda_runtime()),
      max_ids_(max_ids),
      max_groups_(max_groups),
      device_(device) {
  KVOFFLOAD_EXPECTS(max_ids >= 1 && max_groups >= 1, "compactor: sizes must be positive");
  if (device_ < 0 && rt_->get_device(&device_) != dev::ok) device_ = 0;
  KVOFFLOAD_EXPECTS(device_ < rt_->device_count(), "compactor: device {} but {} device(s) visible",
                    device_, rt_->device_count());
  Scope scope(*rt_, device_);
  int e = rt_->compaction_temp_bytes(max_ids, max_groups, &temp_bytes_);
  if (e == dev::ok) e = rt_->malloc_device(&temp_, std::max<std::size_t>(temp_bytes_, 1));
  if (e == dev::ok) e = rt_->event_create(&last_);
  if (e != dev::ok) {
    if (temp_ != nullptr) (void)rt_->free_device(temp_);
    temp_ = nullptr;
    throw cuda_error(
        fmt::format("compactor on device {}: temporary storage: {}", device_, rt_->describe(e)));
  }
}

DeviceCompactor::~DeviceCompactor() {
  try {
    Scope scope(*rt_, device_);
    if (last_ != 0) (void)rt_->event_destroy(last_);
    if (temp_ != nullptr) (void)rt_->free_device(temp_);  // waits for the device's work
  } catch (const std::exception& e) {
    detail::logger().error("compactor: shutdown failed: {}", e.what());
  }
}

void DeviceCompactor::compact(const std::int32_t* ids, std::int64_t n, const std::int64_t* offsets,
                              int groups, const std::int64_t* expected, std::int32_t* out,
                              std::int64_t* count, std::int64_t* group_counts, int* mismatch,
                              StreamHandle stream) {
  KVOFFLOAD_EXPECTS(
      n >= 0 && n <= max_ids_ && groups >= 1 && groups <= max_groups_,
      "compactor: {} ids in {} groups exceed the {} ids and {} groups it was sized for", n, groups,
      max_ids_, max_groups_);
  std::lock_guard lock(mutex_);
  Scope scope(*rt_, device_);
  auto fail = [&](int e, const char* what) {
    if (e == dev::ok) return;
    (void)rt_->get_last_error();
    throw cuda_error(
        fmt::format("compactor on device {}: {}: {}", device_, what, rt_->describe(e)));
  };
  if (stream > 1) {
    int device = -1;
    fail(rt_->stream_device(stream, &device), "stream_device");
    KVOFFLOAD_EXPECTS(device == device_, "compactor: stream {:#x} belongs to device {}, not {}",
                      stream, device, device_);
  }
  // The temporary storage is shared: this call's kernels start after the previous call's.
  if (recorded_) fail(rt_->stream_wait_event(stream, last_), "stream_wait_event");
  CompactArgs a;
  a.ids = ids;
  a.n = n;
  a.offsets = offsets;
  a.groups = groups;
  a.expected = expected;
  a.out = out;
  a.count = count;
  a.group_counts = group_counts;
  a.mismatch = mismatch;
  a.temp = temp_;
  a.temp_bytes = temp_bytes_;
  fail(rt_->launch_compact(a, stream), "launch_compact");
  if (const int e = rt_->event_record(last_, stream); e != dev::ok) {
    // The next call could not be ordered after this one: finish it before saying so.
    (void)rt_->stream_synchronize(stream);
    fail(e, "event_record");
  }
  recorded_ = true;
}

}  // namespace kvoffload
