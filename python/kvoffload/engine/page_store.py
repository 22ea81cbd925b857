"""A key -> page store over kvoffload's scheduler and worker, for engines that hand the offloader
whole pages of their own host memory by index and ask by key (SGLang's HiCache storage tier;
any engine with a get/set/exists storage interface).

Each call is one short request to kv.Scheduler, run to its end before the call returns:

- ``set(keys, pages)``: the pages are the request's "GPU blocks", computed in one step; the
  scheduler's store job copies them into kvoffload's host pool, and the blocks are written
  through to every tier (disk, shared) as for any engine. Keys already held are not stored
  again.
- ``exists(keys)``: the scheduler's lookup, which probes the host cache, then each tier
  (promoting what a tier holds into host memory, so a ``get`` that follows is a host hit).
- ``get(keys, pages)``: the lookup, then a load job from kvoffload's host pool into the pages.

So every rule of the scheduler holds here too: blocks keyed by the weights' identity, KV layout,
rank and epoch (a reset makes every tier's old blocks unreachable), the shared tier's MAC,
deadlines on every tier. A call never waits past ``timeout_s`` for a tier: a promotion still
out then is a miss (the scheduler's promote_timeout_ms answers the same), and a tier write
still out finishes on the tier's threads. Copies between the engine's pages and the host pool
are memory copies on the worker's threads and are waited for: a page is never written after
the call that named it returned.

Thread-safe: one lock around the scheduler (engines call storage from several threads).
Page ``p`` of the engine is kvoffload's GPU block ``p + 1`` (block 0 is the null block): the
tensors are registered one page below their start, and block 0 is never copied.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

import kvoffload as kv
from kvoffload.engine.metrics import tier_labels


def key_bytes(key: Any) -> bytes:
    """An engine's key as a block hash: bytes as they are, a hex string (SGLang's page hashes)
    as its bytes, any other string as its SHA-256."""
    if isinstance(key, (bytes, bytearray)):
        return bytes(key)
    text = str(key)
    if len(text) % 2 == 0 and len(text) >= 16:
        try:
            return bytes.fromhex(text)
        except ValueError:
            pass
    return hashlib.sha256(text.encode()).digest()


def page_tensor(base: int, num_pages: int, page_bytes: int, stride: int) -> kv.KvTensor:
    """A KvTensor whose block ``p + 1`` is page ``p`` at ``base + p * stride`` (block 0, the
    null block, is never copied)."""
    if num_pages <= 0 or page_bytes <= 0 or stride < page_bytes:
        raise kv.InvalidArgument(f"page tensor: {num_pages} pages of {page_bytes} bytes every "
                                 f"{stride} bytes")
    return kv.KvTensor(base - stride, num_pages + 1, page_bytes, stride)


class PageStore:
    """``tensors``: per engine tensor, (base address, pages, page bytes, stride); every page
    index names the same page in each. ``config``: a SchedulerConfig of one full-attention
    group of ``page_tokens``-token blocks, factor 1 (engine.scheduler.scheduler_config); its
    disk tiers' slots are set here from the worker's files, and their index restored."""

    def __init__(self, config: kv.SchedulerConfig, tensors: Sequence[Tuple[int, int, int, int]],
                 tp_rank: int = 0, layout_note: str = "", timeout_s: float = 5.0):
        if len(config.groups) != 1 or config.block_size_factor != 1:
            raise kv.InvalidArgument("PageStore: one group of one page per block")
        self._page_tokens = config.groups[0].gpu_block_size
        self.num_pages = min(t[1] for t in tensors)
        kv_tensors = [page_tensor(*t) for t in tensors]
        self._worker = kv.Worker(kv.derive_worker_config(config, kv.WorkerConfig(
            tensors=kv_tensors, groups=[[(i, t[2]) for i, t in enumerate(tensors)]],
            backend="host", threads=2, defer_stores=False, tp_rank=tp_rank,
            layout_note=layout_note)))
        disk = [t for t, c in enumerate(config.tiers) if c.medium == "disk"]
        for t in disk:
            config.tiers[t].blocks = self._worker.tier_slots(t)
        self._sched = kv.Scheduler(config)
        self.restored = {}
        for t in disk:
            self.restored[t] = self._sched.restore_tier(t, self._worker.tier_scan(t))
            self._worker.release_tier_scan(t)
        self._timeout = timeout_s
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._tier_jobs: set = set()
        self.counters: Dict[str, int] = {"timeouts": 0, "failed_gets": 0, "failed_sets": 0}

    # ---- the calls -----------------------------------------------------------------------

    def exists(self, keys: Sequence[Any]) -> int:
        """How many leading keys are held (host memory or a tier)."""
        with self._lock:
            rid = None
            try:
                rid, hit = self._lookup(keys)
                return hit
            finally:
                if rid is not None:
                    self._sched.on_finished(rid)

    def get(self, keys: Sequence[Any], pages: Sequence[int]) -> int:
        """Fills pages[i] with keys[i]'s bytes for the leading keys held; returns how many.
        A failed copy returns 0 (the pages' contents are then undefined: the engine must not
        use them)."""
        if len(keys) != len(pages):
            raise kv.InvalidArgument(f"get: {len(keys)} keys for {len(pages)} pages")
        self._check_pages(pages)
        with self._lock:
            rid, hit = self._lookup(keys)
            try:
                if hit == 0:
                    return 0
                blocks = [p + 1 for p in pages[:hit]] + [0]  # the +1 token's block: null
                self._sched.on_allocated(rid, [kv.AllocatedGroup(blocks)],
                                         hit * self._page_tokens)
                step = self._sched.build_step(
                    [kv.ScheduledRequest(rid, hit * self._page_tokens, 0, [blocks])])
                if not self._run(step):
                    self.counters["failed_gets"] += 1
                    return 0
                return hit
            finally:
                self._sched.on_finished(rid)

    def set(self, keys: Sequence[Any], pages: Sequence[int]) -> bool:
        """Stores each page under its key (keys held already are kept as they are); True only
        once kvoffload's host memory holds every key (checked by a lookup after the store: a
        store the scheduler skipped, for want of room or below a store threshold, is False and
        counted in ``failed_sets``). The tiers' writes follow on their threads."""
        if len(keys) != len(pages):
            raise kv.InvalidArgument(f"set: {len(keys)} keys for {len(pages)} pages")
        self._check_pages(pages)
        if not keys:
            return True
        with self._lock:
            deadline = time.monotonic() + self._timeout
            for attempt in range(2):
                if self._store_once(keys, pages) and self._held(keys) == len(keys):
                    return True
                # Host blocks still read by tier writes cannot be evicted: let those finish
                # (within the deadline), then try once more.
                if attempt == 0:
                    self._drain(deadline)
            self.counters["failed_sets"] += 1
            return False

    def reset(self, weights: Optional[str] = None) -> None:
        """Nothing stored before is found again: a new epoch in every tier (``weights``: the
        new identity, needed with tiers), and the disk tiers emptied."""
        with self._lock:
            if self._sched.config.tiers:
                # Random, never a counter: every restart's first reset would share it.
                self._sched.reset_cache(
                    weights or f"{self._sched.config.weights}#reset-{uuid.uuid4().hex}")
                self._worker.clear_tiers()
            else:
                self._sched.reset_cache()
            self._tier_jobs.clear()

    def flush(self, timeout_s: Optional[float] = None) -> bool:
        """Waits (at most ``timeout_s``) until no tier job is out; True if none is."""
        deadline = time.monotonic() + (self._timeout if timeout_s is None else timeout_s)
        with self._lock:
            return self._drain(deadline)

    def stats(self) -> Dict[str, Any]:
        with self._lock:
            out = dict(self._sched.stats())
            media = [c.medium for c in self._sched.config.tiers]
            for t, label in enumerate(tier_labels(media)):  # named as the vLLM connector's
                out.update({f"tier.{label}.{k}": v
                            for k, v in self._sched.tier_stats(t).items()})
            out.update(self.counters)
            return out

    # ---- inside the lock -----------------------------------------------------------------

    def _check_pages(self, pages: Sequence[int]) -> None:
        bad = [p for p in pages if not 0 <= int(p) < self.num_pages]
        if bad:
            raise kv.InvalidArgument(f"page {bad[0]} is outside the {self.num_pages} pages")
        if len(set(pages)) != len(pages):
            raise kv.InvalidArgument("a page is named twice in one call")

    def _drain(self, deadline: float) -> bool:
        """Pumps until no job is out, or the deadline (counted in ``timeouts``)."""
        while True:
            self._pump()
            if self._sched.num_jobs_in_flight == 0:
                return True
            if time.monotonic() > deadline:
                self.counters["timeouts"] += 1
                return False
            time.sleep(0.002)

    def _store_once(self, keys: Sequence[Any], pages: Sequence[int]) -> bool:
        """One store request: the lookup first, as an engine's (a shared tier's existence
        check, so keys the fleet holds are not written again; a store or promotion of these
        keys by another call), then the pages as the request's computed blocks."""
        n = len(keys)
        rid = self._request(keys, n * self._page_tokens)
        try:
            if self._wait_lookup(rid) is None:
                return False
            blocks = [p + 1 for p in pages]
            self._sched.on_allocated(rid, [kv.AllocatedGroup(blocks)], 0)
            step = self._sched.build_step(
                [kv.ScheduledRequest(rid, 0, n * self._page_tokens, [blocks])])
            return self._run(step)
        finally:
            self._sched.on_finished(rid)
            self._pump()  # the writes through to the tiers start now

    def _held(self, keys: Sequence[Any]) -> int:
        """The leading keys host memory or a tier holds now."""
        rid, hit = self._lookup(keys)
        self._sched.on_finished(rid)
        return hit

    def _request(self, keys: Sequence[Any], tokens: int) -> str:
        rid = f"page-store-{next(self._ids)}"
        self._sched.update_request(rid, tokens, [key_bytes(k) for k in keys])
        return rid

    def _lookup(self, keys: Sequence[Any]) -> Tuple[str, int]:
        """A request for ``keys`` and the leading keys it hits, in pages. One token past the
        last page, so that every page can be a hit (an engine computes at least one token)."""
        rid = self._request(keys, len(keys) * self._page_tokens + 1)
        hit = self._wait_lookup(rid) if keys else 0
        return rid, (hit or 0) // self._page_tokens

    def _wait_lookup(self, rid: str) -> Optional[int]:
        """The lookup, asked again while it says "retry later" (a promotion or an existence
        check out), each time after the tier jobs are pumped; None past the deadline."""
        deadline = time.monotonic() + self._timeout
        delay = 0.0005
        while True:
            hit = self._sched.lookup(rid, 0)
            if hit is not None:
                return hit
            if time.monotonic() > deadline:
                self.counters["timeouts"] += 1
                return None
            self._pump()
            time.sleep(delay)
            delay = min(delay * 2, 0.01)

    def _pump(self) -> None:
        """Takes the tier jobs the scheduler planned and starts them; reports finished ones."""
        step = self._sched.build_step([])
        for job in step.tier_jobs:
            self._worker.submit_tier(job)
            self._tier_jobs.add(job.id)
        self._report(self._worker.get_finished())

    def _run(self, step: Any) -> bool:
        """Runs a step's copies to their end (memory copies: no deadline needed) and its tier
        jobs in the background; True if every copy was reported, and ok. Whatever raises, the
        copies submitted are waited for first: no page is written after the call returns."""
        if step.flush:
            self._worker.wait(step.flush)
        ids: List[int] = []
        try:
            for job in list(step.load_jobs) + list(step.store_jobs):
                self._worker.submit(job)
                ids.append(job.id)
            for job in step.tier_jobs:
                self._worker.submit_tier(job)
                self._tier_jobs.add(job.id)
        finally:
            if ids:
                self._worker.wait(sorted(ids))
        finished = self._worker.get_finished()
        self._report(finished)
        done = {f.job: f.ok for f in finished}
        return all(done.get(i, False) for i in ids)

    def _report(self, finished: List[Any]) -> None:
        if finished:
            for f in finished:
                self._tier_jobs.discard(f.job)
            self._sched.on_completed([kv.JobReport(f.job, ok=f.ok) for f in finished])
