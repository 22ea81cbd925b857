"""kvoffload's events (Scheduler.take_events) grouped the way an engine publishes them: runs
of one kind and medium, split by KV-cache group, partly written blocks left out."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

def event_groups(events: Sequence[Any], partly_written: Any) -> List[Tuple[bool, str, int,
                                                                           List[bytes]]]:
    """kvoffload's events as (removed, medium, group, hashes): consecutive events of one kind
    and medium merged, then split by group (first seen first). ``partly_written(keys)`` says,
    per key, whether host memory holds it without its leading sub-blocks now: such a block is
    never published as stored (a router must not take it for a whole block; asked when the
    events are taken, so a key evicted and stored again in between is judged by what it is
    now). Removals are all published (a router drops what it does not hold). A shared tier's
    removals are not: they mean this engine's index of the cluster forgot a key, not that the
    cluster lost it. The vLLM connector takes the same from C++ (VllmBridge.events)."""
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
