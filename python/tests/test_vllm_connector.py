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
    for bad in ("lots", "-1", 0, True, "12 parsecs", float("nan"), float("inf"), "nan", "inf"):
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
    # Lookups of keys being loaded defer only where vLLM's prefix caching would reuse the load.
    assert c.prefix_caching
    assert not kvv.scheduler_config(groups, 16, 4096, {"host_blocks": 7},
                                    prefix_caching=False).prefix_caching


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

    class MambaSpecNone:
        block_size, mamba_cache_mode = 16, "none"

    class ChunkedLocalAttentionSpec:
        block_size = 16

    # The window vLLM's block manager keeps: 64 plus the 3 tokens retained below it.
    assert kvv.group_of_spec(0, SlidingWindowSpec()) == ("sliding_window", 32, 67)
    assert kvv.group_of_spec(1, FullAttentionSpec()) == ("full_attention", 16, 0)
    assert kvv.group_of_spec(2, MambaSpec()) == ("mamba", 16, 0)
    MambaSpecNone.__name__ = "MambaSpec"
    with pytest.raises(kv.InvalidArgument, match="KV-cache group 4: a mamba group with "
                       "mamba_cache_mode 'none'"):
        kvv.group_of_spec(4, MambaSpecNone())
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
                self._kv_cache_config = kv_cache_config
                self._connector_metadata = None

            def bind_connector_metadata(self, metadata):
                self._connector_metadata = metadata

            def _get_connector_metadata(self):
                assert self._connector_metadata is not None
                return self._connector_metadata

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


class _RecordingWorker:
    """Stands in for kv.Worker in the connector's worker role: records what it is asked."""

    def __init__(self, config):
        self.config = config
        self.calls = [("create", config.backend, kv.stream_handle(config.compute_stream))]

    def set_compute_stream(self, stream):
        self.calls.append(("set_compute_stream", stream))

    def start_step(self):
        self.calls.append(("start_step",))

    def wait(self, jobs):
        self.calls.append(("wait", list(jobs)))

    def submit(self, job):
        self.calls.append((job.kind, job.id))

    def get_finished(self):
        return []

    pressure = False

    def store_pressure(self):
        return self.pressure

    def tier_scan(self, t):
        return self.scan

    def release_tier_scan(self, t):
        self.calls.append(("release_tier_scan", t))
        self.scan = []

    def clear_tiers(self):
        self.calls.append(("clear_tiers",))

    def submit_tier(self, job):
        self.calls.append((job.kind, job.id))


def _fake_vllm(extra, world=1, tp=1, calculate_kv_scales=False):
    """(vllm_config, kv_cache_config) of a one-layer full-attention model (model "org/m",
    bfloat16) with 8 GPU blocks of 256 bytes, as the connector reads them."""
    import types

    FullAttentionSpec = type("FullAttentionSpec", (), {"block_size": 16, "sliding_window": None})
    ns = types.SimpleNamespace
    kv_cache_config = ns(num_blocks=8, kv_cache_tensors=[ns(size=8 * 256)],
                         kv_cache_groups=[ns(kv_cache_spec=FullAttentionSpec(),
                                             layer_names=["layer0"])])
    vllm_config = ns(kv_transfer_config=ns(kv_connector_extra_config=extra),
                     parallel_config=ns(world_size=world, tensor_parallel_size=tp),
                     kv_events_config=None,
                     cache_config=ns(block_size=16, cache_dtype="auto",
                                     calculate_kv_scales=calculate_kv_scales,
                                     enable_prefix_caching=True),
                     model_config=ns(model="org/m", revision=None, dtype="bfloat16"))
    return vllm_config, kv_cache_config


def _worker_connector(monkeypatch, cuda, current_stream, extra=None, scan=()):
    """A worker-role KvoffloadConnector over one fake KV tensor of 8 blocks (on a "GPU" when
    ``cuda``), with kv.Worker and torch.cuda.current_stream faked; current_stream(device)
    gives the handle of the engine's current stream; ``scan`` is what the fake worker's tiers
    found at start."""
    import sys
    import types

    import numpy as np
    from conftest import TorchLike

    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(
        current_stream=lambda device: types.SimpleNamespace(cuda_stream=current_stream(device)))
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(kv, "Worker", _RecordingWorker)
    monkeypatch.setattr(_RecordingWorker, "scan", list(scan), raising=False)
    role = sys.modules["vllm.distributed.kv_transfer.kv_connector.v1.base"].KVConnectorRole
    vllm_config, kv_cache_config = _fake_vllm(extra or {"host_blocks": 4})
    c = kvv.KvoffloadConnector(vllm_config, role.WORKER, kv_cache_config)
    cache = np.zeros((8, 256), dtype=np.uint8)
    c.register_kv_caches({"layer0": TorchLike(cache, cuda=cuda, device_index=1)})
    return c


def _job(kind, id):
    import types

    return types.SimpleNamespace(kind=kind, id=id, request_id=f"r{id}", gpu_block_ids=[id])


@pytest.mark.skipif(HAVE_VLLM, reason="builds the connector over the stub of vLLM's base class")
def test_connector_follows_the_current_stream_each_step(connector_classes, monkeypatch):
    """The compute stream is the engine's current stream when a step's jobs are submitted, not
    the one at register_kv_caches: when the forward pass moves to another stream (between
    steps, or between start_load_kv and wait_for_save), the worker gets the new handle before
    that step's loads or stores, once; a step's deferred stores start (start_step) before the
    next step's stream is set, so they still wait for the pass that wrote their KV."""
    Meta, _ = connector_classes
    current = {"stream": 0x100}
    devices = []

    def current_stream(device):
        devices.append((device.type, device.index))
        return current["stream"]

    c = _worker_connector(monkeypatch, True, current_stream)
    w = c._worker
    assert w.calls == [("create", "cuda", 0x100)] and w.config.cuda_device == 1

    def step(load, store, switch_after_load=None):
        c.bind_connector_metadata(Meta([_job("load", load)], [_job("store", store)], []))
        c.start_load_kv(None)
        if switch_after_load is not None:
            current["stream"] = switch_after_load
        c.wait_for_save()

    step(1, 2)  # unchanged: no call
    current["stream"] = 0x200  # the next forward pass runs on another stream
    step(3, 4)
    step(5, 6, switch_after_load=0x300)  # this step's forward pass runs on a third stream
    step(7, 8)
    assert w.calls[1:] == [
        ("start_step",), ("load", 1), ("store", 2),
        ("start_step",), ("set_compute_stream", 0x200), ("load", 3), ("store", 4),
        ("start_step",), ("load", 5), ("set_compute_stream", 0x300), ("store", 6),
        ("start_step",), ("load", 7), ("store", 8),
    ]
    assert all(isinstance(call[1], int) for call in w.calls if call[0] == "set_compute_stream")
    assert set(devices) == {("cuda", 1)}  # the KV tensors' device, not the current one


@pytest.mark.skipif(HAVE_VLLM, reason="builds the connector over the stub of vLLM's base class")
def test_connector_on_cpu_tensors_asks_for_no_stream(connector_classes, monkeypatch):
    Meta, _ = connector_classes

    def current_stream(device):
        raise AssertionError("CPU KV tensors: no CUDA stream is asked for")

    c = _worker_connector(monkeypatch, False, current_stream)
    c.bind_connector_metadata(Meta([_job("load", 1)], [_job("store", 2)], []))
    c.start_load_kv(None)
    c.wait_for_save()
    assert c._worker.calls == [("create", "host", None), ("start_step",), ("load", 1),
                               ("store", 2)]


def test_shared_tier_from_extra_config():
    identity = kvv.model_identity("org/model", None, "torch.bfloat16", 2)
    assert identity == "vllm:org/model@default:bfloat16:kv-auto:q-none:tp2"
    # Whatever changes the KV's bytes but not its layout changes the identity.
    others = {kvv.model_identity("org/model", "abc123", "bfloat16", 2),
              kvv.model_identity("org/model", None, "float16", 2),
              kvv.model_identity("org/model", None, "bfloat16", 1),
              kvv.model_identity("org/model", None, "bfloat16", 2, "fp8_e4m3"),
              kvv.model_identity("org/model", None, "bfloat16", 2, "fp8_e5m2"),
              kvv.model_identity("org/model", None, "bfloat16", 2, quantization="fp8"),
              kvv.model_identity("org/model", None, "bfloat16", 2,
                                 overrides={"rope_scaling": {"factor": 4.0}})}
    assert len(others) == 7 and identity not in others
    groups = [("full_attention", 16, 0)]
    extra = {"host_blocks": 64, "tiers": [{
        "medium": "shared", "nodes": "127.0.0.1:7000,127.0.0.1:7001", "tls": True,
        "tls_ca_file": "/etc/kv/ca.crt", "tls_server_name": "valkey", "username": "kvoffload",
        "password_file": "/etc/kv/password", "secret_file": "/etc/kv/secret", "ttl_seconds": 600,
        "write_back": True}]}
    c = kvv.scheduler_config(groups, 16, 4096, extra, identity=identity, tp_size=2)
    assert c.weights == identity
    (t,) = c.tiers
    assert (t.medium, t.write_back, t.blocks) == ("shared", True, 1024)
    s = t.store
    assert (s.nodes, s.name, s.tp_size, s.tls, s.tls_ca_file, s.tls_server_name) == (
        "127.0.0.1:7000,127.0.0.1:7001", identity, 2, True, "/etc/kv/ca.crt", "valkey")
    assert (s.username, s.password_file, s.secret_file, s.ttl_seconds) == (
        "kvoffload", "/etc/kv/password", "/etc/kv/secret", 600)
    assert (s.secret_env, s.password_env, s.insecure) == (
        "KVOFFLOAD_SHARED_SECRET", "KVOFFLOAD_SHARED_PASSWORD", False)
    # A namespace given by hand (the same model under different paths), and the index size.
    extra["tiers"][0].update(name="llama-3-8b", blocks=5000, secret_env="FLEET_KEY")
    (t,) = kvv.scheduler_config(groups, 16, 4096, extra, identity=identity).tiers
    assert (t.store.name, t.blocks, t.store.secret_env) == ("llama-3-8b", 5000, "FLEET_KEY")
    extra["tiers"][0].update(ttl_seconds="90", store_threshold=2)  # digits from an env file
    (t,) = kvv.scheduler_config(groups, 16, 4096, extra, identity=identity).tiers
    assert (t.store.ttl_seconds, t.store_threshold) == (90, 2)


def test_disk_tier_from_extra_config():
    identity = kvv.model_identity("org/model", None, "bfloat16", 2)
    extra = {"host_blocks": 64, "tiers": [
        {"medium": "disk", "path": "/nvme/kv", "capacity_bytes": "500GiB", "store_threshold": 2,
         "write_back": True, "io": "threads", "direct_io": False},
        {"medium": "shared", "nodes": "127.0.0.1:7000"}]}
    disk, shared = kvv.scheduler_config([("full_attention", 16, 0)], 16, 4096, extra,
                                        identity=identity, tp_size=2).tiers
    assert (disk.medium, disk.store_threshold, disk.write_back) == ("disk", 2, True)
    assert disk.blocks == 1  # the workers' files say how many slots (the connector sets it)
    s = disk.store
    assert isinstance(s, kv.DiskTierConfig)
    # The weights' identity names the directory; each rank's files are its own (tp_size 2).
    assert (s.path, s.capacity_bytes, s.model, s.tp_size, s.io, s.direct_io) == (
        "/nvme/kv", 500 << 30, identity, 2, "threads", False)
    assert shared.medium == "shared" and shared.store.name == identity
    # Data parallel engines: a directory each (one directory belongs to one engine).
    disk, _ = kvv.scheduler_config([("full_attention", 16, 0)], 16, 4096, extra,
                                   identity=identity, tp_size=2, dp_rank=3).tiers
    assert disk.store.path == "/nvme/kv/dp3"


@pytest.mark.parametrize("tier, message", [
    ({"medium": "shared", "nodes": "h:1", "password": "hunter2"},
     r"tiers\[0\]\.password: secrets never go in the config"),
    ({"medium": "shared", "nodes": "h:1", "secret": "s"}, r"tiers\[0\]\.secret: .*secret_file"),
    ({"medium": "shared", "nodes": "h:1", "tls_ca": "x"}, r"tiers\[0\]: unknown key\(s\) \['tls_ca'\]"),
    ({"medium": "shared"}, r"tiers\[0\]\.nodes"),
    ({"medium": "shared", "nodes": "h:1", "ttl_seconds": "soon"}, r"tiers\[0\]\.ttl_seconds"),
    ({"medium": "shared", "nodes": "h:1", "tls": "false"}, r"tiers\[0\]\.tls: 'false' is not a bool"),
    ({"medium": "shared", "nodes": "h:1", "write_back": 1}, r"tiers\[0\]\.write_back: 1 is not a bool"),
    ({"medium": "shared", "nodes": "h:1", "blocks": True}, r"tiers\[0\]\.blocks: True is not a int"),
    ({"medium": "shared", "nodes": "h:1", "username": 7}, r"tiers\[0\]\.username: 7 is not a str"),
    ({"medium": "disk", "capacity_bytes": "1GiB"}, r"tiers\[0\]\.path: required"),
    ({"medium": "disk", "path": "/x"}, r"tiers\[0\]\.capacity_bytes: required"),
    ({"medium": "disk", "path": "/x", "capacity_bytes": 1 << 30, "blocks": 9},
     r"tiers\[0\]: unknown key\(s\) \['blocks'\] \(a disk tier's slots are what capacity_bytes"),
    ({"medium": "disk", "path": "/x", "capacity_bytes": 1 << 30, "nodes": "h:1"},
     r"tiers\[0\]: unknown key\(s\) \['nodes'\]"),
    ({"medium": "disk", "path": "/x", "capacity_bytes": 1 << 30, "direct_io": "no"},
     r"tiers\[0\]\.direct_io: 'no' is not a bool"),
    ({"medium": "disk", "path": 5, "capacity_bytes": 1 << 30}, r"tiers\[0\]\.path: 5 is not a str"),
    ({"medium": "disk", "path": "/x", "capacity_bytes": "lots"}, r"tiers\[0\]\.capacity_bytes"),
    ({"medium": "disk", "path": "/x", "capacity_bytes": True},
     r"tiers\[0\]\.capacity_bytes: expected bytes"),
    ({"medium": "disk", "path": "/x", "capacity_bytes": -5},
     r"tiers\[0\]\.capacity_bytes: -5 is not a positive size"),
    ({"medium": "disk", "path": "/x", "capacity_bytes": "1GiB", "io": "fast"},
     r"tiers\[0\]\.io: 'fast' \(auto, io_uring or threads\)"),
    ({"medium": "tape"}, r"tiers\[0\]\.medium: 'tape'"),
    ("shared", r"tiers\[0\]: expected an object"),
])
def test_bad_tier_configs_name_the_field(tier, message):
    with pytest.raises(kv.InvalidArgument, match=message):
        kvv.scheduler_config([("full_attention", 16, 0)], 16, 4096,
                             {"host_blocks": 8, "tiers": [tier]}, identity="vllm:m")


def test_a_shared_tier_without_a_secret_is_refused(monkeypatch):
    monkeypatch.delenv("KVOFFLOAD_SHARED_SECRET", raising=False)
    c = kvv.scheduler_config([("full_attention", 16, 0)], 16, 4096, {
        "host_blocks": 8, "tiers": [{"medium": "shared", "nodes": "127.0.0.1:1"}]},
        identity="vllm:m")
    with pytest.raises(kv.InvalidArgument, match="secret"):
        kv.Scheduler(c)


def _scheduler_connector(monkeypatch, extra, world=1, tp=1, calculate_kv_scales=False,
                         executor=None):
    """A scheduler-role KvoffloadConnector over a fake vLLM config (a real kv.Scheduler)."""
    import sys

    role = sys.modules["vllm.distributed.kv_transfer.kv_connector.v1.base"].KVConnectorRole
    vllm_config, kv_cache_config = _fake_vllm(extra, world, tp, calculate_kv_scales)
    vllm_config.parallel_config.distributed_executor_backend = executor
    monkeypatch.setenv("KVOFFLOAD_SHARED_SECRET", "a fleet secret for the test")
    return kvv.KvoffloadConnector(vllm_config, role.SCHEDULER, kv_cache_config)


SHARED = {"host_blocks": 8, "tiers": [{"medium": "shared", "nodes": "127.0.0.1:1"}]}


@pytest.mark.skipif(HAVE_VLLM, reason="builds the connector over the stub of vLLM's base class")
def test_reset_moves_every_tier_to_a_fresh_epoch(connector_classes, monkeypatch):
    """Two engines (or one engine and its restart) with the same weights each reset once: they
    must not land on the same epoch, or one would find the other's blocks, of other weights
    after an in-place update."""
    a = _scheduler_connector(monkeypatch, SHARED)
    b = _scheduler_connector(monkeypatch, SHARED)
    start = a._sched.epoch
    assert b._sched.epoch == start  # same weights, same blocks
    assert a.reset_cache() and b.reset_cache()
    epochs = {start, a._sched.epoch, b._sched.epoch}
    assert len(epochs) == 3
    a.reset_cache()
    assert a._sched.epoch not in epochs


@pytest.mark.skipif(HAVE_VLLM, reason="builds the connector over the stub of vLLM's base class")
def test_tiers_take_their_identity_from_vllm_or_the_config(connector_classes, monkeypatch):
    c = _scheduler_connector(monkeypatch, SHARED, world=2, tp=2)
    assert c._identity == "vllm:org/m@default:bfloat16:kv-auto:q-none:tp2"
    assert c._config.weights == c._identity == c._config.tiers[0].store.name
    assert c._config.tiers[0].store.tp_size == 2
    c = _scheduler_connector(monkeypatch, dict(SHARED, weights="sha256:1234"))
    # The digest stands for model and revision; what changes the KV's bytes but not their
    # size (dtype, KV-cache dtype, quantization, overrides, TP) still comes from the config.
    assert c._identity == "sha256:1234:bfloat16:kv-auto:q-none:tp1"
    assert (c._config.weights, c._config.tiers[0].store.name) == (c._identity, c._identity)
    assert kvv.model_identity("a", None, "float16", 1, weights="sha256:1234") != c._identity
    for bad, message in ((dict(SHARED, weights=""), "weights: empty"),
                         (dict(SHARED, weights=7), "weights: 7 is not a str")):
        with pytest.raises(kv.InvalidArgument, match=message):
            _scheduler_connector(monkeypatch, bad)


@pytest.mark.skipif(HAVE_VLLM, reason="builds the connector over the stub of vLLM's base class")
def test_each_data_parallel_engine_has_a_disk_directory_of_its_own(connector_classes):
    """A disk directory belongs to one engine (its lock, its stale-layout sweep). Independent
    engines of a dense model: vLLM sets their size and rank to 1 and 0 and keeps the rank as
    data_parallel_index."""
    import sys

    role = sys.modules["vllm.distributed.kv_transfer.kv_connector.v1.base"].KVConnectorRole
    for pc, want in (({}, "/d"), ({"data_parallel_size": 1, "data_parallel_index": 2}, "/d/dp2"),
                     ({"data_parallel_size": 4, "data_parallel_rank": 1}, "/d/dp1"),
                     ({"data_parallel_size": 2, "data_parallel_index": 0}, "/d/dp0")):
        vllm_config, kv_cache_config = _fake_vllm(_disk("/d"))
        vars(vllm_config.parallel_config).update(pc)
        c = kvv.KvoffloadConnector(vllm_config, role.SCHEDULER, kv_cache_config)
        assert c._config.tiers[0].store.path == want, pc


@pytest.mark.skipif(HAVE_VLLM, reason="builds the connector over the stub of vLLM's base class")
def test_tiers_refuse_what_would_mix_kv(connector_classes, monkeypatch):
    # Pipeline stages would share key names for different layers' KV.
    with pytest.raises(kv.InvalidArgument, match=r"pipeline.*world size 4, tensor-parallel size 2"):
        _scheduler_connector(monkeypatch, SHARED, world=4, tp=2)
    # Per-engine fp8 scales: another engine's blocks would be read under other scales.
    with pytest.raises(kv.InvalidArgument, match="calculate_kv_scales"):
        _scheduler_connector(monkeypatch, SHARED, calculate_kv_scales=True)
    # A disk tier's scans come from every rank: torchrun's launcher brings only this one's.
    with pytest.raises(kv.InvalidArgument, match="external_launcher"):
        _scheduler_connector(monkeypatch, _disk("/unused"), world=2, tp=2,
                             executor="external_launcher")
    # Without tiers neither matters.
    _scheduler_connector(monkeypatch, {"host_blocks": 8}, world=4, tp=2, calculate_kv_scales=True)


def _disk(tmp_path):
    return {"host_blocks": 8, "tiers": [{"medium": "disk", "path": str(tmp_path),
                                         "capacity_bytes": "1MiB"}]}


@pytest.mark.skipif(HAVE_VLLM, reason="builds the connector over the stub of vLLM's base class")
def test_a_disk_tier_is_restored_from_every_ranks_scan(connector_classes, monkeypatch, tmp_path,
                                                       hashes):
    """Lookups wait until every rank's scan is in; then the tier has the fewest slots any rank
    has, and holds a key only where every rank's slot holds it (a rank missing a block's rows
    would load a block half of which nobody wrote)."""
    import types

    _, WorkerMeta = connector_classes
    c = _scheduler_connector(monkeypatch, _disk(tmp_path), world=2, tp=2)
    h = hashes("disk-scan", 4)
    rank0 = [(h[0], 0), (h[1], 0), (h[2], 0)] + [None] * 6 + [(h[3], 0)]  # 10 slots
    rank1 = [(h[0], 0), (h[2], 0), (h[2], 0)] + [None] * 6  # 9 slots

    def output(meta):
        return types.SimpleNamespace(kv_connector_worker_meta=meta)

    assert c.get_num_new_matched_tokens(object(), 0) == (None, False)
    c.update_connector_output(output(None))  # a step without metadata: still waiting
    c.update_connector_output(output(WorkerMeta(scans={0: {0: rank0}})))
    assert c.get_num_new_matched_tokens(object(), 0) == (None, False)
    before = c._sched
    c.update_connector_output(output(WorkerMeta(scans={1: {0: rank1}})))
    assert c._sched is not before and c._config.tiers[0].blocks == 9
    assert c.restored_blocks == {0: 2}  # slots 0 and 2; slot 1 differs, slot 9 is past 9
    # A restored block is found: the lookup waits for its promotion from slot 0.
    req = types.SimpleNamespace(request_id="r", block_hashes=[h[0]], num_tokens=17,
                                kv_transfer_params=None)
    assert c.get_num_new_matched_tokens(req, 0) == (None, False)
    ns = types.SimpleNamespace
    meta = c.build_connector_meta(ns(
        scheduled_new_reqs=[], num_scheduled_tokens={}, preempted_req_ids=set(),
        scheduled_cached_reqs=ns(req_ids=[], num_computed_tokens=[], new_block_ids=[],
                                 resumed_req_ids=set())))
    assert [(j.kind, list(j.slots), j.keys) for j in meta.tier_jobs] == [
        ("promote", [0], [(h[0], 0)])]
    # Both ranks' scans in one step's output (vLLM aggregates the workers' metadata) work too.
    c = _scheduler_connector(monkeypatch, _disk(tmp_path), world=2, tp=2)
    both = WorkerMeta(scans={0: {0: rank0}}).aggregate(WorkerMeta(scans={1: {0: rank1}}))
    c.update_connector_output(output(both))
    assert c.restored_blocks == {0: 2} and not c._awaiting_scans


@pytest.mark.skipif(HAVE_VLLM, reason="builds the connector over the stub of vLLM's base class")
def test_store_back_pressure_travels_from_workers_to_the_scheduler(connector_classes,
                                                                    monkeypatch, hashes):
    """A worker whose stores are behind says so in its metadata every step (also with nothing
    else to report); any rank's pressure reaches the scheduler, whose next step stores nothing
    and counts the skipped blocks; a step's output without it clears it."""
    import types

    _, WorkerMeta = connector_classes
    w = _worker_connector(monkeypatch, False, None,
                          extra={"host_blocks": 4, "max_store_bytes_in_flight": "1MiB"})
    assert w._worker.config.max_store_bytes_in_flight == 1 << 20
    assert w.build_connector_worker_meta() is None
    w._worker.pressure = True
    assert w.build_connector_worker_meta().pressure
    assert w.build_connector_worker_meta().pressure  # every step until it clears
    merged = WorkerMeta().aggregate(WorkerMeta(pressure=True))
    assert merged.pressure and not WorkerMeta().aggregate(WorkerMeta()).pressure

    c = _scheduler_connector(monkeypatch, {"host_blocks": 8})
    ns = types.SimpleNamespace
    h = hashes("pressure", 2)
    req = ns(request_id="a", block_hashes=h, num_tokens=32, kv_transfer_params=None)
    assert c.get_num_new_matched_tokens(req, 0) == (0, False)
    c.update_state_after_alloc(req, ns(blocks=([],)), 0)
    c.update_connector_output(ns(kv_connector_worker_meta=merged))
    new = ns(req_id="a", num_computed_tokens=0, block_ids=([1, 2],))
    meta = c.build_connector_meta(ns(
        scheduled_new_reqs=[new], num_scheduled_tokens={"a": 32}, preempted_req_ids=set(),
        scheduled_cached_reqs=ns(req_ids=[], num_computed_tokens=[], new_block_ids=[],
                                 resumed_req_ids=set())))
    assert meta.store_jobs == [] and c._sched.stats()["pressure_skips"] == 2
    c.update_connector_output(ns(kv_connector_worker_meta=None))
    assert not c._sched._s.store_pressure()
    with pytest.raises(kv.InvalidArgument, match="max_store_bytes_in_flight"):
        _worker_connector(monkeypatch, False, None,
                          extra={"host_blocks": 4, "max_store_bytes_in_flight": "lots"})


@pytest.mark.skipif(HAVE_VLLM, reason="builds the connector over the stub of vLLM's base class")
def test_a_reset_before_the_scans_restores_nothing_and_empties_the_disk(
        connector_classes, monkeypatch, tmp_path, hashes):
    import types

    _, WorkerMeta = connector_classes
    c = _scheduler_connector(monkeypatch, _disk(tmp_path))
    c.reset_cache()
    epoch = c._sched.epoch
    ns = types.SimpleNamespace
    meta = c.build_connector_meta(ns(
        scheduled_new_reqs=[], num_scheduled_tokens={}, preempted_req_ids=set(),
        scheduled_cached_reqs=ns(req_ids=[], num_computed_tokens=[], new_block_ids=[],
                                 resumed_req_ids=set())))
    assert meta.clear_tiers
    h = hashes("disk-reset", 1)
    c.update_connector_output(types.SimpleNamespace(
        kv_connector_worker_meta=WorkerMeta(scans={0: {0: [(h[0], 0), None, None, None]}})))
    assert c.restored_blocks == {0: 0} and c._sched.epoch == epoch


@pytest.mark.skipif(HAVE_VLLM, reason="builds the connector over the stub of vLLM's base class")
def test_a_worker_sends_its_disk_scan_once_and_empties_its_disk_after_the_flush(
        connector_classes, monkeypatch, hashes):
    Meta, _ = connector_classes
    h = hashes("worker-scan", 2)
    c = _worker_connector(monkeypatch, False, None,
                          extra={"host_blocks": 4, "tiers": [
                              {"medium": "disk", "path": "/unused", "capacity_bytes": "1MiB"}]},
                          scan=[None, (h[0], 0), None, (h[1], 0)])
    meta = c.build_connector_worker_meta()
    assert meta.scans == {0: {0: [None, (h[0], 0), None, (h[1], 0)]}}
    assert c.build_connector_worker_meta() is None  # sent once; nothing completed
    c.bind_connector_metadata(Meta([], [], [7], tier_jobs=[_job("write", 8)], clear_tiers=True))
    c.start_load_kv(None)
    # Emptied once the flush set (every transfer in flight at the reset) finished, before
    # this step's own tier jobs.
    # The scan was freed once read (the connector holds the list it sends).
    assert c._worker.calls[1:] == [("release_tier_scan", 0), ("start_step",), ("wait", [7]),
                                   ("clear_tiers",), ("write", 8)]


def test_an_unknown_tensor_parallel_rank_is_never_guessed(monkeypatch):
    import sys

    assert kvv._tp_rank(1) == 0
    monkeypatch.setitem(sys.modules, "vllm.distributed.parallel_state", None)  # import fails
    with pytest.raises(kv.InvalidArgument, match="rank is unknown"):
        kvv._tp_rank(2)


def test_connector_stats_are_counter_deltas_with_tier_labels():
    seen = {}
    assert kvv.counters_since({"hits": 3, "copy_load_seconds": 0.5}, seen) == {
        "hits": 3, "copy_load_seconds": 0.5}
    assert kvv.counters_since({"hits": 7, "copy_load_seconds": 0.75}, seen) == {
        "hits": 4, "copy_load_seconds": 0.25}
    assert kvv.counters_since({"hits": 2, "copy_load_seconds": 0.75}, seen) == {
        "hits": 2, "copy_load_seconds": 0.0}  # a counter that went back (a reset) counts from 0
    assert kvv.metric_of("tier.shared.promotions") == ("tier_promotions", "shared")
    assert kvv.metric_of("hit_tokens") == ("hit_tokens", None)
    # Every counter the connector reports has a metric, with its documentation.
    sched = kv.Scheduler(kvv.scheduler_config([("full_attention", 16, 0)], 16, 4096,
                                              {"host_blocks": 8}))
    assert set(kvv._SCHEDULER_COUNTERS) <= set(sched.stats())
    assert all(kvv.METRICS.values())
    assert {"tier_" + k for k in kvv._TIER_COUNTERS} <= set(kvv.METRICS)


def test_kv_events_name_every_medium_and_never_a_partly_written_block():
    import types

    class Stored:  # vLLM 0.33's fields
        __struct_fields__ = ("block_hashes", "parent_block_hash", "token_ids", "block_size",
                             "lora_id", "medium", "lora_name", "group_idx", "locality")

        def __init__(self, **kw):
            assert set(kw) <= set(self.__struct_fields__)
            self.__dict__.update(kw)

    class Removed(Stored):  # vLLM 0.21's fields: no locality
        __struct_fields__ = ("block_hashes", "medium", "group_idx")

    ns = types.SimpleNamespace
    asked = []

    def partly_written(keys):  # host memory holds w without its leading sub-blocks
        asked.append(list(keys))
        return [k == (b"w", 1) for k in keys]

    events = [ns(removed=False, medium="host", keys=[(b"a", 0), (b"b", 0), (b"w", 1), (b"x", 1)]),
              ns(removed=False, medium="disk", keys=[(b"a", 0)]),
              ns(removed=False, medium="shared", keys=[(b"b", 0)]),
              ns(removed=True, medium="shared", keys=[(b"b", 0)]),
              ns(removed=True, medium="host", keys=[(b"w", 1), (b"a", 0)])]
    out = kvv.vllm_events(events, partly_written, Stored, Removed)
    got = [(type(e).__name__, e.medium, getattr(e, "locality", None), e.group_idx,
            e.block_hashes) for e in out]
    assert got == [("Stored", "CPU", "LOCAL", 0, [b"a", b"b"]),
                   ("Stored", "CPU", "LOCAL", 1, [b"x"]),  # w: partly written, not published
                   ("Stored", "STORAGE", "LOCAL", 0, [b"a"]),
                   ("Stored", "STORAGE", "REMOTE", 0, [b"b"]),
                   # the shared index forgetting b is no news of the cluster: not published
                   ("Removed", "CPU", None, 1, [b"w"]),
                   ("Removed", "CPU", None, 0, [b"a"])]
    assert asked == [[(b"a", 0), (b"b", 0), (b"w", 1), (b"x", 1)]]  # host stores only


def test_partly_written_asks_host_memory():
    s = kv.Scheduler(kv.SchedulerConfig(groups=[kv.GroupConfig("full_attention", 16)],
                                        host_blocks=8))
    from conftest import block_hashes

    h = block_hashes("pw", 2)
    s.update_request("a", 32, h)
    s.lookup("a", 0)
    s.on_allocated("a", [kv.AllocatedGroup([])], 0)
    step = s.build_step([kv.ScheduledRequest("a", 0, 32, [[1, 2]])])
    s.on_completed([kv.JobReport(j.id) for j in step.store_jobs])
    # Whole blocks, and a key never stored: none is partly written.
    assert s.partly_written([(h[0], 0), (h[1], 0), (b"\x01" * 32, 0)]) == [False] * 3


@pytest.mark.skipif(HAVE_VLLM, reason="builds the connector over the stub of vLLM's base class")
def test_max_load_tokens_caps_a_hit_at_a_host_block(connector_classes, monkeypatch):
    """vLLM's per-request kv_transfer_params {"max_load_tokens": N}: at most N tokens come from
    kvoffload, ending at a host block; ignored when malformed, as vLLM ignores it."""
    import types

    from conftest import block_hashes

    c = _scheduler_connector(monkeypatch, {"host_blocks": 8})
    s = c._sched
    h = block_hashes("cap", 4)  # 64 tokens, 4 host blocks of 16
    s.update_request("a", 64, h)
    assert s.lookup("a", 0) == 0
    s.on_allocated("a", [kv.AllocatedGroup([])], 0)
    step = s.build_step([kv.ScheduledRequest("a", 0, 64, [[1, 2, 3, 4]])])
    s.on_completed([kv.JobReport(j.id) for j in step.store_jobs])
    s.on_finished("a")

    def ask(rid, params, local=0):
        req = types.SimpleNamespace(request_id=rid, num_tokens=64, block_hashes=h,
                                    kv_transfer_params=params)
        return c.get_num_new_matched_tokens(req, local)[0]

    full = ask("b", None)
    assert full == 64
    assert ask("c", {"max_load_tokens": 40}) == 32
    assert ask("d", {"max_load_tokens": 15}) == 0
    assert ask("e", {"max_load_tokens": 40}, local=16) == 32  # ends at 48: 16 local + 32
    assert ask("f", {"max_load_tokens": 1000}) == full
    for i, bad in enumerate(({"max_load_tokens": -1}, {"max_load_tokens": "8"},
                             {"max_load_tokens": 8.0}, {"max_load_tokens": True})):
        assert ask(f"g{i}", bad) == full


def test_load_tiers_filter_read_as_vllm_reads_it():
    from kvoffload.vllm import load_tiers_allow_all

    host = [("CPU", "LOCAL")]
    fleet = [("CPU", "LOCAL"), ("STORAGE", "LOCAL"), ("STORAGE", "REMOTE")]
    assert load_tiers_allow_all("CPU", fleet)  # not a list: vLLM ignores it (every tier)
    assert not load_tiers_allow_all([], host)  # []: nothing
    assert load_tiers_allow_all([{"medium": "floppy"}, 3], host)  # no valid entry: every tier
    assert load_tiers_allow_all([{}], fleet)  # a matcher of nothing in particular matches all
    assert load_tiers_allow_all([{"medium": "cpu"}], host)
    assert not load_tiers_allow_all([{"medium": "cpu"}], fleet)
    assert not load_tiers_allow_all([{"locality": "local"}], fleet)
    assert not load_tiers_allow_all([{"medium": "STORAGE"}], host)
    assert load_tiers_allow_all([{"medium": "CPU"}, {"medium": "STORAGE"}], fleet)
    assert load_tiers_allow_all([{"locality": "LOCAL"}, {"medium": "storage",
                                                         "locality": "remote"}], fleet)
    assert not load_tiers_allow_all([{"medium": 5}, {"medium": "CPU"}], fleet)


@pytest.mark.skipif(HAVE_VLLM, reason="builds the connector over the stub of vLLM's base class")
def test_kv_load_tiers_leaving_out_host_memory_loads_nothing(connector_classes, monkeypatch):
    """vLLM 0.33's kv_load_tiers: a request whose filter leaves out host memory gets no hit
    from it; one that allows it, or a malformed filter, gets the hit."""
    import types

    from conftest import block_hashes

    c = _scheduler_connector(monkeypatch, {"host_blocks": 8})
    s = c._sched
    h = block_hashes("tiers", 2)
    s.update_request("a", 32, h)
    assert s.lookup("a", 0) == 0
    s.on_allocated("a", [kv.AllocatedGroup([])], 0)
    step = s.build_step([kv.ScheduledRequest("a", 0, 32, [[1, 2]])])
    s.on_completed([kv.JobReport(j.id) for j in step.store_jobs])
    s.on_finished("a")

    def ask(rid, params):
        req = types.SimpleNamespace(request_id=rid, num_tokens=32, block_hashes=h,
                                    kv_transfer_params=params)
        return c.get_num_new_matched_tokens(req, 0)[0]

    assert ask("b", {"kv_load_tiers": [{"medium": "STORAGE"}]}) == 0
    assert ask("c", {"kv_load_tiers": []}) == 0
    assert ask("d", {"kv_load_tiers": [{"medium": "CPU", "locality": "LOCAL"}]}) == 32
    assert ask("e", {"kv_load_tiers": "CPU"}) == 32
    assert ask("f", None) == 32


@pytest.mark.skipif(HAVE_VLLM, reason="builds the connector over the stub of vLLM's base class")
def test_max_offload_tokens_stores_nothing_past_it(connector_classes, monkeypatch):
    """vLLM's per-request kv_transfer_params {"max_offload_tokens": N}: nothing past the first
    N tokens is stored (0: nothing of the request); ignored when malformed."""
    import types

    from conftest import block_hashes

    c = _scheduler_connector(monkeypatch, {"host_blocks": 32})
    h = block_hashes("offload-cap", 4)  # 64 tokens, 4 host blocks of 16
    ns = types.SimpleNamespace

    def stored(rid, params):
        req = ns(request_id=rid, num_tokens=64, block_hashes=h, kv_transfer_params=params)
        hit, _ = c.get_num_new_matched_tokens(req, 0)
        assert hit == 0
        c.update_state_after_alloc(req, ns(blocks=([],)), 0)
        out = ns(scheduled_new_reqs=[ns(req_id=rid, num_computed_tokens=0,
                                         block_ids=([1, 2, 3, 4],))],
                 scheduled_cached_reqs=ns(req_ids=[], num_computed_tokens=[], new_block_ids=[],
                                          resumed_req_ids=set()),
                 num_scheduled_tokens={rid: 64}, preempted_req_ids=set())
        meta = c.build_connector_meta(out)
        c.request_finished(req, [])
        c._sched.reset_cache()  # the next request finds nothing stored
        return sum(len(j.keys) for j in meta.store_jobs)

    assert stored("a", None) == 4
    assert stored("b", {"max_offload_tokens": 40}) == 2  # 32 tokens: two whole blocks
    assert stored("c", {"max_offload_tokens": 0}) == 0
    for i, bad in enumerate(({"max_offload_tokens": -1}, {"max_offload_tokens": "8"},
                             {"max_offload_tokens": 8.0})):
        assert stored(f"d{i}", bad) == 4
