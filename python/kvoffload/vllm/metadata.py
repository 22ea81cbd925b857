"""What the connector's scheduler and workers send each other through vLLM (pickled between its
engine-core process and its workers): one step's jobs, and the workers' finished jobs, disk
scans and store pressure. Defined over vLLM's base classes when the connector is first looked
up."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple


def define(KVConnectorMetadata: Any, KVConnectorWorkerMetadata: Any) -> Tuple[Any, Any]:  # noqa: N803
    class KvoffloadConnectorMetadata(KVConnectorMetadata):
        """One step's jobs, scheduler -> workers (kv.Job objects pickle)."""

        def __init__(self, load_jobs: List[Any], store_jobs: List[Any], flush: List[int],
                     tier_jobs: Optional[List[Any]] = None, clear_tiers: bool = False):
            self.load_jobs = load_jobs
            self.store_jobs = store_jobs
            self.flush = flush
            self.tier_jobs = tier_jobs or []  # promotions and tier writes (kv.TierJob)
            # reset_cache: once the flush set finished, the workers empty their disk tiers.
            self.clear_tiers = clear_tiers

    class KvoffloadWorkerMetadata(KVConnectorWorkerMetadata):
        """Workers -> scheduler: finished job ids with a count and whether all succeeded;
        once, in a worker's first step, what its disk tiers found at start (``scans``: rank ->
        tier -> Worker.tier_scan, a key or None per slot)."""

        def __init__(self, completed: Optional[Dict[int, Tuple[int, bool]]] = None,
                     scans: Optional[Dict[int, Dict[int, List[Any]]]] = None,
                     pressure: bool = False):
            self.completed: Dict[int, Tuple[int, bool]] = dict(completed or {})
            self.scans = dict(scans or {})
            self.pressure = pressure  # the worker's stores are behind (Worker.store_pressure)

        def aggregate(self, other: "KVConnectorWorkerMetadata") -> "KVConnectorWorkerMetadata":
            merged = dict(self.completed)
            for job, (count, ok) in getattr(other, "completed", {}).items():
                c, o = merged.get(job, (0, True))
                merged[job] = (c + count, o and ok)
            return KvoffloadWorkerMetadata(merged, {**self.scans,
                                                    **(getattr(other, "scans", None) or {})},
                                           self.pressure or getattr(other, "pressure", False))

    return KvoffloadConnectorMetadata, KvoffloadWorkerMetadata
