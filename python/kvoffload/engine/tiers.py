"""The config's "tiers": the media below host memory, nearest first, as kv.TierConfig objects.
One schema for every engine (docs/configuration.md, "Tiers"): a disk tier
(DISK_TIER_KEYS) or a shared tier on a Valkey/Redis cluster (SHARED_TIER_KEYS), each with any
of TIER_INDEX_KEYS. Secrets come from files or environment variables, never from the config
itself (an engine logs its config)."""

from __future__ import annotations

import os
from typing import Any, List, Optional

import kvoffload as kv
from kvoffload.engine.config import parse_bytes, typed

# A shared tier's keys in the extra config: the SharedTierConfig's fields (tp_rank and tp_size
# come from the engine) and the scheduler's index of the tier (TierConfig).
DISK_TIER_KEYS = ("path", "capacity_bytes", "io", "io_depth", "io_threads", "direct_io")
SHARED_TIER_KEYS = (
    "nodes", "name", "connect_timeout_ms", "reply_timeout_ms", "in_flight", "secret_file",
    "secret_env", "insecure", "username", "password_file", "password_env", "tls", "tls_ca_file",
    "tls_cert_file", "tls_key_file", "tls_server_name", "ttl_seconds", "only_seeds")
TIER_INDEX_KEYS = ("blocks", "policy", "store_threshold", "write_queue_blocks", "write_back",
                   "write_back_free_blocks", "promote_timeout_ms")


def tier_configs(tiers: Any, identity: str, tp_size: int, host_blocks: int,
                 dp_rank: Optional[int] = None) -> List[kv.TierConfig]:
    """The config's "tiers" as kv.TierConfig objects, nearest first. A disk tier's
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
            path = typed(spec["path"], str, f"{where}.path")
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
                setattr(store, key, typed(spec[key], type(getattr(store, key)), f"{where}.{key}"))
        index = {k: typed(spec[k], type(getattr(kv.TierConfig(blocks=1), k)), f"{where}.{k}")
                 for k in index_keys if k in spec}
        if medium == "disk":
            index["blocks"] = 1
        else:
            # The keys the scheduler remembers as present in the cluster (its presence cache).
            index.setdefault("blocks", max(1024, 4 * host_blocks))
        out.append(kv.TierConfig(medium=medium, store=store, **index))
    return out
