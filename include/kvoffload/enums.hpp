#pragma once

// Every enum of the public API, with its names: to_string gives the name the C API, Python and
// the tools use, and parse_* is its inverse, throwing invalid_argument that names the field and
// lists the accepted names. Front ends parse through these, never by hand.

#include <cstdint>
#include <string_view>

#include "kvoffload/export.hpp"

namespace kvoffload {

/// A KV-cache group's attention (SEMANTICS 1).
enum class GroupKind : std::uint8_t { full_attention, sliding_window, mamba };

/// Every job the scheduler emits, in one vocabulary: a transfer between GPU and host memory,
/// load (host to GPU) or store (GPU to host), or a tier job between host memory and a tier,
/// promote (tier to host memory) or write (host memory to the tier). The numbering is the C
/// API's (KVOFFLOAD_JOB_LOAD = 0, _STORE = 1, _TIER_PROMOTE = 2, _TIER_WRITE = 3).
enum class JobKind : std::uint8_t { load, store, promote, write };

/// Whether `kind` is a tier job's (TierJob, Worker::submit_tier), not a transfer's.
[[nodiscard]] constexpr bool is_tier_job(JobKind kind) noexcept {
  return kind == JobKind::promote || kind == JobKind::write;
}

/// Where a cached block lives: the host cache, or a tier below it.
enum class Medium : std::uint8_t { host, disk, shared };

/// How a disk tier does its I/O.
enum class DiskIo : std::uint8_t {
  automatic,  ///< io_uring where the kernel allows it, else threads (logged)
  io_uring,   ///< io_uring or an error
  threads,    ///< a pool of threads doing pread/pwrite
};

/// The worker's copy backend.
enum class BackendKind : std::uint8_t {
  host,  ///< HostBackend: memcpy threads; the KV tensors are in host memory
  cuda,  ///< CudaBackend: the KV tensors are device memory
};

/// The host block manager's eviction order.
enum class EvictionPolicyKind : std::uint8_t { lru, arc, reuse };

/// A lookup's answer for one key.
enum class LookupResult : std::uint8_t { miss, pending, hit };

/// The pinned host pool's page size.
enum class HugePages : std::uint8_t {
  off,      ///< 4 KiB pages
  prefer,   ///< 2 MiB pages when the system gives them (hugetlb, else transparent), else 4 KiB
  require,  ///< 2 MiB hugetlb pages or an error
};

/// Whether the pinned host pool is registered with CUDA.
enum class Pinning : std::uint8_t {
  automatic,  ///< register with CUDA when a device is present, plain memory otherwise
  off,        ///< plain memory
  require,    ///< register or throw (also without a device)
};

/// How the CUDA backend copies a plan's descriptors between GPU and pinned host memory.
enum class CopyMode : std::uint8_t {
  automatic,  ///< pick per job from piece size and count (thresholds in CudaBackendConfig)
  batch,      ///< one cuMemcpyBatchAsync per job (driver 12.8+), else memcpy
  memcpy,     ///< one cudaMemcpyAsync per descriptor
  kernel,     ///< gather/scatter kernel over mapped pinned memory, a few CTAs
  staged,     ///< a kernel gathers (stores) or scatters (loads) the pages through device
              ///< staging laid out as the host blocks, one DMA per run of adjacent host bytes
};

/// "full_attention", "sliding_window", "mamba".
KVOFFLOAD_EXPORT std::string_view to_string(GroupKind v) noexcept;
/// "load", "store", "promote", "write".
KVOFFLOAD_EXPORT std::string_view to_string(JobKind v) noexcept;
/// "host", "cuda".
KVOFFLOAD_EXPORT std::string_view to_string(BackendKind v) noexcept;
/// "host", "disk", "shared".
KVOFFLOAD_EXPORT std::string_view to_string(Medium v) noexcept;
/// "auto", "io_uring", "threads".
KVOFFLOAD_EXPORT std::string_view to_string(DiskIo v) noexcept;
/// "lru", "arc", "reuse".
KVOFFLOAD_EXPORT std::string_view to_string(EvictionPolicyKind v) noexcept;
/// "miss", "pending", "hit".
KVOFFLOAD_EXPORT std::string_view to_string(LookupResult v) noexcept;
/// "off", "prefer", "require".
KVOFFLOAD_EXPORT std::string_view to_string(HugePages v) noexcept;
/// "auto", "off", "require".
KVOFFLOAD_EXPORT std::string_view to_string(Pinning v) noexcept;
/// "auto", "batch", "memcpy", "kernel", "staged".
KVOFFLOAD_EXPORT std::string_view to_string(CopyMode v) noexcept;

KVOFFLOAD_EXPORT GroupKind parse_group_kind(std::string_view name, std::string_view field);
KVOFFLOAD_EXPORT JobKind parse_job_kind(std::string_view name, std::string_view field);
KVOFFLOAD_EXPORT BackendKind parse_backend_kind(std::string_view name, std::string_view field);
KVOFFLOAD_EXPORT Medium parse_medium(std::string_view name, std::string_view field);
KVOFFLOAD_EXPORT DiskIo parse_disk_io(std::string_view name, std::string_view field);
KVOFFLOAD_EXPORT EvictionPolicyKind parse_eviction_policy(std::string_view name,
                                                          std::string_view field);
KVOFFLOAD_EXPORT HugePages parse_huge_pages(std::string_view name, std::string_view field);
KVOFFLOAD_EXPORT Pinning parse_pinning(std::string_view name, std::string_view field);
KVOFFLOAD_EXPORT CopyMode parse_copy_mode(std::string_view name, std::string_view field);

}  // namespace kvoffload
