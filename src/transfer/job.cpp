#include "kvoffload/job.hpp"

#include "common/block_math.hpp"
#include "common/expects.hpp"

namespace kvoffload {

void check_job_shape(const TransferJob& job, std::int64_t num_groups,
                     std::int64_t block_size_factor) {
  const GpuSpec& gpu = job.gpu;
  const auto G = static_cast<std::size_t>(num_groups);
  KVOFFLOAD_EXPECTS(gpu.group_sizes.size() == G && gpu.block_indices.size() == G,
                    "job {}: {} group sizes and {} block indices for {} groups", job.id,
                    gpu.group_sizes.size(), gpu.block_indices.size(), G);
  KVOFFLOAD_EXPECTS(job.keys.size() == job.host_block_ids.size(),
                    "job {}: {} keys but {} host blocks", job.id, job.keys.size(),
                    job.host_block_ids.size());
  std::size_t key = 0;
  for (std::size_t g = 0; g < G; ++g) {
    const std::int64_t size = gpu.group_sizes[g];
    const std::int64_t index = gpu.block_indices[g];
    KVOFFLOAD_EXPECTS(size >= 0 && index >= 0,
                      "job {} group {}: negative group size {} or block index {}", job.id, g, size,
                      index);
    std::int64_t host_blocks = 0;
    while (key < job.keys.size() && job.keys[key].group == g) {
      ++host_blocks;
      ++key;
    }
    const std::int64_t expected = detail::host_blocks_spanned(size, index, block_size_factor);
    KVOFFLOAD_EXPECTS(expected == host_blocks,
                      "job {} group {}: {} GPU blocks starting at sub-block {} need {} host "
                      "blocks, the job has {}",
                      job.id, g, size, index, expected, host_blocks);
  }
  KVOFFLOAD_EXPECTS(key == job.keys.size(),
                    "job {}: keys are not grouped by ascending group (key {} has group {})", job.id,
                    key, key < job.keys.size() ? job.keys[key].group : 0U);
}

void check_job_invariants(const TransferJob& job, std::int64_t num_groups,
                          std::int64_t block_size_factor) {
  check_job_shape(job, num_groups, block_size_factor);
  const GpuSpec& gpu = job.gpu;
  std::int64_t total = 0;
  for (const std::int64_t size : gpu.group_sizes) total += size;
  KVOFFLOAD_EXPECTS(total == static_cast<std::int64_t>(gpu.block_ids.size()),
                    "job {}: group sizes add up to {} but there are {} GPU block ids", job.id,
                    total, gpu.block_ids.size());
  for (std::size_t i = 0; i < gpu.block_ids.size(); ++i) {
    KVOFFLOAD_EXPECTS(gpu.block_ids[i] > 0, "job {}: GPU block id {} at position {} is {}", job.id,
                      gpu.block_ids[i], i,
                      gpu.block_ids[i] == null_block ? "the null block" : "negative");
  }
}

}  // namespace kvoffload
