"""The shared tier from Python: two engines (scheduler + worker each) on one Valkey cluster,
started for this module by scripts/valkey-cluster on its own ports. Engine A stores a prompt;
engine B, with an empty host cache, finds it through an existence check (retry later while it
runs), promotes it and loads it byte for byte."""

import os
import pathlib
import subprocess
import time
import uuid

import numpy as np
import pytest

import kvoffload as kv
from conftest import block_hashes

F, PAGE = 2, 4096
ROOT = pathlib.Path(__file__).resolve().parents[2]
PORT = 7201


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    env = dict(os.environ, KVOFFLOAD_VALKEY_PORT=str(PORT),
               KVOFFLOAD_VALKEY_DIR=str(tmp_path_factory.mktemp("valkey")))
    script = str(ROOT / "scripts" / "valkey-cluster")
    subprocess.run([script, "start", "3"], env=env, check=True, timeout=60,
                   stdout=subprocess.DEVNULL)
    yield f"127.0.0.1:{PORT}"
    subprocess.run([script, "stop"], env=env, check=True, timeout=60)


@pytest.fixture(scope="module")
def secret(tmp_path_factory):
    """The fleet secret's file, mode 0600, as an operator would give it."""
    path = tmp_path_factory.mktemp("secret") / "fleet"
    path.write_bytes(os.urandom(32).hex().encode() + b"\n")
    path.chmod(0o600)
    return str(path)


def engine(gpu, nodes, name, secret, store_threshold=0):
    """The shared tier described once: the scheduler's presence checks and the worker's store
    both come from the TierConfig's store."""
    shared = kv.SharedTierConfig(nodes=nodes, name=name, reply_timeout_ms=2000,
                                 secret_file=secret)
    sc = kv.SchedulerConfig(groups=[kv.GroupConfig("full_attention", 16)], host_blocks=8,
                            block_size_factor=F,
                            tiers=[kv.TierConfig(blocks=1024, medium="shared", store=shared,
                                                 store_threshold=store_threshold)])
    w = kv.Worker(kv.derive_worker_config(sc, kv.WorkerConfig([kv.tensor_of(gpu)], [[(0, PAGE)]],
                                                              threads=1)))
    return kv.Scheduler(sc), w


def run(s, w, step):
    """Runs a step's jobs and reports them; returns the completed load/store jobs."""
    w.submit_step(step)
    ids = [j.id for j in step.load_jobs + step.store_jobs + step.tier_jobs]
    w.wait(ids)
    finished = w.get_finished()
    assert sorted(f.job for f in finished) == sorted(ids)
    assert all(f.ok for f in finished), [f.error for f in finished]
    return s.on_completed([kv.JobReport(f.job, ok=f.ok) for f in finished])


def lookup(s, w, request):
    """Looks up until the answer is in (bounded: 500 tries, 10 ms apart), running the steps
    (promotions) meanwhile."""
    for _ in range(500):
        hit = s.lookup(request)
        if hit is not None:
            return hit
        run(s, w, s.build_step([]))
        time.sleep(0.01)
    raise AssertionError(f"lookup of {request} never answered")


def test_engine_b_loads_what_engine_a_stored(cluster, secret, tmp_path):
    name = f"pytest-{uuid.uuid4()}"
    rng = np.random.default_rng(5)
    h = block_hashes("shared", 4)

    gpu_a = np.zeros((32, PAGE), dtype=np.uint8)
    first = [1, 2, 3, 4]
    gpu_a[first] = rng.integers(0, 256, size=(4, PAGE), dtype=np.uint8)
    s, w = engine(gpu_a, cluster, name, secret)
    s.update_request("a", 64, h)
    assert lookup(s, w, "a") == 0  # nobody has it: checked, then a miss
    s.on_allocated("a", [kv.AllocatedGroup([])], 0)
    run(s, w, s.build_step([kv.ScheduledRequest("a", 0, 64, [first])]))
    step = s.build_step([])
    assert [(j.kind, j.tier, len(j.keys)) for j in step.tier_jobs] == [("write", 0, 2)]
    run(s, w, step)
    assert s.tier_stats(0)["blocks_written"] == 2
    assert w.shared_tier_stats(0)["writes"] == 2

    # Engine B: another scheduler and worker, empty host cache, the same name.
    gpu_b = np.zeros((32, PAGE), dtype=np.uint8)
    s2, w2 = engine(gpu_b, cluster, name, secret, store_threshold=1_000_000)
    s2.update_request("b", 64, h)
    assert s2.lookup("b") is None  # the existence check is in flight
    hit = lookup(s2, w2, "b")
    assert hit == 64
    stats = s2.tier_stats(0)
    assert stats["presence_checks"] == 1 and stats["presence_hits"] == 2
    assert stats["promotions"] == 2
    second = [9, 10, 11, 12]
    s2.on_allocated("b", [kv.AllocatedGroup(second)], hit)
    done = run(s2, w2, s2.build_step([kv.ScheduledRequest("b", hit, 0, [[]])]))
    assert [d.kind for d in done] == ["load"] and done[0].ok
    assert np.array_equal(gpu_b[second], gpu_a[first])
    assert w2.shared_tier_stats(0)["reads"] == 2

    # A third engine under another name finds nothing.
    s3, w3 = engine(np.zeros((32, PAGE), dtype=np.uint8), cluster, name + "-other", secret)
    s3.update_request("c", 64, h)
    assert lookup(s3, w3, "c") == 0

    # A fourth engine under the same name but another fleet secret finds nothing either: its
    # keys' names are other ones, so it can neither read nor test A's blocks.
    other = tmp_path / "other-secret"
    other.write_text(os.urandom(32).hex())
    other.chmod(0o600)
    s4, w4 = engine(np.zeros((32, PAGE), dtype=np.uint8), cluster, name, str(other))
    s4.update_request("d", 64, h)
    assert lookup(s4, w4, "d") == 0
    assert s4.tier_stats(0)["presence_hits"] == 0


def test_shared_tier_needs_a_fleet_secret(tmp_path, monkeypatch):
    """No secret: the tier refuses to start, naming the fields; a short one is refused too;
    insecure=True runs without one."""
    monkeypatch.delenv("KVOFFLOAD_SHARED_SECRET", raising=False)
    gpu = np.zeros((4, PAGE), dtype=np.uint8)

    def worker(**shared):
        return kv.Worker(kv.WorkerConfig([kv.tensor_of(gpu)], [[(0, PAGE)]], host_blocks=2,
                                         tiers=[kv.SharedTierConfig("127.0.0.1:1", "m",
                                                                    **shared)]))
    with pytest.raises(kv.InvalidArgument, match="no fleet secret.*secret_file"):
        worker()
    short = tmp_path / "short"
    short.write_text("too short")
    with pytest.raises(kv.InvalidArgument, match="is 9 bytes; at least 16"):
        worker(secret_file=str(short))
    with pytest.raises(kv.InvalidArgument, match="secret_file .*missing"):
        worker(secret_file=str(tmp_path / "missing"))
    monkeypatch.setenv("KVOFFLOAD_TEST_FLEET", "x" * 32)
    assert worker(secret_env="KVOFFLOAD_TEST_FLEET").shared_tier_stats(0)["writes"] == 0
    assert worker(insecure=True).shared_tier_stats(0)["writes"] == 0


def test_bad_shared_tier_configs_name_the_field():
    gpu = np.zeros((4, PAGE), dtype=np.uint8)
    with pytest.raises(kv.InvalidArgument, match="presence checks need its cluster"):
        kv.Scheduler(groups=[kv.GroupConfig()], host_blocks=2,
                     tiers=[kv.TierConfig(blocks=8, medium="shared")])
    with pytest.raises(kv.InvalidArgument, match="nodes"):
        kv.Worker(kv.WorkerConfig([kv.tensor_of(gpu)], [[(0, PAGE)]], host_blocks=2,
                                  tiers=[kv.SharedTierConfig("no-port", "m")]))
    with pytest.raises(kv.InvalidArgument, match="name"):
        kv.Worker(kv.WorkerConfig([kv.tensor_of(gpu)], [[(0, PAGE)]], host_blocks=2,
                                  tiers=[kv.SharedTierConfig("127.0.0.1:1", "")]))
    with pytest.raises(kv.InvalidArgument, match=r"tiers\[0\]\.tp_size: expected an int"):
        kv.Worker(kv.WorkerConfig([kv.tensor_of(gpu)], [[(0, PAGE)]], host_blocks=2,
                                  tiers=[kv.SharedTierConfig("127.0.0.1:1", "m", tp_size="2")]))
