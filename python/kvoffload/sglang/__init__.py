"""kvoffload as SGLang's HiCache storage tier (L3), loaded by SGLang's ``dynamic`` backend by
module path, with no patch to SGLang:

    python -m sglang.launch_server --model-path MODEL --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic --hicache-storage-backend-extra-config '{
          "backend_name": "kvoffload", "module_path": "kvoffload.sglang",
          "class_name": "KvoffloadStorage", "interface_v1": 1,
          "host_bytes": "4GiB", "tiers": [{"medium": "disk", "path": "/nvme/kv",
                                           "capacity_bytes": "500GiB"}]}'

The rest of the extra config is kvoffload's one offload-config schema (docs/configuration.md),
the same as the vLLM connector's. The backend is a thin adapter over the engine-neutral layer:
``config`` reads SGLang's HiCacheStorageConfig and refuses what is not proven (MLA, pipeline
or context parallelism, split heads), ``backend`` maps HiCacheStorage's zero-copy calls
(``batch_exists``, ``batch_get_v1``, ``batch_set_v1``: keys and page indices of SGLang's host
pool) onto kvoffload.engine.page_store.PageStore. SGLang is imported only when the backend
class is first looked up, so ``import kvoffload.sglang`` works without it.
"""

from __future__ import annotations

from kvoffload.sglang.config import (  # noqa: F401  (re-exported)
    SGLANG_KEYS,
    offload_extra,
    page_buffers,
    storage_problems,
)


def __getattr__(name: str):
    if name == "KvoffloadStorage":
        from kvoffload.sglang.backend import KvoffloadStorage

        return KvoffloadStorage
    raise AttributeError(f"module 'kvoffload.sglang' has no attribute {name!r}")
