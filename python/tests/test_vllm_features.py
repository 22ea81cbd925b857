"""The engine-feature allow-list (kvoffload.vllm.features, issue 47) on configurations shaped
like vLLM's: dataclasses, so the unknown-field and unknown-config rules run as on a real
VllmConfig. tests/vllm/engine_features.py runs the same check in real engines."""

import dataclasses
from typing import Any, Optional

import pytest

import kvoffload as kv
from kvoffload.vllm.features import engine_feature_problems


@dataclasses.dataclass
class CacheConfig:
    hash_block_size: Optional[int] = dataclasses.field(default=None, init=False)  # derived
    block_size: int = 16
    cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    mamba_cache_mode: str = "none"
    kv_sharing_fast_prefill: bool = False
    prefix_cache_retention_interval: int = 0


@dataclasses.dataclass
class SchedulerConfig:
    async_scheduling: bool = False
    scheduler_cls: Optional[str] = None


@dataclasses.dataclass
class ModelConfig:
    dtype: str = "float32"
    runner_type: str = "generate"
    enable_prompt_embeds: bool = False
    multimodal_config: Any = None
    enable_sleep_mode: bool = False


@dataclasses.dataclass
class ParallelConfig:
    pipeline_parallel_size: int = 1
    decode_context_parallel_size: int = 1


@dataclasses.dataclass
class SpeculativeConfig:
    method: str = "ngram"


@dataclasses.dataclass
class VllmConfig:
    cache_config: CacheConfig = dataclasses.field(default_factory=CacheConfig)
    scheduler_config: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
    model_config: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    parallel_config: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    speculative_config: Optional[SpeculativeConfig] = None
    kv_transfer_config: Any = None
    kv_events_config: Any = None
    lora_config: Any = None
    engram_config: Any = None  # a config this module has never heard of
    additional_config: Any = dataclasses.field(default_factory=dict)
    device_config: Any = dataclasses.field(default_factory=object)  # every engine has one


def problems(config, kinds=("FullAttentionSpec",), drafts=()):
    return engine_feature_problems(config, list(kinds), list(drafts))


def test_a_plain_engine_is_accepted():
    assert problems(VllmConfig(kv_transfer_config=object(), kv_events_config=object())) == []
    derived = CacheConfig()
    derived.hash_block_size = 32  # vLLM sets derived fields (init=False) itself
    assert problems(VllmConfig(cache_config=derived)) == []
    mamba = VllmConfig(cache_config=CacheConfig(mamba_cache_mode="align"))
    assert problems(mamba, ("FullAttentionSpec", "MambaSpec")) == []
    assert problems(VllmConfig(speculative_config=SpeculativeConfig("ngram"))) == []
    for dtype in ("fp8", "fp8_e4m3", "fp8_e5m2", "float32"):  # proven; the model's own
        assert problems(VllmConfig(cache_config=CacheConfig(cache_dtype=dtype))) == []


@pytest.mark.parametrize("config, kinds, words", [
    # issue 47's case: ngram drafts on a mamba model served a decode-time state
    (VllmConfig(speculative_config=SpeculativeConfig("ngram"),
                cache_config=CacheConfig(mamba_cache_mode="align")),
     ("MambaSpec",), ["speculative decoding (ngram) with mamba", "--speculative-config"]),
    (VllmConfig(speculative_config=SpeculativeConfig("eagle3")), ("FullAttentionSpec",),
     ["method 'eagle3'", "proven: ngram"]),
    (VllmConfig(scheduler_config=SchedulerConfig(async_scheduling=True)), ("FullAttentionSpec",),
     ["async scheduling", "--no-async-scheduling"]),
    (VllmConfig(scheduler_config=SchedulerConfig(scheduler_cls="my.Scheduler")),
     ("FullAttentionSpec",), ["custom scheduler class"]),
    (VllmConfig(cache_config=CacheConfig(cache_dtype="fp8_inc")), ("FullAttentionSpec",),
     ["KV-cache dtype 'fp8_inc'", "--kv-cache-dtype auto"]),
    (VllmConfig(cache_config=CacheConfig(mamba_cache_mode="all")), ("MambaSpec",),
     ["mamba_cache_mode 'all'", "--mamba-cache-mode align"]),
    # the allow-list: a cache field away from its default that the module does not know
    (VllmConfig(cache_config=CacheConfig(prefix_cache_retention_interval=4)),
     ("FullAttentionSpec",), ["cache_config.prefix_cache_retention_interval = 4",
                              "does not know"]),
    (VllmConfig(cache_config=CacheConfig(kv_sharing_fast_prefill=True)), ("FullAttentionSpec",),
     ["cache_config.kv_sharing_fast_prefill"]),
    # ... and a top-level config it has never heard of, or knows to be unproven
    (VllmConfig(engram_config=object()), ("FullAttentionSpec",),
     ["engram_config is set", "does not know"]),
    (VllmConfig(lora_config=object()), ("FullAttentionSpec",), ["LoRA", "--enable-lora"]),
    (VllmConfig(additional_config={"platform_knob": 1}), ("FullAttentionSpec",),
     ["additional_config is set"]),
    (VllmConfig(model_config=ModelConfig(enable_prompt_embeds=True)), ("FullAttentionSpec",),
     ["--enable-prompt-embeds"]),
    (VllmConfig(model_config=ModelConfig(runner_type="pooling")), ("FullAttentionSpec",),
     ["runner 'pooling'"]),
    (VllmConfig(model_config=ModelConfig(multimodal_config=object())), ("FullAttentionSpec",),
     ["multimodal"]),
    (VllmConfig(model_config=ModelConfig(enable_sleep_mode=True)), ("FullAttentionSpec",),
     ["--enable-sleep-mode"]),
    (VllmConfig(parallel_config=ParallelConfig(pipeline_parallel_size=2)), ("FullAttentionSpec",),
     ["pipeline_parallel_size 2", "--pipeline-parallel-size 1"]),
    (VllmConfig(parallel_config=ParallelConfig(decode_context_parallel_size=2)),
     ("FullAttentionSpec",), ["decode_context_parallel_size 2"]),
])
def test_each_unproven_feature_is_refused_by_name(config, kinds, words):
    got = problems(config, kinds)
    assert len(got) == 1, got
    for w in words:
        assert w in got[0], (w, got[0])


def test_mamba_with_finer_prefix_hits_is_refused():
    mamba = VllmConfig(cache_config=CacheConfig(mamba_cache_mode="align"))
    got = engine_feature_problems(mamba, ["FullAttentionSpec", "MambaSpec"], (), [64], 32)
    assert len(got) == 1 and "prefix hits aligned to 32 tokens with mamba blocks of 64" in got[0]
    assert engine_feature_problems(mamba, ["MambaSpec"], (), [64], 64) == []
    assert engine_feature_problems(mamba, ["MambaSpec"], (), [64], None) == []  # before 0.32


def test_draft_model_groups_and_several_features_are_all_named():
    config = VllmConfig(scheduler_config=SchedulerConfig(async_scheduling=True),
                        lora_config=object())
    got = problems(config, ("FullAttentionSpec", "FullAttentionSpec"), drafts=(1,))
    assert len(got) == 3
    assert "KV-cache group 1 holds a draft model's KV" in got[0]


def test_the_connector_refuses_at_start_with_every_problem():
    import types

    from kvoffload.vllm import check_engine_features

    spec = type("MambaSpec", (), {"block_size": 16})()
    kv_cache_config = types.SimpleNamespace(
        kv_cache_groups=[types.SimpleNamespace(kv_cache_spec=spec)])
    config = VllmConfig(speculative_config=SpeculativeConfig("ngram"),
                        cache_config=CacheConfig(mamba_cache_mode="align"),
                        scheduler_config=SchedulerConfig(async_scheduling=True))
    with pytest.raises(kv.InvalidArgument) as e:
        check_engine_features(config, kv_cache_config)
    assert "kvoffload refuses this vLLM configuration" in str(e.value)
    assert "with mamba layers" in str(e.value) and "--no-async-scheduling" in str(e.value)


def test_the_connector_reads_vllms_hit_alignment():
    """check_engine_features takes cache_hit_alignment_tokens from vLLM's KV-cache config (set
    there before the connectors are built, 0.32+), and the mamba block sizes from the specs."""
    import types

    from kvoffload.vllm import check_engine_features

    spec = type("MambaSpec", (), {"block_size": 64})()
    config = VllmConfig(cache_config=CacheConfig(mamba_cache_mode="align"))
    for alignment, refused in ((32, True), (64, False), (None, False)):
        kv_cache_config = types.SimpleNamespace(
            kv_cache_groups=[types.SimpleNamespace(kv_cache_spec=spec)],
            cache_hit_alignment_tokens=alignment)
        if refused:
            with pytest.raises(kv.InvalidArgument, match="prefix hits aligned to 32 tokens"):
                check_engine_features(config, kv_cache_config)
        else:
            check_engine_features(config, kv_cache_config)
