#include <fmt/format.h>

#include "common/expects.hpp"
#include "kvoffload/cuda_backend.hpp"

namespace kvoffload {

CopyMode choose_copy_mode(const CopyPlan& plan, const CudaBackendConfig& config,
                          bool batch_available, bool kernel_available) {
  const CopyMode large = batch_available ? CopyMode::batch : CopyMode::memcpy;
  CopyMode want = config.mode;
  if (want == CopyMode::automatic) {
    const std::uint64_t n = plan.descriptors.size();
    const std::uint64_t average = n == 0 ? 0 : plan.total_bytes / n;
    const std::uint64_t small = plan.kind == JobKind::store ? config.store_small_piece_bytes
                                                            : config.load_small_piece_bytes;
    if (n == 0 || average >= small) {
      want = large;
    } else if (config.staged_min_pieces > 0 && n >= config.staged_min_pieces &&
               plan.total_bytes <= config.staging_bytes) {
      want = CopyMode::staged;
    } else {
      want = CopyMode::kernel;
    }
  }
  // What this device and job allow.
  if (want == CopyMode::batch && !batch_available) want = CopyMode::memcpy;
  // Staging holds the job's host runs at 16-byte boundaries: at most 15 bytes more a piece.
  if (want == CopyMode::staged &&
      plan.total_bytes + 15 * plan.descriptors.size() > config.staging_bytes) {
    want = CopyMode::kernel;
  }
  if ((want == CopyMode::kernel || want == CopyMode::staged) && !kernel_available) want = large;
  return want;
}

}  // namespace kvoffload
