"""The scheduler's config from an engine's KV-cache groups and its offload config: the one
place every adapter builds kv.SchedulerConfig."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import kvoffload as kv
from kvoffload.engine.config import eviction_policy, host_blocks
from kvoffload.engine.tiers import tier_configs

def scheduler_config(groups: Sequence[Tuple[str, int, int]], hash_block_size: int,
                     bytes_per_gpu_block: int, extra: Dict[str, Any],
                     num_workers: int = 1, enable_events: bool = True,
                     identity: str = "", tp_size: int = 1,
                     prefix_caching: bool = True,
                     dp_rank: Optional[int] = None,
                     where: str = "kv_connector_extra_config") -> kv.SchedulerConfig:
    """The kv.SchedulerConfig for the engine's KV-cache groups ((kind, gpu block size, sliding
    window in tokens) each) and its offload config ``extra`` (named ``where`` in messages);
    ``identity`` is the weights' (model_identity), ``tp_size`` the tensor-parallel size,
    ``prefix_caching`` whether the engine shares blocks between requests (only then are lookups
    of keys another request is loading deferred, as vLLM's own connector does: without it
    nothing would reuse that load)."""
    if not groups:
        raise kv.InvalidArgument("engine config: no KV-cache groups")
    gpu_block = groups[0][1]
    offloaded = int(extra.get("block_size", gpu_block))
    for g, (_, size, _) in enumerate(groups):
        if offloaded % size != 0:
            raise kv.InvalidArgument(f"block_size: {offloaded} tokens is not a multiple of group "
                                     f"{g}'s GPU block size {size}")
    factor = offloaded // gpu_block
    host = host_blocks(extra, bytes_per_gpu_block * factor, where)
    return kv.SchedulerConfig(
        groups=[kv.GroupConfig(kind, size, window) for kind, size, window in groups],
        host_blocks=host, block_size_factor=factor, hash_block_size=hash_block_size,
        num_workers=num_workers, prefix_caching=prefix_caching, policy=eviction_policy(extra),
        store_threshold=int(extra.get("store_threshold", 0)), enable_events=enable_events,
        block_bytes=max(0, bytes_per_gpu_block * factor),  # the byte counters of the stats
        tiers=tier_configs(extra.get("tiers", []), identity, tp_size, host, dp_rank),
        weights=identity)
