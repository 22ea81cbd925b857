"""The counters kvoffload reports to an engine, and how to take them: ``counters_now``
reads a scheduler (with its tiers, labelled) or a worker; ``counters_since`` turns totals into
what each gained since the last report; ``metric_of`` splits a tier counter's key into its
metric and label."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

# The counters an engine reports (vLLM: its connector stats' log line, and /metrics as
# counters named vllm:kvoffload_<name>): the scheduler's counters, the workers' copies
# ("copy_"), and each tier's (label "tier").
METRICS = {
    "lookups": "Requests looked up in the offloaded cache.",
    "hits": "Key probes that found the key in host memory (a repeated lookup probes again).",
    "misses": "Key probes that did not find the key in host memory.",
    "hit_tokens": "Tokens lookups answered as cached (a repeated lookup counts again; within "
                  "a request's max_load_tokens).",
    "deferrals": "Lookups answered 'retry later' (a store or promotion of their blocks in flight).",
    "load_jobs": "Load jobs (host to GPU) issued.",
    "store_jobs": "Store jobs (GPU to host) issued.",
    "blocks_loaded": "Host blocks planned for loading into GPU memory.",
    "blocks_stored": "Host blocks stored from GPU memory.",
    "bytes_loaded": "Bytes planned for loading into GPU memory (all workers).",
    "bytes_stored": "Bytes stored from GPU memory (all workers).",
    "evictions": "Host blocks evicted.",
    "failed_loads": "Load jobs that failed (their blocks are recomputed).",
    "failed_stores": "Store jobs that failed (their blocks are not cached).",
    "partial_misses": "Cached blocks refused because a sub-block the request needs was never written.",
    "partial_stores": "Blocks stored without their leading sub-blocks (outside a sliding window).",
    "stores_skipped": "Blocks not stored: below the store threshold.",
    "stores_without_room": "Store attempts refused: no host block could be freed (retried).",
    "pressure_skips": "Blocks not stored because the workers' stores were behind (back-pressure).",
    "reused_sub_blocks": "GPU blocks left out of a store: the engine had freed them and handed them out "
                         "again (a window or mamba block of a running request).",
    "unsafe_skips": "Blocks not stored because what was written of them could never be served "
                    "(a full-attention block with a hole).",
    "unfinal_state_skips": "Mamba blocks not stored because they end past the tokens vLLM "
                           "computed in prefill (decode-time or draft-advanced states).",
    "copy_bytes_loaded": "Bytes the workers copied into GPU memory.",
    "copy_bytes_stored": "Bytes the workers copied out of GPU memory.",
    "copy_load_seconds": "Seconds the workers' load jobs took, summed over jobs.",
    "copy_store_seconds": "Seconds the workers' store jobs took, summed over jobs.",
    "copy_failed_jobs": "Copy jobs that failed on a worker.",
    "copy_stores_shed": "Store jobs a worker did not copy: its bound on store bytes held was reached.",
    "tier_hits": "Keys missed in host memory and found in the tier.",
    "tier_misses": "Keys missed in host memory and in the tier.",
    "tier_promotions": "Blocks promoted from the tier into host memory.",
    "tier_failed_promotions": "Promotions that failed (a miss: unreadable, forged or gone).",
    "tier_blocks_written": "Blocks written to the tier.",
    "tier_failed_writes": "Blocks whose write to the tier failed.",
    "tier_evictions": "Blocks evicted from the tier's index.",
}
SCHEDULER_COUNTERS = tuple(k for k in METRICS if not k.startswith(("copy_", "tier_")))
TIER_COUNTERS = tuple(k[len("tier_"):] for k in METRICS if k.startswith("tier_"))
WORKER_COUNTERS = {"copy_bytes_loaded": "bytes_loaded", "copy_bytes_stored": "bytes_stored",
                    "copy_load_seconds": "load_seconds", "copy_store_seconds": "store_seconds",
                    "copy_failed_jobs": "failed_jobs", "copy_stores_shed": "stores_shed"}


def counters_since(now: Dict[str, Any], seen: Dict[str, Any]) -> Dict[str, Any]:
    """What each counter gained since `seen` (which becomes `now`); a counter that went back
    (a reset) counts from 0."""
    out = {}
    for k, v in now.items():
        before = seen.get(k, 0)
        out[k] = v - before if v >= before else v
        seen[k] = v
    return out


def metric_of(key: str) -> Tuple[str, Optional[str]]:
    """A stats key's metric and tier label: "tier.shared.promotions" -> ("tier_promotions",
    "shared"); "hits" -> ("hits", None)."""
    if key.startswith("tier."):
        _, tier, name = key.split(".", 2)
        return "tier_" + name, tier
    return key, None


def counters_now(sched: Any = None, tier_labels: Optional[List[str]] = None,
                 worker: Any = None) -> Optional[Dict[str, Any]]:
    """The totals so far: a scheduler's counters and its tiers' ("tier.<label>.<name>"), or a
    worker's copies (names of METRICS); None without either."""
    if sched is not None:
        now = {k: v for k, v in sched.stats().items() if k in SCHEDULER_COUNTERS}
        for t, label in enumerate(tier_labels or []):
            ts = sched.tier_stats(t)
            now.update({f"tier.{label}.{k}": ts[k] for k in TIER_COUNTERS})
        return now
    if worker is not None:
        ws = worker.stats()
        return {name: ws[k] for name, k in WORKER_COUNTERS.items()}
    return None


def tier_labels(media: List[str]) -> List[str]:
    """Each tier's label: its medium, numbered where two tiers share one ("disk0", "disk1")."""
    return [m if media.count(m) == 1 else f"{m}{t}" for t, m in enumerate(media)]
