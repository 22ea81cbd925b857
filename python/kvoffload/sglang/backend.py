"""KvoffloadStorage: SGLang's HiCacheStorage over kvoffload.engine.page_store.PageStore.

SGLang constructs it with (HiCacheStorageConfig, kwargs), then registers its host pool; the
store is built then (the pages are the pool's). Its calls map one to one: ``batch_exists`` ->
PageStore.exists, ``batch_get_v1`` -> get, ``batch_set_v1`` -> set, ``clear`` -> reset.
A call never raises into SGLang's controller threads for a failure of the store: a get that
fails is a miss (all False), a set that fails is reported False (SGLang retries or drops it),
and both are counted (``get_stats``-independent: ``kvoffload_stats()``)."""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional

import kvoffload as kv
from kvoffload.engine.config import host_blocks, typed, weights_name
from kvoffload.engine.identity import model_identity
from kvoffload.engine.page_store import PageStore
from kvoffload.engine.scheduler import scheduler_config
from kvoffload.sglang.config import (
    WHERE,
    engine_facts,
    offload_extra,
    page_buffers,
    storage_problems,
)
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

logger = logging.getLogger("sglang.kvoffload")


class KvoffloadStorage(HiCacheStorage):
    def __init__(self, storage_config: Any, kwargs: Optional[Dict[str, Any]] = None):
        problems = storage_problems(storage_config)
        if problems:
            raise kv.InvalidArgument("kvoffload refuses this SGLang configuration (not proven "
                                     "with it): " + "; ".join(problems))
        self._cfg = storage_config
        self._extra = offload_extra(storage_config.extra_config or {})
        # Checked now, before SGLang starts serving: the whole schema is read again with the
        # pool's sizes in register_mem_pool_host.
        host_blocks(self._extra, 1, WHERE)
        scheduler_config([("full_attention", 1, 0)], 1, 1,
                         dict(self._extra, block_size=1, host_blocks=1), where=WHERE,
                         identity="check", tp_size=int(storage_config.tp_size))
        timeout_ms = typed(self._extra.get("timeout_ms", 5000), int, "timeout_ms")
        if timeout_ms <= 0:
            raise kv.InvalidArgument(f"{WHERE}: timeout_ms {timeout_ms} (a positive number of "
                                     "milliseconds a call may wait for a tier)")
        self._timeout = timeout_ms / 1000.0
        self._store: Optional[PageStore] = None
        self.mem_pool_host = None

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        if self._store is not None and mem_pool_host is self.mem_pool_host:
            return  # registered again (register_mem_host_pool_v2 of the same pool)
        super().register_mem_pool_host(mem_pool_host)
        pool, cfg = mem_pool_host, self._cfg
        ps = int(pool.page_size)
        if int(self._extra.get("block_size", ps)) != ps:
            raise kv.InvalidArgument(f"{WHERE}: block_size {self._extra['block_size']} is not "
                                     f"SGLang's page size {ps} (a key names one page)")
        buffers = page_buffers(pool)
        dtype = str(getattr(pool, "dtype", "?")).replace("torch.", "")
        facts = engine_facts()
        # The pool holds fp8 KV as uint8: its dtype cannot tell e4m3 from e5m2 pages. Without
        # SGLang's kv_cache_dtype, tiers (shared with other engines and restarts) are refused.
        itemsize = getattr(getattr(pool, "dtype", None), "itemsize", 2)
        if self._extra.get("tiers") and itemsize == 1 and "kv_cache_dtype" not in facts:
            raise kv.InvalidArgument(
                f"kvoffload: SGLang's host pool stores 1-byte KV ({dtype}) and SGLang's "
                "kv_cache_dtype is not published here, so pages of different fp8 formats "
                "would share keys in the tiers; run without tiers")
        identity = model_identity(
            str(cfg.model_name), facts.get("revision"), dtype, int(cfg.tp_size),
            kv_cache_dtype=facts.get("kv_cache_dtype", "auto"),
            quantization=facts.get("quantization"),
            overrides=None if facts.get("json_model_override_args") in (None, "", "{}")
            else facts["json_model_override_args"],
            weights=weights_name(self._extra), engine="sglang")
        extra = {k: v for k, v in self._extra.items() if k != "timeout_ms"}
        # Attention data parallelism: ranks of different groups share a tp_rank, so each
        # group's disk tier lives under path/dp<rank> (a directory belongs to one engine).
        dp_rank = int(getattr(cfg, "dp_rank", 0) or 0)
        config = scheduler_config([("full_attention", ps, 0)], ps,
                                  sum(b[2] for b in buffers), extra, where=WHERE,
                                  identity=identity, tp_size=int(cfg.tp_size),
                                  enable_events=False, dp_rank=dp_rank or None)
        # Pages of another layout, dtype or shape are other bytes: never read across them.
        note = (f"sglang:{getattr(pool, 'layout', '?')}:{dtype}:" +
                ",".join(f"{b[2]}/{b[3]}" for b in buffers))
        self._store = PageStore(config, buffers, tp_rank=int(cfg.tp_rank), layout_note=note,
                                timeout_s=self._timeout)
        logger.info("kvoffload: SGLang host pool of %d pages (%s) registered; identity %s; "
                    "restored %s", buffers[0][1], note, identity, self._store.restored)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """SGLang's side pools (mamba or sliding-window states, a draft model's KV): refused,
        since only the KV pool's pages are proven; the KV pool itself is taken as above."""
        if str(host_pool_name) != "kv":
            raise kv.InvalidArgument(f"kvoffload refuses SGLang's {host_pool_name} host pool "
                                     "(hybrid and draft models are not proven with it)")
        if self._store is None:
            self.register_mem_pool_host(host_pool)

    # ---- the zero-copy interface ----------------------------------------------------------

    def _pages(self, keys: List[str], host_indices: Any) -> Optional[List[int]]:
        ps = int(self.mem_pool_host.page_size)
        idx = [int(i) for i in host_indices[::ps].tolist()] if len(keys) else []
        if len(idx) != len(keys) or len(host_indices) != len(keys) * ps or any(i % ps for i in idx):
            logger.warning("kvoffload: %d keys with %d host indices (page size %d, aligned: "
                           "%s): refused", len(keys), len(host_indices), ps,
                           all(i % ps == 0 for i in idx))
            return None
        return [i // ps for i in idx]

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        store = self._store  # one reference: close() may run on another thread
        if store is None or not keys:
            return 0
        return store.exists(keys)

    def batch_get_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Any = None) -> List[bool]:
        store, pages = self._call(keys, host_indices)
        if pages is None:
            return [False] * len(keys)
        n = store.get(keys, pages)
        return [i < n for i in range(len(keys))]

    def batch_set_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Any = None) -> List[bool]:
        store, pages = self._call(keys, host_indices)
        if pages is None:
            return [False] * len(keys)
        return [store.set(keys, pages)] * len(keys)

    def _call(self, keys: List[str], host_indices: Any) -> Any:
        """The store (one reference: close() may run on another thread) and the pages, or
        pages None: no store yet, or indices that are not whole pages (refused, logged)."""
        store = self._store
        return store, (self._pages(keys, host_indices) if store is not None else None)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def clear(self) -> None:
        store = self._store
        if store is not None:
            store.reset()

    def kvoffload_stats(self) -> Dict[str, Any]:
        store = self._store
        return store.stats() if store is not None else {}

    def close(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            store.flush()

    # ---- the tensor interface: not used with interface_v1 ---------------------------------

    def _tensor_interface(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError('kvoffload serves SGLang through "interface_v1": 1 only '
                                  "(batch_get_v1 / batch_set_v1 with host indices)")

    get = batch_get = set = batch_set = _tensor_interface
