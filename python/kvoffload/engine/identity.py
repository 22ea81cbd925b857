"""The weights' identity every tier keys blocks by (SchedulerConfig.weights: the shared tier's
namespace, the disk tier's directory, the key's MAC): blocks of another model, revision,
dtype, KV-cache dtype, quantization, config overrides or tensor-parallel split are never
found. The worker adds the KV layout (Worker.layout_description) and its rank; a reset adds a
random epoch."""

from __future__ import annotations

import hashlib
from typing import Any, Optional


def model_identity(model: str, revision: Optional[str], dtype: Any, tp_size: int,
                   kv_cache_dtype: Any = "auto", quantization: Optional[str] = None,
                   overrides: Any = None, weights: Optional[str] = None,
                   engine: str = "vllm") -> str:
    """``engine`` names whose model path this is ("vllm", "sglang"): one path served by two
    engines may load different weights. ``weights`` (the config's) stands for engine, model
    and revision; the rest still comes from the engine's config, since it changes the KV's
    bytes but not their size."""
    what = weights if weights is not None else f"{engine}:{model}@{revision or 'default'}"
    text = (f"{what}:{str(dtype).replace('torch.', '')}"
            f":kv-{kv_cache_dtype}:q-{quantization or 'none'}:tp{tp_size}")
    if overrides:
        text += ":ov-" + hashlib.sha256(repr(overrides).encode()).hexdigest()[:16]
    return text
