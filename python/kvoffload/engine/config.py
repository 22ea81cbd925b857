"""The offload config's values, read the same way for every engine: byte sizes, typed fields,
host memory, the eviction policy and the store bound. The keys are documented once, in
docs/configuration.md; each adapter passes its engine's extra config (vLLM's
``kv_connector_extra_config``, SGLang's ``--hicache-storage-backend-extra-config``) here."""

from __future__ import annotations

from typing import Any, Dict

import kvoffload as kv


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


def typed(value: Any, kind: type, field: str) -> Any:
    """A config value as the field's type: booleans only from JSON booleans (bool("false") is
    True), integers from integers or digit strings (not from booleans), strings from strings."""
    ok = (isinstance(value, bool) if kind is bool else
          (isinstance(value, int) and not isinstance(value, bool)) or
          (isinstance(value, str) and value.strip().lstrip("-").isdigit()) if kind is int else
          isinstance(value, str))
    if not ok:
        raise kv.InvalidArgument(f"{field}: {value!r} is not a {kind.__name__}")
    return kind(value)


def host_blocks(extra: Dict[str, Any], bytes_per_host_block: int, where: str) -> int:
    """The host blocks the config asks for: ``host_blocks``, or ``host_bytes`` (vLLM's
    ``cpu_bytes_to_use`` too) over the bytes of one host block. ``where`` names the engine's
    config in messages."""
    if "host_blocks" in extra:
        n = int(extra["host_blocks"])
    else:
        key = "host_bytes" if "host_bytes" in extra else "cpu_bytes_to_use"
        if key not in extra:
            raise kv.InvalidArgument(f"{where}: set host_bytes (e.g. \"64GiB\") or host_blocks")
        if bytes_per_host_block <= 0:
            raise kv.InvalidArgument("the KV cache has no bytes per block")
        n = parse_bytes(extra[key], key) // bytes_per_host_block
    if n <= 0:
        raise kv.InvalidArgument(f"host memory holds {n} host blocks; give it more")
    return n


def eviction_policy(extra: Dict[str, Any]) -> str:
    policy = str(extra.get("eviction_policy", "lru"))
    if policy not in ("lru", "arc", "reuse"):
        raise kv.InvalidArgument(f"eviction_policy: {policy!r} (lru, arc or reuse)")
    return policy


def weights_name(extra: Dict[str, Any]) -> Any:
    """The config's "weights" (a checkpoint digest standing in for model and revision), or
    None."""
    if "weights" not in extra:
        return None
    weights = typed(extra["weights"], str, "weights")
    if not weights:
        raise kv.InvalidArgument("weights: empty (name the weights, or leave it out)")
    return weights


def max_store_bytes(extra: Dict[str, Any]) -> int:
    """``max_store_bytes_in_flight``: 0 (no bound) or bytes."""
    bound = extra.get("max_store_bytes_in_flight", 0)
    return 0 if bound in (0, "0") else parse_bytes(bound, "max_store_bytes_in_flight")
