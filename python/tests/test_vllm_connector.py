"""kvoffload.vllm without vLLM: the module imports, its config helpers work, and asking for
the connector class says what is missing. (With vLLM: scripts/vllm-test.)"""

import importlib.util

import pytest

import kvoffload as kv
import kvoffload.vllm as kvv

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def test_bytes_in_config():
    assert kvv.parse_bytes(4096) == 4096
    assert kvv.parse_bytes("64GiB") == 64 << 30
    assert kvv.parse_bytes("1.5 MiB") == 3 << 19
    assert kvv.parse_bytes("2e9") == 2_000_000_000
    for bad in ("lots", "-1", 0, True, "12 parsecs"):
        with pytest.raises(kv.InvalidArgument, match="host_bytes"):
            kvv.parse_bytes(bad)


def test_scheduler_config_from_vllm_groups():
    groups = [("full_attention", 16, 0), ("sliding_window", 16, 32)]
    c = kvv.scheduler_config(groups, 16, 4096, {"block_size": 48, "host_bytes": "3MiB",
                                                "eviction_policy": "arc", "store_threshold": 2})
    assert c.block_size_factor == 3
    assert c.host_blocks == (3 << 20) // (4096 * 3)
    assert [(g.kind, g.gpu_block_size, g.sliding_window) for g in c.groups] == groups
    assert (c.policy, c.store_threshold, c.hash_block_size) == ("arc", 2, 16)
    # vLLM's own key for the host memory, and host_blocks directly.
    assert kvv.scheduler_config(groups, 16, 4096, {"cpu_bytes_to_use": 1 << 20}).host_blocks == 256
    assert kvv.scheduler_config(groups, 16, 4096, {"host_blocks": 7}).host_blocks == 7
    # The scheduler accepts what the helper builds; events follow vLLM's kv_events_config.
    kv.Scheduler(c)
    assert c.enable_events
    assert not kvv.scheduler_config(groups, 16, 4096, {"host_blocks": 7},
                                    enable_events=False).enable_events


@pytest.mark.parametrize("extra, message", [
    ({"block_size": 40, "host_blocks": 8}, "not a multiple of group 0"),
    ({}, "host_bytes"),
    ({"host_bytes": 100}, "0 host blocks"),
    ({"host_blocks": 8, "eviction_policy": "fifo"}, "eviction_policy"),
])
def test_scheduler_config_errors_name_the_key(extra, message):
    with pytest.raises(kv.InvalidArgument, match=message):
        kvv.scheduler_config([("full_attention", 16, 0)], 16, 4096, extra)


@pytest.mark.skipif(HAVE_VLLM, reason="checks the message shown without vLLM")
def test_connector_class_needs_vllm():
    with pytest.raises(ImportError, match="needs vLLM"):
        kvv.KvoffloadConnector  # noqa: B018
    with pytest.raises(AttributeError):
        kvv.NoSuchThing  # noqa: B018
