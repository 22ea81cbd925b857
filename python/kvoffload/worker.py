"""kvoffload's worker side: the engine's KV tensors (:func:`tensor_of`), the worker's config
(:class:`WorkerConfig`, :class:`DiskTierConfig`) and :class:`Worker`, which runs the copies
between them and host memory and the tier jobs below it. Re-exported by ``kvoffload``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Dict, List, Optional, Sequence, Tuple, Union

from ._kvoffload import InvalidArgument, Job, TierJob, _check_derivation, _Worker

if TYPE_CHECKING:
    from . import SchedulerConfig, SharedTierConfig, Step

Key = Tuple[bytes, int]

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
