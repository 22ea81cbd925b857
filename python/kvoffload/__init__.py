"""kvoffload: offload LLM KV-cache blocks between GPU memory and pinned host memory.

The scheduler side (:class:`Scheduler`) decides which blocks of which requests are stored to
host memory and loaded back; the worker side (:class:`Worker`) runs the copies. Block tensors
are passed by address and shape (:func:`tensor_of` reads them from a PyTorch tensor or a
NumPy array), so neither library is a dependency.

Errors raise :class:`Error` subclasses, one per C API status (the table in
``kvoffload/error.hpp``): :class:`InvalidArgument` (also a ``ValueError``), :class:`OutOfMemory`
(also a ``MemoryError``), :class:`CudaError`, :class:`Unsupported` (e.g. the CUDA backend
without a CUDA build or device), :class:`InternalError` and :class:`IoError` (also an
``OSError``: the system refused a file or directory).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from ._kvoffload import __version__ as _kvoffload_version
from ._kvoffload import (  # noqa: F401  (re-exported)
    CudaError,
    Error,
    InternalError,
    IoError,
    InvalidArgument,
    Job,
    OutOfMemory,
    TierJob,
    Unsupported,
    _Scheduler,
    _Worker,
    built_with_cuda,
    cuda_device_count,
    merge_rank_scans,
)
from ._kvoffload import _check_derivation
from ._kvoffload import _parse_bytes  # noqa: F401  (vllm.py reads byte sizes with it)

__all__ = [
    "AllocatedGroup",
    "CompletedJob",
    "CudaError",
    "DiskTierConfig",
    "Error",
    "InternalError",
    "IoError",
    "Event",
    "FinishedTransfer",
    "GroupConfig",
    "InvalidArgument",
    "Job",
    "Unsupported",
    "JobReport",
    "KvTensor",
    "OutOfMemory",
    "ScheduledRequest",
    "Scheduler",
    "SchedulerConfig",
    "Step",
    "SharedTierConfig",
    "TierConfig",
    "TierJob",
    "Worker",
    "WorkerConfig",
    "built_with_cuda",
    "derive_worker_config",
    "cuda_device_count",
    "merge_rank_scans",
    "stream_handle",
    "tensor_of",
]

__version__: str = _kvoffload_version  # the library's, from CMakeLists.txt

Key = Tuple[bytes, int]


@dataclass
class GroupConfig:
    """One KV-cache group: ``kind`` is "full_attention", "sliding_window" or "mamba"."""

    kind: str = "full_attention"
    gpu_block_size: int = 16
    sliding_window: int = 0


@dataclass
class SharedTierConfig:
    """A shared tier's store on a Valkey (or Redis 7) cluster (docs/semantics.md section
    11.1): ``nodes`` "host:port[,host:port...]"; ``name`` the namespace, with ``tp_size`` and
    the block size factor (model, revision, dtype, block size: engines that share blocks give
    the same). Given once, as ``TierConfig(medium="shared", store=...)``: the scheduler asks
    the cluster which keys it holds, the workers (derive_worker_config) read and write it."""

    medium: ClassVar[str] = "shared"
    nodes: str
    name: str
    tp_rank: int = 0
    tp_size: int = 1
    connect_timeout_ms: int = 200
    reply_timeout_ms: int = 1000
    in_flight: int = 8  # blocks per pipelined batch
    # The fleet secret (keys' names, values' MACs), the same for every engine of the fleet:
    # a file holding it, else the environment variable secret_env names. Never the secret
    # itself in a config. Without one the tier refuses to start unless insecure is True.
    secret_file: str = ""
    secret_env: str = "KVOFFLOAD_SHARED_SECRET"
    insecure: bool = False
    # AUTH (an ACL user): the password from a file, else the environment variable
    # password_env names; neither: no AUTH. TLS: the servers' certificates verified against
    # tls_ca_file (empty: the system's) and named tls_server_name (empty: the host).
    username: str = ""
    password_file: str = ""
    password_env: str = "KVOFFLOAD_SHARED_PASSWORD"
    tls: bool = False
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_server_name: str = ""
    ttl_seconds: int = 0  # values expire after this many seconds (0: never)
    only_seeds: bool = False  # connect to the listed nodes only (redirects elsewhere fail)


@dataclass
class TierConfig:
    """A tier below the host cache (docs/semantics.md section 11), described once for both
    sides: ``blocks`` (its capacity in slots, ``Worker.tier_slots(t)``; for a shared tier, the
    keys the scheduler remembers as present) and the fields after it are the scheduler's
    index; ``store`` (a DiskTierConfig or a SharedTierConfig of this medium) is what the
    workers run, and what a shared tier's presence checks ask."""

    blocks: int
    medium: str = "disk"
    policy: str = "lru"
    store_threshold: int = 0  # 0 or N >= 2: written once looked up N times
    write_queue_blocks: int = 0  # 0: 1024
    write_back: bool = False  # write blocks when the host evicts them, not after each store
    write_back_free_blocks: int = 0  # write-back keeps this many host blocks free (0: 1/16)
    promote_timeout_ms: int = 0  # lookups wait this long for a promotion (0: 5000)
    store: Optional[Union["DiskTierConfig", SharedTierConfig]] = None


@dataclass
class SchedulerConfig:
    """kvoffload::SchedulerConfig (with its ManagerConfig's fields): the same defaults, which
    tests/test_config_defaults.py checks against the library. ``groups`` (the model) and
    ``host_blocks`` (the capacity) have none: set both."""

    groups: List[GroupConfig] = field(default_factory=list)
    host_blocks: int = 0
    block_size_factor: int = 1
    hash_block_size: int = 16
    num_workers: int = 1
    prefix_caching: bool = True
    gpu_blocks: int = 0
    policy: str = "lru"
    store_threshold: int = 0
    threshold_tracker_keys: int = 0  # 0: 4 x host_blocks, at least 1024
    block_bytes: int = 0
    enable_events: bool = True
    tiers: List[TierConfig] = field(default_factory=list)  # below the host cache, nearest first
    # The model weights' identity (a checkpoint digest, a training step): every tier keys
    # blocks by it, so blocks of other weights are never found, nor restored from disk.
    weights: str = ""


@dataclass
class AllocatedGroup:
    """The GPU blocks the engine allocated for one group of a request (nulls included)."""

    block_ids: Sequence[int]
    num_computed_blocks: int = 0


@dataclass
class ScheduledRequest:
    request_id: str
    num_computed_tokens: int
    num_scheduled_tokens: int
    new_block_ids: Sequence[Sequence[int]]  # one list per group
    resumed: bool = False


@dataclass
class JobReport:
    job: int
    count: int = 1
    ok: bool = True


@dataclass(frozen=True)
class CompletedJob:
    job: int
    kind: str
    request_id: str
    ok: bool


@dataclass(frozen=True)
class Event:
    removed: bool
    keys: List[Key]
    medium: str = "host"  # or the tier whose index changed ("disk")


@dataclass
class Step:
    """One step's jobs: loads planned since the last step, this step's stores (in request
    order), and the in-flight stores to wait for first (ascending)."""

    load_jobs: List[Job]
    store_jobs: List[Job]
    flush: List[int]
    tier_jobs: List[TierJob] = field(default_factory=list)  # promotions and tier writes


class Scheduler:
    """The offloading scheduler (SEMANTICS 3-8). Single-threaded: one thread calls it."""

    def __init__(self, config: Optional[SchedulerConfig] = None, **overrides):
        c = config if config is not None else SchedulerConfig()
        if overrides:
            c = SchedulerConfig(**{**c.__dict__, **overrides})
        self.config = c
        self._s = _Scheduler(c)

    def update_request(self, request_id: str, num_tokens: int, block_hashes: Sequence[bytes],
                       remote_decode: bool = False) -> None:
        """The request's token count and all its block hashes so far."""
        self._s.update_request(request_id, num_tokens, list(block_hashes), remote_decode)

    def extend_request(self, request_id: str, num_tokens: int,
                       new_hashes: Sequence[bytes] = ()) -> None:
        """Like update_request, with only the hashes that are new."""
        self._s.extend_request(request_id, num_tokens, list(new_hashes))

    def lookup(self, request_id: str, num_computed_tokens: int = 0) -> Optional[int]:
        """Tokens loadable from host memory (0: none), or None: ask again later."""
        return self._s.lookup(request_id, num_computed_tokens)

    def on_allocated(self, request_id: str, groups: Sequence[AllocatedGroup],
                     num_external_tokens: int) -> None:
        self._s.on_allocated(
            request_id, [(list(g.block_ids), g.num_computed_blocks) for g in groups],
            num_external_tokens)

    def build_step(self, scheduled: Iterable[ScheduledRequest],
                   preempted: Sequence[str] = ()) -> Step:
        entries = [(e.request_id, e.num_computed_tokens, e.num_scheduled_tokens,
                    [list(ids) for ids in e.new_block_ids], e.resumed) for e in scheduled]
        loads, stores, flush, tier_jobs = self._s.build_step(entries, list(preempted))
        return Step(loads, stores, list(flush), tier_jobs)

    def on_completed(self, reports: Iterable[JobReport]) -> List[CompletedJob]:
        done = self._s.on_completed([(r.job, r.count, r.ok) for r in reports])
        return [CompletedJob(*d) for d in done]

    def on_finished(self, request_id: str) -> None:
        self._s.on_finished(request_id)

    def limit_stores(self, request_id: str, max_tokens: int) -> None:
        """Stores none of the request's tokens past the first max_tokens (0: nothing of it)."""
        self._s.limit_stores(request_id, max_tokens)

    def limit_state_stores(self, request_id: str, final_tokens: int) -> None:
        """Mamba groups store no block ending past the first final_tokens tokens (the ones
        whose states the engine finalised in prefill; past them decode-time states)."""
        self._s.limit_state_stores(request_id, final_tokens)

    def limit_loads(self, request_id: str, max_tokens: int) -> None:
        """Its lookups load at most max_tokens beyond the computed ones, ending at an
        offloaded block (negative: no limit)."""
        self._s.limit_loads(request_id, max_tokens)

    def set_store_pressure(self, on: bool) -> None:
        """Back-pressure from the workers (Worker.store_pressure(), any worker's): while on,
        steps build no store jobs; the blocks they skip are counted in pressure_skips."""
        self._s.set_store_pressure(bool(on))

    def handed_out(self, block_ids: Sequence[int]) -> None:
        """GPU blocks the engine hands out or overwrites this step without listing them in any
        request's new block ids (copy-on-write destinations): stores built from now on leave
        them out of every request that held them before in a window or mamba group, and stores
        still reading them are flushed first (docs/semantics.md 6.9). Call before the step's
        build_step."""
        self._s.handed_out([int(b) for b in block_ids])

    def reset_cache(self, weights: Optional[str] = None) -> None:
        """Drops the host cache. ``weights``: the new weights' identity, needed with tiers:
        every tier's old blocks become unreachable in the same call, and blocks stored from
        now on are found by engines (and disk restarts) that give the same identity."""
        if weights is None:
            self._s.reset_cache()
        else:
            self._s.reset_weights(weights)

    @property
    def epoch(self) -> int:
        """The weights' epoch tier jobs carry now (TierJob.epoch)."""
        return self._s.epoch

    def take_events(self) -> List[Event]:
        return [Event(removed, keys, medium) for removed, keys, medium in self._s.take_events()]

    def stats(self) -> dict:
        """Cache occupancy and counters (hits, misses, evictions, jobs, bytes)."""
        return self._s.stats()

    def partly_written(self, keys: Sequence[Key]) -> List[bool]:
        """Per key: held in host memory without its leading sub-blocks (a sliding-window
        block stored from a later sub-block, docs/semantics.md 6.8), so not a whole block."""
        return self._s.partly_written(list(keys))

    def metrics_text(self, labels: Optional[Dict[str, str]] = None) -> str:
        """stats() and every tier's tier_stats() in the Prometheus text format, for an engine's
        /metrics endpoint: kvoffload_<field>[_total], kvoffload_tier_<field>[_total]{tier,
        medium}; ``labels`` are added to every sample."""
        return self._s.metrics_text(sorted((labels or {}).items()))

    def tier_stats(self, tier: int = 0) -> dict:
        """Tier ``tier``'s occupancy and counters (promotions, writes, skips, evictions)."""
        return self._s.tier_stats(tier)

    def restore_tier(self, tier: int, slots: Sequence[Optional[Key]]) -> int:
        """After a restart: the tier's index from the workers' scan (``Worker.tier_scan``;
        with several ranks, a key only where every rank has it). Returns the keys restored."""
        return self._s.restore_tier(tier, list(slots))

    @property
    def num_requests(self) -> int:
        return self._s.num_requests

    @property
    def num_jobs_in_flight(self) -> int:
        return self._s.num_jobs_in_flight


@dataclass
class KvTensor:
    """One KV tensor of the engine's cache: ``num_blocks`` pages at ``base + i * stride``."""

    base: int
    num_blocks: int
    page_bytes: int
    block_stride_bytes: int


def _page_is_dense(shape, strides, item: int) -> bool:
    """Whether a page of this shape and these byte strides is exactly the ``prod(shape) * item``
    bytes from its first element on: contiguous (``t[0].is_contiguous()``) or its dimensions in
    another order (a permuted page, such as vLLM's HND layout, is still those bytes), but no
    gap, overlap or negative stride."""
    if any(n == 0 for n in shape):
        return True  # no bytes (the layout refuses an empty page)
    expect = item
    for stride, size in sorted((s, n) for n, s in zip(shape, strides) if n != 1):
        if stride != expect:
            return False
        expect *= size
    return True


def _kv_tensor(base: int, shape, strides, item: int, page: int) -> KvTensor:
    """The KvTensor of a tensor of this shape and these byte strides, once one block's page is
    the bytes the copies assume: ``page`` bytes at ``base + i * strides[0]``."""
    if len(shape) < 1:
        raise InvalidArgument("tensor_of: a 0-d tensor has no block dimension")
    num_blocks, stride = int(shape[0]), int(strides[0])
    if not _page_is_dense(shape[1:], strides[1:], item):
        raise InvalidArgument(
            f"tensor_of: the pages t[i] (shape {tuple(shape[1:])}, byte strides "
            f"{tuple(strides[1:])}) are not contiguous, so the {page} bytes at base + i * "
            f"{stride} would hold other data (a sliced or padded view such as t[:, :, :n]); "
            "pass the whole tensor, or a view whose pages are contiguous")
    if num_blocks > 1 and stride < page:
        raise InvalidArgument(
            f"tensor_of: the block stride ({stride} bytes) is smaller than the page ({page} "
            "bytes), so the pages overlap (an expanded, broadcast or reversed view)")
    return KvTensor(base, num_blocks, page, stride)


def tensor_of(t) -> KvTensor:
    """A KvTensor for a PyTorch tensor or a NumPy array whose first dimension is the block
    index and whose pages (``t[i]``) are contiguous: page i is the ``page_bytes`` bytes at
    ``base + i * block_stride_bytes``. Padding between pages is fine; a page with gaps in it
    (a sliced view), overlapping pages (an expanded view) and negative strides raise
    InvalidArgument."""
    if hasattr(t, "data_ptr"):  # PyTorch
        item = t.element_size()
        page = int(t.numel() // t.shape[0]) * item if t.dim() > 0 and t.shape[0] > 0 else 0
        return _kv_tensor(int(t.data_ptr()), tuple(t.shape),
                          [int(s) * item for s in t.stride()], item, page)
    iface = getattr(t, "__array_interface__", None)
    if iface is None:
        raise InvalidArgument("tensor_of: expected a PyTorch tensor or a NumPy array, got "
                              + type(t).__name__)
    page = int(t[0].nbytes) if len(t.shape) > 0 and t.shape[0] > 0 else 0
    return _kv_tensor(int(iface["data"][0]), tuple(t.shape), tuple(t.strides), int(t.itemsize),
                      page)


@dataclass
class DiskTierConfig:
    """A disk tier's store: ``capacity_bytes`` an int or a string such as "500GiB" (the
    library's parser reads it); ``model`` and ``dtype`` (with the rank) name the layout's
    directory under ``path``, so incompatible bytes are never read back. ``io``: "auto"
    (io_uring where allowed, else threads), "io_uring" or "threads"."""

    medium: ClassVar[str] = "disk"
    path: str
    capacity_bytes: Union[int, str]
    model: str = ""
    dtype: str = ""
    tp_rank: int = 0
    tp_size: int = 1
    io: str = "auto"
    io_depth: int = 32
    io_threads: int = 4
    direct_io: bool = True


@dataclass
class WorkerConfig:
    tensors: List[KvTensor]
    groups: List[List[Tuple[int, int]]]  # per group: (tensor index, page bytes used)
    host_blocks: int = 0  # the scheduler's host_blocks; required (0 is refused)
    block_size_factor: int = 1
    backend: str = "host"  # or "cuda"
    threads: int = 0
    cuda_device: int = 0
    defer_stores: bool = False
    # Back-pressure: the bytes of stores held at once (0: no bound); past it a store is not
    # copied (it fails, counted in stats()["stores_shed"]).
    max_store_bytes_in_flight: int = 0
    # CUDA backend: the engine's compute stream, as an int (a cudaStream_t's value; 0 is the
    # legacy default stream, PyTorch's default) or any object with a ``cuda_stream``
    # attribute, such as ``torch.cuda.Stream``. Stores, and loads unless
    # loads_wait_for_compute is False, wait on the GPU for the work queued on it when they are
    # submitted. None: nothing is waited for. cudaStreamPerThread (2) is refused.
    compute_stream: Optional[object] = None
    loads_wait_for_compute: bool = True
    # CUDA backend: "auto" (per job, by piece size), "batch", "memcpy", "kernel" or "staged".
    copy_mode: str = "auto"
    # The tiers' stores in the scheduler's tiers' order: derive_worker_config fills them (and
    # host_blocks and block_size_factor) from the scheduler's config.
    tiers: List[Union[DiskTierConfig, SharedTierConfig]] = field(default_factory=list)
    # This worker's rank, given to the tiers' stores (0: each store's own; else a store's must
    # be 0 or this one).
    tp_rank: int = 0
    # The weights' identity (SchedulerConfig.weights; derive_worker_config copies it): a disk
    # tier restores only the slots written under it.
    weights: str = ""
    # What else makes pages of equal size incompatible (dimension order, dtype): part of the
    # layout tiers are keyed by (WorkerConfig::layout_note).
    layout_note: str = ""


def derive_worker_config(scheduler: SchedulerConfig, worker: WorkerConfig) -> WorkerConfig:
    """``worker`` with what it shares with its scheduler taken from ``scheduler`` (C++'s
    kvoffload::derive_worker_config, whose checks run here: a valid config, a store for every
    tier, as many groups): block_size_factor, host_blocks, weights and the tiers' stores, in
    order, each as rank ``worker.tp_rank``. Describe the model's geometry and the tiers once, in the
    SchedulerConfig."""
    _check_derivation(scheduler, dataclasses.replace(worker, compute_stream=None))
    # The stores as the description has them: the Worker gives them worker.tp_rank (a store's
    # own rank must be 0 or that one).
    return dataclasses.replace(
        worker, block_size_factor=scheduler.block_size_factor, host_blocks=scheduler.host_blocks,
        tiers=[t.store for t in scheduler.tiers], weights=scheduler.weights)


@dataclass(frozen=True)
class FinishedTransfer:
    job: int
    kind: str
    ok: bool
    error: str
    bytes: int


def stream_handle(stream) -> Optional[int]:
    """The cudaStream_t value of ``stream``: None, an int, or an object with a ``cuda_stream``
    attribute (``torch.cuda.Stream``, ``torch.cuda.current_stream()``)."""
    if stream is None:
        return None
    if isinstance(stream, bool):
        raise InvalidArgument("compute_stream: expected a stream or an int, got a bool")
    if isinstance(stream, int):
        value = stream
    elif hasattr(stream, "cuda_stream"):
        value = int(stream.cuda_stream)
    else:
        raise InvalidArgument("compute_stream: expected an int handle or an object with a "
                              "cuda_stream attribute (torch.cuda.Stream), got "
                              + type(stream).__name__)
    if value < 0:
        raise InvalidArgument(f"compute_stream: {value} is negative")
    return value


class Worker:
    """Runs the scheduler's jobs: copies between the KV tensors and a host pool it owns."""

    def __init__(self, config: WorkerConfig):
        self.config = config
        self._w = _Worker(dataclasses.replace(
            config, compute_stream=stream_handle(config.compute_stream)))

    def check_matches(self, scheduler: SchedulerConfig) -> None:
        """Raises InvalidArgument unless this worker fits ``scheduler`` (C++'s
        Worker::check_matches: factor, pool size, groups, tiers by count, kind and order, a disk
        tier's slots, a shared tier's namespace): for a worker configured apart from it."""
        self._w.check_matches(scheduler)

    def cuda_stats(self) -> Optional[dict]:
        """The CUDA backend's counts of the copy modes its jobs really used (jobs_batch,
        jobs_memcpy, jobs_kernel, jobs_staged, jobs_device_table, staged_fell_back,
        ring_fell_back); None for the host backend."""
        return self._w.cuda_stats()

    def set_compute_stream(self, stream) -> None:
        """Jobs submitted from now on wait for ``stream`` (see WorkerConfig.compute_stream);
        None turns the waits off."""
        self._w.set_compute_stream(stream_handle(stream))

    def submit(self, job: Job) -> None:
        """Starts a load or a store; a job outside the layout raises InvalidArgument."""
        self._w.submit(job)

    def submit_tier(self, job: TierJob) -> None:
        """Starts a promotion or a tier write (finished as kind "promote"/"write")."""
        self._w.submit_tier(job)

    def clear_tiers(self) -> None:
        """Empties the disk tiers: after Scheduler.reset_cache (once its flush set finished),
        so the old cache's blocks do not come back after a restart."""
        self._w.clear_tiers()

    def metrics_text(self, labels: Optional[Dict[str, str]] = None) -> str:
        """stats() and its tiers' I/O in the Prometheus text format (kvoffload_worker_*)."""
        return self._w.metrics_text(sorted((labels or {}).items()))

    def stats(self) -> dict:
        """This worker's copies: jobs, failed jobs, bytes and summed job seconds per direction
        (store_jobs, load_jobs, failed_jobs, bytes_stored, bytes_loaded, store_seconds,
        load_seconds), since it started, and stores_shed (stores not copied: the bound on
        store bytes held was reached)."""
        return self._w.stats()

    def store_pressure(self) -> bool:
        """The stores held reach half of max_store_bytes_in_flight: give it to the scheduler
        (Scheduler.set_store_pressure) before its next step."""
        return self._w.store_pressure()

    def shared_tier_stats(self, tier: int) -> dict:
        """Shared tier ``tier``'s counters (``tier`` indexes the scheduler's tiers): reads,
        read_misses, bad_values, read_errors, writes, write_errors, bytes_read,
        bytes_written."""
        return self._w.shared_tier_stats(tier)

    def layout_description(self) -> str:
        """What the tiers' layout digest is made of: the factor, block and page bytes, and
        WorkerConfig.layout_note. Disk files and shared values of another layout are misses."""
        return self._w.layout_description()

    def tier_scan(self, tier: int = 0) -> List[Optional[Key]]:
        """What tier ``tier`` found when the worker opened it: a key or None per slot."""
        return self._w.tier_scan(tier)

    def release_tier_scan(self, tier: int = 0) -> None:
        """Frees what tier_scan(tier) returns (a key per disk slot, for the worker's life
        otherwise) once the scheduler has restored from it; tier_scan is empty afterwards."""
        self._w.release_tier_scan(tier)

    def tier_slots(self, tier: int = 0) -> int:
        """Tier ``tier``'s capacity in slots (the scheduler's TierConfig.blocks)."""
        return self._w.tier_slots(tier)

    def tier_io(self, tier: int = 0) -> str:
        """The I/O engine tier ``tier`` runs on: "io_uring" or "threads"."""
        return self._w.tier_io(tier)

    def submit_step(self, step: Step) -> None:
        """Waits for the step's flush set, then submits its loads, stores and tier jobs."""
        if step.flush:
            self.wait(step.flush)
        for job in step.load_jobs:
            self.submit(job)
        for job in step.store_jobs:
            self.submit(job)
        for job in step.tier_jobs:
            self.submit_tier(job)

    def start_step(self) -> None:
        self._w.start_step()

    def get_finished(self) -> List[FinishedTransfer]:
        return [FinishedTransfer(*f) for f in self._w.get_finished()]

    def wait(self, jobs: Sequence[int]) -> None:
        self._w.wait(list(jobs))

    def host_block(self, block: int):
        """A writable NumPy uint8 view of host block ``block`` of the pool."""
        return self._w.host_block(block)

    @property
    def num_host_blocks(self) -> int:
        return self._w.num_host_blocks
