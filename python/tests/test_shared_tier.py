"""The shared tier from Python: two engines (scheduler + worker each) on one Valkey cluster,
started for this module by scripts/valkey-cluster on its own ports. Engine A stores a prompt;
engine B, with an empty host cache, finds it through an existence check (retry later while it
runs), promotes it and loads it byte for byte."""

import os
import sys
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


# ---- weights: blocks of other weights are never found --------------------------------------

def tiered_engine(gpu, nodes, name, secret, disk, weights, shared_threshold=0):
    """A disk tier, then the shared tier, under `weights`; the disk's scan restored."""
    shared = kv.SharedTierConfig(nodes=nodes, name=name, reply_timeout_ms=2000,
                                 secret_file=secret)
    store = kv.DiskTierConfig(path=str(disk), capacity_bytes="1MiB", model="pytest-model",
                              dtype="uint8")
    sc = kv.SchedulerConfig(groups=[kv.GroupConfig("full_attention", 16)], host_blocks=8,
                            block_size_factor=F, weights=weights,
                            tiers=[kv.TierConfig(blocks=1, store=store),
                                   kv.TierConfig(blocks=1024, medium="shared", store=shared,
                                                 store_threshold=shared_threshold)])
    w = kv.Worker(kv.derive_worker_config(sc, kv.WorkerConfig([kv.tensor_of(gpu)], [[(0, PAGE)]],
                                                              threads=1)))
    sc.tiers[0].blocks = w.tier_slots(0)
    s = kv.Scheduler(sc)
    return s, w, s.restore_tier(0, w.tier_scan(0))


def kv_of(weights):
    """The KV bytes of the test's prompt under `weights` (other weights: other bytes)."""
    seed = int.from_bytes(weights.encode(), "little") % (1 << 32)
    return np.random.default_rng(seed).integers(0, 256, size=(4, PAGE), dtype=np.uint8)


def store_prompt(s, w, gpu, request, h, weights):
    """Computes the prompt under `weights` into GPU blocks 1-4 and stores it through host
    memory to both tiers."""
    gpu[[1, 2, 3, 4]] = kv_of(weights)
    written = [s.tier_stats(t)["blocks_written"] + 2 for t in (0, 1)]
    s.update_request(request, 64, h)
    assert lookup(s, w, request) == 0
    s.on_allocated(request, [kv.AllocatedGroup([])], 0)
    run(s, w, s.build_step([kv.ScheduledRequest(request, 0, 64, [[1, 2, 3, 4]])]))
    for _ in range(20):  # the write-through jobs (bounded)
        if [s.tier_stats(t)["blocks_written"] for t in (0, 1)] == written:
            break
        run(s, w, s.build_step([]))
    assert [s.tier_stats(t)["blocks_written"] for t in (0, 1)] == written
    s.on_finished(request)


def load_prompt(s, w, gpu, request, h):
    """Looks the prompt up; on a hit loads it into GPU blocks 9-12 and returns their bytes."""
    s.update_request(request, 64, h)
    hit = lookup(s, w, request)
    if hit == 0:
        return None
    s.on_allocated(request, [kv.AllocatedGroup([9, 10, 11, 12])], hit)
    done = run(s, w, s.build_step([kv.ScheduledRequest(request, hit, 0, [[]])]))
    assert [d.kind for d in done] == ["load"] and done[0].ok
    return gpu[[9, 10, 11, 12]].copy()


def weights_child(nodes, name, secret, disk):
    """The process that gets killed: stores the prompt under w1, moves to w2 (reset_cache),
    finds nothing, stores the prompt's w2 bytes, and dies by SIGKILL without clearing a
    tier."""
    gpu = np.zeros((32, PAGE), dtype=np.uint8)
    h = block_hashes("weights", 4)
    s, w, restored = tiered_engine(gpu, nodes, name, secret, disk, "w1")
    assert restored == 0
    store_prompt(s, w, gpu, "a", h, "w1")
    s.reset_cache("w2")  # no clear_tiers(): the process dies first
    assert load_prompt(s, w, gpu, "b", h) is None
    store_prompt(s, w, gpu, "c", h, "w2")
    print("stored under w1 and w2", flush=True)
    os.kill(os.getpid(), 9)


def test_new_weights_never_find_old_blocks_also_after_a_sigkill(cluster, secret, tmp_path):
    """Same prompt, two weights: every engine loads exactly its own weights' bytes from host
    memory, disk and the cluster, or misses; a process killed between reset_cache and any
    clearing leaves nothing another weights' engine can find."""
    name = f"pytest-weights-{uuid.uuid4()}"
    disk = tmp_path / "disk"
    child = subprocess.run(
        [sys.executable, "-c",
         "import sys; sys.path.insert(0, sys.argv[1]); import test_shared_tier as t; "
         "t.weights_child(*sys.argv[2:])",
         str(pathlib.Path(__file__).parent), cluster, name, secret, str(disk)],
        capture_output=True, text=True, timeout=120)
    assert child.returncode == -9, child.stdout + child.stderr
    assert "stored under w1 and w2" in child.stdout
    h = block_hashes("weights", 4)
    gpu = np.zeros((32, PAGE), dtype=np.uint8)

    # A restart under w2 on the killed process's disk: only w2's slots come back.
    s, w, restored = tiered_engine(gpu, cluster, name, secret, disk, "w2")
    assert restored == 2
    got = load_prompt(s, w, gpu, "r", h)
    assert got is not None and np.array_equal(got, kv_of("w2"))
    assert s.tier_stats(0)["hits"] == 2 and s.tier_stats(1)["presence_checks"] == 0
    del s, w
    # New engines with empty disks: the cluster gives each its own weights' bytes.
    for weights in ("w1", "w2"):
        s, w, restored = tiered_engine(gpu, cluster, name, secret, tmp_path / weights, weights,
                                       shared_threshold=1_000_000)
        assert restored == 0
        got = load_prompt(s, w, gpu, "r", h)
        assert got is not None and np.array_equal(got, kv_of(weights)), weights
        assert s.tier_stats(1)["promotions"] == 2
        del s, w
    # Weights nobody stored: a miss in every tier, on the same disk and cluster.
    s, w, restored = tiered_engine(gpu, cluster, name, secret, disk, "w3")
    assert restored == 0
    assert load_prompt(s, w, gpu, "r", h) is None
    assert s.tier_stats(1)["presence_hits"] == 0
    # And in one process: reset_cache with new weights hides every tier's blocks at once;
    # reset_cache back to the old ones finds them again (the bytes were there all along).
    s.reset_cache("w2")
    got = load_prompt(s, w, gpu, "r2", h)
    assert got is not None and np.array_equal(got, kv_of("w2"))
    s.reset_cache("w3")
    assert load_prompt(s, w, gpu, "r3", h) is None
    # Without an identity, or with the empty one, old blocks would stay reachable: refused.
    with pytest.raises(kv.InvalidArgument, match=r"reset_cache\(weights\)"):
        s.reset_cache()
    with pytest.raises(kv.InvalidArgument, match="weights is empty"):
        s.reset_cache("")


def test_tls_and_auth_settings_are_checked_by_field(tmp_path, monkeypatch):
    """TLS and AUTH from Python: files that cannot be loaded and settings that do not go
    together are refused at start, naming the field (the round trips over TLS with AUTH run
    in C++ and in the two-process test against scripts/valkey-cluster --tls --auth)."""
    monkeypatch.setenv("KVOFFLOAD_SHARED_SECRET", "s" * 32)
    monkeypatch.delenv("KVOFFLOAD_SHARED_PASSWORD", raising=False)
    gpu = np.zeros((4, PAGE), dtype=np.uint8)

    def worker(**shared):
        return kv.Worker(kv.WorkerConfig([kv.tensor_of(gpu)], [[(0, PAGE)]], host_blocks=2,
                                         tiers=[kv.SharedTierConfig("127.0.0.1:1", "m",
                                                                    **shared)]))
    with pytest.raises(kv.InvalidArgument, match='tls_ca_file ".*missing.crt"'):
        worker(tls=True, tls_ca_file=str(tmp_path / "missing.crt"))
    with pytest.raises(kv.InvalidArgument, match="set tls = true"):
        worker(tls_ca_file=str(tmp_path / "ca.crt"))
    with pytest.raises(kv.InvalidArgument, match='username "u" without a password'):
        worker(username="u")
    with pytest.raises(kv.InvalidArgument, match="password_file"):
        worker(username="u", password_file=str(tmp_path / "missing"))
    with pytest.raises(kv.InvalidArgument, match=r"tiers\[0\]\.ttl_seconds: expected an int"):
        worker(ttl_seconds="1h")
    password = tmp_path / "password"
    password.write_text("hunter2-hunter2\n")
    password.chmod(0o600)
    stats = worker(username="u", password_file=str(password), ttl_seconds=60,
                   only_seeds=True).shared_tier_stats(0)
    assert stats["auth_errors"] == 0 and stats["tls_errors"] == 0
