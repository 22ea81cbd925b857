"""kvoffload's events as vLLM's KV events (BlockStored, BlockRemoved), with kvoffload's media
as vLLM names them."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from kvoffload.engine.events import event_groups

# kvoffload's media as vLLM's KV events name them (vLLM 0.33's Medium and Locality; older
# vLLMs' events have no locality field and get none).
EVENT_MEDIA = {"host": ("CPU", "LOCAL"), "disk": ("STORAGE", "LOCAL"),
               "shared": ("STORAGE", "REMOTE")}


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
