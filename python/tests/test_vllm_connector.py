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
def test_groups_from_vllm_specs_keep_the_retained_window():
    # vLLM's KV-cache specs are matched by class name; these stand-ins carry the same fields.
    class SlidingWindowSpec:
        block_size, sliding_window, extra_retained_tokens = 32, 64, 3

    class FullAttentionSpec:
        block_size, sliding_window = 16, None

    class MambaSpec:
        block_size = 16

    class ChunkedLocalAttentionSpec:
        block_size = 16

    # The window vLLM's block manager keeps: 64 plus the 3 tokens retained below it.
    assert kvv.group_of_spec(0, SlidingWindowSpec()) == ("sliding_window", 32, 67)
    assert kvv.group_of_spec(1, FullAttentionSpec()) == ("full_attention", 16, 0)
    assert kvv.group_of_spec(2, MambaSpec()) == ("mamba", 16, 0)
    with pytest.raises(kv.InvalidArgument, match="KV-cache group 3: ChunkedLocalAttentionSpec"):
        kvv.group_of_spec(3, ChunkedLocalAttentionSpec())


def test_connector_class_needs_vllm():
    with pytest.raises(ImportError, match="needs vLLM"):
        kvv.KvoffloadConnector  # noqa: B018
    with pytest.raises(AttributeError):
        kvv.NoSuchThing  # noqa: B018


@pytest.fixture
def connector_classes(monkeypatch):
    """kvoffload.vllm's classes over vLLM's base classes: the real ones when vLLM is installed,
    else a stub of the one module they come from. The classes are dropped afterwards, so the
    other tests see the module as imported."""
    import enum
    import sys
    import types

    if not HAVE_VLLM:
        base = types.ModuleType("vllm.distributed.kv_transfer.kv_connector.v1.base")

        class KVConnectorBase_V1:  # noqa: N801 (vLLM's name)
            def __init__(self, vllm_config, role, kv_cache_config):
                pass

        base.KVConnectorBase_V1 = KVConnectorBase_V1
        base.KVConnectorMetadata = type("KVConnectorMetadata", (), {})
        base.KVConnectorWorkerMetadata = type("KVConnectorWorkerMetadata", (), {})
        base.SupportsHMA = type("SupportsHMA", (), {})
        base.KVConnectorRole = enum.Enum("KVConnectorRole", "SCHEDULER WORKER")
        names = ["vllm", "vllm.distributed", "vllm.distributed.kv_transfer",
                 "vllm.distributed.kv_transfer.kv_connector",
                 "vllm.distributed.kv_transfer.kv_connector.v1"]
        for name in names:
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
        monkeypatch.setitem(sys.modules, base.__name__, base)
    defined = "KvoffloadConnector" in vars(kvv)
    yield kvv.KvoffloadConnectorMetadata, kvv.KvoffloadWorkerMetadata
    if not defined:
        for name in kvv._CLASSES:
            vars(kvv).pop(name, None)


def test_metadata_pickles_between_processes(connector_classes, hashes):
    """vLLM's engine-core process pickles the step's metadata to its workers and the workers'
    metadata back; classes local to a function would not pickle (vllm serve's first request)."""
    import pickle

    Meta, WorkerMeta = connector_classes
    for cls in (Meta, WorkerMeta, kvv.KvoffloadConnector):
        assert (cls.__module__, cls.__qualname__) == ("kvoffload.vllm", cls.__name__)
    s = kv.Scheduler(groups=[kv.GroupConfig("full_attention", 16)], host_blocks=8)
    h = hashes("pickle", 4)
    s.update_request("a", 64, h)
    s.lookup("a", 0)
    s.on_allocated("a", [kv.AllocatedGroup([])], 0)
    store = s.build_step([kv.ScheduledRequest("a", 0, 64, [[1, 2, 3, 4]])]).store_jobs
    s.on_completed([kv.JobReport(j.id) for j in store])
    s.on_finished("a")
    s.update_request("b", 64, h)
    hit = s.lookup("b", 0)
    s.on_allocated("b", [kv.AllocatedGroup([5, 6, 7, 8])], hit)
    load = s.build_step([kv.ScheduledRequest("b", hit, 64 - hit, [[]])]).load_jobs
    assert store and load

    meta = pickle.loads(pickle.dumps(Meta(load, store, [store[0].id])))
    assert type(meta) is Meta and meta.flush == [store[0].id]
    for got, want in ((meta.load_jobs, load), (meta.store_jobs, store)):
        assert [(j.id, j.kind, j.request_id, j.keys, list(j.gpu_block_ids),
                 list(j.host_block_ids)) for j in got] == \
               [(j.id, j.kind, j.request_id, j.keys, list(j.gpu_block_ids),
                 list(j.host_block_ids)) for j in want]
    done = WorkerMeta({load[0].id: (1, True), store[0].id: (1, False)})
    back = pickle.loads(pickle.dumps(done))
    assert type(back) is WorkerMeta and back.completed == done.completed
    assert back.aggregate(WorkerMeta({load[0].id: (1, True)})).completed[load[0].id] == (2, True)
