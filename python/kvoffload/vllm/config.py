"""vLLM's objects read for the engine-neutral layer: its KV-cache groups as (kind, block size,
window), the tokens a block hash covers, the features the connector refuses
(kvoffload.vllm.features), its per-request kv_transfer_params, and the data- and
tensor-parallel ranks."""

from __future__ import annotations

import re
from typing import Any, Optional, Sequence, Tuple

import kvoffload as kv
from kvoffload.vllm.features import engine_feature_problems

def token_param(params: Any, name: str) -> int:
    """A per-request token count from vLLM's kv_transfer_params, read as vLLM's own offloading
    connector reads it: a non-negative int, else ignored (-1)."""
    value = params.get(name) if isinstance(params, dict) else None
    return value if type(value) is int and value >= 0 else -1


def continues_param(params: Any) -> int:
    """kv_transfer_params "kvoffload_continues": True (the conversation goes on: its blocks are
    kept longer under policy reuse) 1, False 0, anything else or absent -1 (no hint)."""
    value = params.get("kvoffload_continues") if isinstance(params, dict) else None
    return int(value) if type(value) is bool else -1


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
    47: an allow-list, kvoffload.vllm.features), naming every such feature and what to
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


def dp_rank(pc: Any) -> Optional[int]:
    """This engine's data-parallel rank where there are several engines, else None. vLLM
    resets data_parallel_size and data_parallel_rank to 1 and 0 inside each engine of a dense
    model (independent engines); data_parallel_index keeps the rank (0.21 and 0.33)."""
    index = getattr(pc, "data_parallel_index", None)
    if index is None:
        index = getattr(pc, "data_parallel_rank", 0)
    index = int(index or 0)
    size = int(getattr(pc, "data_parallel_size", 1) or 1)
    return index if size > 1 or index > 0 else None


def tp_rank(tp_size: int) -> int:
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
