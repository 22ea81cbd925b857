"""pytest plugin for vLLM's own offloading-connector tests on a machine without a GPU.

vLLM refuses the hybrid KV cache manager on a platform it does not recognise, and its CI runs
these tests on CUDA machines. The tests themselves never touch a GPU, so this plugin makes the
current platform report hybrid KV cache support, as vLLM's CUDA platform does. Loaded by
scripts/vllm-test with `-p vllm_cpu_plugin`.
"""

import pytest


@pytest.fixture(autouse=True)
def _hybrid_kv_cache_supported(monkeypatch):
    from vllm.platforms import current_platform

    monkeypatch.setattr(
        type(current_platform), "support_hybrid_kv_cache", classmethod(lambda cls: True)
    )
    yield
