"""SGLang's side of the config: which extra-config keys are SGLang's own (the rest is
kvoffload's schema, docs/configuration.md), what of HiCacheStorageConfig the backend refuses,
and where each page of SGLang's host pool lies (read from the pool's own zero-copy metadata,
so every layout it has is read as its own zero-copy backends read it)."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import kvoffload as kv

# Keys of the extra config that are SGLang's: how its dynamic backend finds this class, and
# its interface switch (the controller takes its prefetch_* keys out itself).
SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1")
# kvoffload's keys that mean something here (the schema's others are vLLM's: its copies
# overlap a forward pass, these are synchronous page copies).
OFFLOAD_KEYS = ("host_bytes", "host_blocks", "block_size", "eviction_policy", "store_threshold",
                "weights", "tiers", "timeout_ms")
WHERE = "--hicache-storage-backend-extra-config"


def offload_extra(extra: Any) -> Dict[str, Any]:
    """kvoffload's part of SGLang's extra config: SGLang's keys taken out, everything else
    checked by name."""
    if not isinstance(extra, dict):
        raise kv.InvalidArgument(f"{WHERE}: expected a JSON object, got {extra!r}")
    if extra.get("interface_v1") != 1:
        raise kv.InvalidArgument(f'{WHERE}: kvoffload needs "interface_v1": 1 (SGLang hands '
                                 "it page indices of its host pool; the tensor interface is not "
                                 "supported)")
    ours = {k: v for k, v in extra.items() if k not in SGLANG_KEYS}
    unknown = sorted(set(ours) - set(OFFLOAD_KEYS))
    if unknown:
        raise kv.InvalidArgument(f"{WHERE}: unknown key(s) {unknown}; kvoffload takes "
                                 f"{list(OFFLOAD_KEYS)} (docs/configuration.md) besides "
                                 f"SGLang's {list(SGLANG_KEYS)}")
    return ours


def storage_problems(cfg: Any) -> List[str]:
    """What of SGLang's HiCacheStorageConfig the backend is not proven with (an allow-list:
    each is refused at start, naming it)."""
    out = []
    if getattr(cfg, "is_mla_model", False):
        out.append("an MLA model (every rank holds the same KV; not proven)")
    for name in ("pp_size", "attn_cp_size", "dcp_size"):
        if int(getattr(cfg, name, 1) or 1) != 1:
            out.append(f"{name} {getattr(cfg, name)} (a page's key names only its tensor-"
                       "parallel rank)")
    if getattr(cfg, "should_split_heads", False) or getattr(cfg, "tp_lcm_size", None):
        out.append("split heads (tp_lcm_size): pages written under one split, read under another")
    return out


def page_buffers(pool: Any, index: Any = None) -> List[Tuple[int, int, int, int]]:
    """Each buffer of SGLang's host pool as (base address, pages, page bytes, stride): page p
    of buffer i is ``page bytes`` at ``base + p * stride``, as the pool's
    get_page_buffer_meta gives them (checked at the first, second and last page).
    ``index(lo, hi)``: the token slots lo..hi-1 as the pool takes them (default: a torch
    int64 tensor, as SGLang passes them)."""
    ps, pages = int(pool.page_size), int(pool.size) // int(pool.page_size)
    if pages < 2:
        raise kv.InvalidArgument(f"SGLang's host pool holds {pages} page(s)")

    if index is None:
        import torch

        def index(lo, hi):
            return torch.arange(lo, hi, dtype=torch.int64)

    def meta(p):
        ptrs, sizes = pool.get_page_buffer_meta(index(p * ps, (p + 1) * ps))
        return [int(x) for x in ptrs], [int(s) for s in sizes]

    first, sizes = meta(0)
    second, _ = meta(1)
    last, last_sizes = meta(pages - 1)
    out = []
    for i, (a, b, z) in enumerate(zip(first, second, last)):
        stride = b - a
        if stride < sizes[i] or z != a + (pages - 1) * stride or last_sizes[i] != sizes[i]:
            raise kv.InvalidArgument(
                f"SGLang's host pool (layout {getattr(pool, 'layout', '?')}): buffer {i}'s "
                "pages are not evenly spaced; this layout is not supported")
        out.append((a, pages, sizes[i], stride))
    return out


# SGLang's resolved config leaves that change what a KV page's bytes mean.
ENGINE_FACTS = ("revision", "quantization", "kv_cache_dtype", "json_model_override_args")


def engine_facts() -> Dict[str, Any]:
    """What SGLang's published runtime context says of the model (ENGINE_FACTS found in its
    "model" or "memory" namespaces); empty where it is not published (SGLang's code driven
    without a server)."""
    out: Dict[str, Any] = {}
    try:
        from sglang.srt import runtime_context as rc
    except ImportError:
        return out
    for getter in ("get_model", "get_memory"):
        try:
            bag = getattr(rc, getter)()
        except Exception:  # noqa: BLE001 - "not published", or an SGLang without it
            continue
        for leaf in ENGINE_FACTS:
            if leaf not in out:
                try:
                    out[leaf] = getattr(bag, leaf)
                except AttributeError:
                    pass
    return out
