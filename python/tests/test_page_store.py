"""kvoffload.engine.page_store: the key -> page store engines with a get/set/exists storage
interface use (SGLang's HiCache tier). Pages are NumPy rows here; every get is compared with
what was set under that key, byte for byte, or must be a miss."""

import hashlib
import os
import random
import threading

import numpy as np
import pytest

import kvoffload as kv
from kvoffload.engine.page_store import PageStore, key_bytes, page_tensor

P, PAGE, PAGES = 4, 512, 32


def config(tiers=(), host_blocks=8, weights="w"):
    return kv.SchedulerConfig(groups=[kv.GroupConfig("full_attention", P)],
                              host_blocks=host_blocks, block_size_factor=1, hash_block_size=P,
                              tiers=list(tiers), weights=weights)


def disk(path, capacity=1 << 20, model="w"):
    return kv.TierConfig(medium="disk", blocks=1, store=kv.DiskTierConfig(
        path=str(path), capacity_bytes=capacity, model=model, tp_size=1))


def keys_of(tag, n):
    return [hashlib.sha256(f"{tag}/{i}".encode()).hexdigest() for i in range(n)]


def content(key):
    """The bytes page `key` holds: its hash repeated (a page of another key differs)."""
    return np.frombuffer(hashlib.sha256(key.encode()).digest() * (PAGE // 32), np.uint8)


class Pages:
    """The engine's host pages: two tensors (K and V, say), page p of each."""

    def __init__(self):
        self.k = np.zeros((PAGES, PAGE), np.uint8)
        self.v = np.zeros((PAGES, PAGE), np.uint8)

    def tensors(self):
        return [(self.k.ctypes.data, PAGES, PAGE, PAGE), (self.v.ctypes.data, PAGES, PAGE, PAGE)]

    def write_all(self, keys, first=0):
        """keys[i]'s bytes into page first + i."""
        for i, k in enumerate(keys):
            self.write(k, first + i)

    def write(self, key, p):
        self.k[p] = content(key)
        self.v[p] = content(key)[::-1]

    def holds(self, key, p):
        return (np.array_equal(self.k[p], content(key)) and
                np.array_equal(self.v[p], content(key)[::-1]))


def test_keys_and_page_tensors():
    h = hashlib.sha256(b"x").hexdigest()
    assert key_bytes(h) == bytes.fromhex(h)
    assert key_bytes(b"raw") == b"raw"
    assert key_bytes("not hex at all") == hashlib.sha256(b"not hex at all").digest()
    t = page_tensor(4096, 3, 100, 128)
    assert (t.base, t.num_blocks, t.page_bytes, t.block_stride_bytes) == (4096 - 128, 4, 100, 128)
    with pytest.raises(kv.InvalidArgument):
        page_tensor(4096, 3, 200, 128)  # pages overlap


def test_set_get_exists_in_host_memory():
    pages = Pages()
    store = PageStore(config(), pages.tensors())
    keys = keys_of("a", 6)
    pages.write_all(keys)
    assert store.exists(keys) == 0
    assert store.set(keys[:4], [0, 1, 2, 3])
    assert store.exists(keys) == 4  # the leading keys held
    assert store.set(keys, list(range(6)))  # the first four are kept as they are
    assert store.exists(keys) == 6
    assert store.get(keys, list(range(10, 16))) == 6
    assert all(pages.holds(k, 10 + i) for i, k in enumerate(keys))
    assert store.get(keys_of("b", 2), [20, 21]) == 0  # a miss writes nothing
    assert not pages.k[20].any()


def test_misuse_is_refused_by_name():
    store = PageStore(config(), Pages().tensors())
    with pytest.raises(kv.InvalidArgument, match="2 keys for 1 pages"):
        store.set(keys_of("a", 2), [0])
    with pytest.raises(kv.InvalidArgument, match="outside the 32 pages"):
        store.get(keys_of("a", 1), [32])
    with pytest.raises(kv.InvalidArgument, match="named twice"):
        store.set(keys_of("a", 2), [3, 3])


def test_disk_tier_survives_a_restart_and_a_reset_forgets(tmp_path):
    pages = Pages()
    keys = keys_of("disk", 5)
    pages.write_all(keys)
    store = PageStore(config([disk(tmp_path)]), pages.tensors())
    assert store.set(keys, list(range(5)))
    assert store.flush(10.0)
    assert store.stats()["tier.disk.blocks_written"] == 5
    del store
    fresh = Pages()
    store = PageStore(config([disk(tmp_path)]), fresh.tensors())
    assert store.restored == {0: 5}
    assert store.exists(keys) == 5  # promoted from the disk
    assert store.get(keys, list(range(20, 25))) == 5
    assert all(fresh.holds(k, 20 + i) for i, k in enumerate(keys))
    store.reset()
    assert store.exists(keys) == 0
    del store
    # The reset emptied the disk: a restart finds nothing either.
    assert PageStore(config([disk(tmp_path)]), Pages().tensors()).exists(keys) == 0


def test_other_weights_never_read_the_blocks(tmp_path):
    pages = Pages()
    keys = keys_of("w", 3)
    pages.write_all(keys)
    store = PageStore(config([disk(tmp_path)]), pages.tensors())
    assert store.set(keys, [0, 1, 2]) and store.flush(10.0)
    del store
    other = PageStore(config([disk(tmp_path, model="other")], weights="other"), Pages().tensors())
    assert other.exists(keys) == 0


def test_random_operations_never_serve_wrong_bytes(tmp_path):
    """Random sets, gets and exists from two threads over a small host pool and a small disk
    (evictions in both), against a model of what was set: a get either fills exactly the
    bytes set under its keys or misses; exists never claims more than a get then returns."""
    seed = int(os.environ.get("KVOFFLOAD_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (KVOFFLOAD_SEED={seed} replays)")
    pages = Pages()
    page_bytes = 2 * PAGE
    store = PageStore(config([disk(tmp_path, capacity=24 * page_bytes + 8192)], host_blocks=6),
                      pages.tensors())
    universe = keys_of("r", 40)
    errors, lock = [], threading.Lock()

    def worker(tid):
        rng = random.Random(seed * 7 + tid)
        own = list(range(tid * 16, tid * 16 + 16))  # each thread's pages
        for step in range(150):
            start = rng.randrange(len(universe) - 8)
            keys = universe[start:start + rng.randint(1, 8)]
            chosen = rng.sample(own, len(keys))
            op = rng.random()
            if op < 0.4:
                for k, p in zip(keys, chosen):
                    pages.write(k, p)
                store.set(keys, chosen)
            else:
                for p in chosen:
                    pages.k[p] = 0xEE
                    pages.v[p] = 0xEE
                n = store.get(keys, chosen)
                bad = [k for k, p in zip(keys[:n], chosen) if not pages.holds(k, p)]
                if bad or not 0 <= n <= len(keys):
                    with lock:
                        errors.append(f"seed {seed} thread {tid} step {step}: get -> {n}, "
                                      f"{len(bad)} wrong pages")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive(), f"seed {seed}: a thread is stuck"
    assert not errors, errors[:3]
    stats = store.stats()
    assert stats["hits"] > 0 and stats["evictions"] > 0, (seed, stats)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A Valkey cluster of three nodes on ports 7221-7223 (scripts/valkey-cluster)."""
    import pathlib
    import subprocess

    root = pathlib.Path(__file__).resolve().parents[2]
    env = dict(os.environ, KVOFFLOAD_VALKEY_PORT="7221",
               KVOFFLOAD_VALKEY_DIR=str(tmp_path_factory.mktemp("valkey")))
    script = str(root / "scripts" / "valkey-cluster")
    subprocess.run([script, "start", "3"], env=env, check=True, timeout=60,
                   stdout=subprocess.DEVNULL)
    yield "127.0.0.1:7221"
    subprocess.run([script, "stop"], env=env, check=True, timeout=60)


def test_shared_tier_between_two_stores(cluster, tmp_path):
    """A set asks the cluster first (an existence check, "retry later" while it runs) and
    must still store and write through; another store then finds the pages in the cluster and
    loads them; a store with another secret finds none."""
    secrets = []
    for name in ("fleet", "other"):
        path = tmp_path / name
        path.write_text(os.urandom(32).hex())
        path.chmod(0o600)
        secrets.append(str(path))

    def shared(secret):
        return kv.TierConfig(medium="shared", blocks=1024, store=kv.SharedTierConfig(
            nodes=cluster, name=f"page-store-{tmp_path.name}", reply_timeout_ms=2000,
            secret_file=secret))

    a_pages, b_pages = Pages(), Pages()
    keys = keys_of("fleet", 4)
    a_pages.write_all(keys)
    a = PageStore(config([shared(secrets[0])]), a_pages.tensors())
    assert a.set(keys, [0, 1, 2, 3])
    assert a.flush(10.0)
    assert a.stats()["tier.shared.blocks_written"] == 4
    b = PageStore(config([shared(secrets[0])]), b_pages.tensors())
    assert b.exists(keys) == 4
    assert b.get(keys, [8, 9, 10, 11]) == 4
    assert all(b_pages.holds(k, 8 + i) for i, k in enumerate(keys))
    c = PageStore(config([shared(secrets[1])]), Pages().tensors())
    assert c.exists(keys) == 0


def test_a_set_the_host_cannot_hold_is_false_and_counted():
    """Eight pages into four host blocks: the scheduler stores none of them (no room for the
    request's blocks); set must say so rather than claim them stored."""
    pages = Pages()
    keys = keys_of("big", 8)
    pages.write_all(keys)
    store = PageStore(config(host_blocks=4), pages.tensors())
    assert not store.set(keys, list(range(8)))
    assert store.stats()["failed_sets"] == 1
    assert store.exists(keys) < 8
    assert store.set(keys[:3], [0, 1, 2])  # what fits is stored, and True


def test_back_to_back_sets_wait_for_tier_writes_holding_the_host(tmp_path):
    """Host blocks a tier write still reads cannot be evicted: a set that needs them drains
    the writes and stores, rather than returning True with nothing stored."""
    pages = Pages()
    store = PageStore(config([disk(tmp_path, capacity=1 << 22)], host_blocks=8), pages.tensors())
    for r in range(6):
        keys = keys_of(f"burst{r}", 8)
        for i, k in enumerate(keys):
            pages.write(k, i)
        assert store.set(keys, list(range(8))), (r, store.stats())
    assert store.flush(10.0)
    assert store.stats()["tier.disk.blocks_written"] == 48
