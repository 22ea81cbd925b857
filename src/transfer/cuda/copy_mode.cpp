#include <algorithm>

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

CudaBackendConfig choose_calibration(const CudaBackendConfig& config,
                                     std::span<const CalibrationSample> samples) {
  CudaBackendConfig out = config;
  int small_sizes = 0, staged_wins = 0;
  for (const JobKind dir : {JobKind::store, JobKind::load}) {
    std::uint64_t threshold = 0;
    for (const CalibrationSample& m : samples) {
      if (m.dir != dir) continue;
      if (threshold == 0) threshold = m.piece;  // the smallest size measured
      const bool staged = m.staged_s >= 0;
      const double small = staged ? std::min(m.kernel_s, m.staged_s) : m.kernel_s;
      if (small <= m.batch_s) {  // a small-piece mode wins here: the threshold is above it
        threshold = std::max(threshold, 2 * m.piece);
        ++small_sizes;
        staged_wins += staged && m.staged_s < m.kernel_s ? 1 : 0;
      }
    }
    if (threshold == 0) continue;  // nothing measured in this direction: left as it was
    (dir == JobKind::store ? out.store_small_piece_bytes : out.load_small_piece_bytes) = threshold;
  }
  // Staged for small-piece jobs when it beat the kernel at most of the sizes where a
  // small-piece mode won, both directions together.
  out.staged_min_pieces = small_sizes > 0 && 2 * staged_wins > small_sizes ? 1 : 0;
  return out;
}

}  // namespace kvoffload
