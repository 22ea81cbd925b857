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
    built_with_cuda,
    cuda_device_count,
    merge_rank_scans,
)
from ._kvoffload import _parse_bytes  # noqa: F401  (engine/config.py reads byte sizes with it)

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

    def hint_continues(self, request_id: str, continues: bool) -> None:
        """The engine's hint that the request's conversation will go on (or not): policy
        "reuse" keeps its blocks longer (or gives them up first); others ignore it."""
        self._s.hint_continues(request_id, bool(continues))

    def set_time(self, seconds: float) -> None:
        """The clock policy "reuse" ages requests by (a replay's trace time); never going
        back. Without a call: seconds since the scheduler was made."""
        self._s.set_time(float(seconds))

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


# The worker side, in a module of its own (imported last: it names the classes above).
from .worker import (  # noqa: E402  (re-exported)
    DiskTierConfig,
    FinishedTransfer,
    KvTensor,
    Worker,
    WorkerConfig,
    derive_worker_config,
    stream_handle,
    tensor_of,
)
