"""kvoffload as SGLang's HiCache storage tier, driven by SGLang's own code: its device and host
KV pools (MHATokenToKVPool, MHATokenToKVPoolHost, on the CPU), its HiCacheController with the
"dynamic" backend loading kvoffload.sglang.KvoffloadStorage by module path (SGLang's backup
thread calls batch_set_v1, its prefetch threads batch_exists and batch_get_v1), and SGLang's
own page hashes. A real SGLang server cannot run on this CPU (docs/sglang.md says why); this is
the storage path such a server runs.

Every scenario compares the host pages SGLang's prefetch filled with the bytes written under
the same tokens, byte for byte:
  restart    per host-pool layout: a controller writes three requests through a disk tier,
             a second controller over new pools (a restarted server) prefetches them;
  fleet      two controllers share a Valkey cluster (TLS off, a fleet secret): B finds and
             loads A's pages; a controller with another secret finds none;
  reset      clear() (SGLang's reset): nothing is found again, after a restart either;
  refused    bad extra configs and unproven engine features stop the controller at start
             with a message naming the field.

    python tests/sglang/hicache_check.py [--quick]
"""

import ctypes
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import warnings

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PAGE, LAYERS, HEADS, DIM = 4, 2, 2, 8
TOKENS = 64  # the device pool's tokens (the host pool holds HICACHE_RATIO times more)
PORT = 7371  # the Valkey cluster's first port (7371-7373)
DEADLINE = 30.0  # seconds any one wait of this check may take

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from sglang.srt.managers.cache_controller import HiCacheController  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.utils import get_storage_hash_str  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402

failures = []


def say(text):
    print(text, flush=True)
    if "FAILED" in text:
        failures.append(text)


class Alloc:  # what the controller asks of SGLang's token allocator: the device pool
    def __init__(self, dev):
        self.dev = dev

    def get_kvcache(self):
        return self.dev


def controller(layout, extra, model="tiny/llama", dtype=torch.float16):
    dev = MHATokenToKVPool(TOKENS, PAGE, dtype, HEADS, DIM, LAYERS, "cpu", False,
                           start_layer=0, end_layer=LAYERS)
    host = MHATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 4.0, 0, PAGE, layout,
                                pin_memory=False, device="cpu", device_capacity_tokens=dev.size,
                                start_layer=0, end_layer=LAYERS)
    cfg = dict({"backend_name": "kvoffload", "module_path": "kvoffload.sglang",
                "class_name": "KvoffloadStorage", "interface_v1": 1}, **extra)
    ctrl = HiCacheController(Alloc(dev), host, PAGE, dist.group.WORLD, threading.Event(),
                             io_backend="direct", storage_backend="dynamic", model_name=model,
                             storage_backend_extra_config=cfg)
    return ctrl, host


def page_bytes(host, indices):
    """The bytes of these token slots' pages, as SGLang's zero-copy metadata places them."""
    ptrs, sizes = host.get_page_buffer_meta(indices)
    return b"".join(ctypes.string_at(p, s) for p, s in zip(ptrs, sizes))


def fill(host, indices, rng):
    ptrs, sizes = host.get_page_buffer_meta(indices)
    for p, s in zip(ptrs, sizes):
        ctypes.memmove(p, rng.randbytes(s), s)


def wait_for(what, cond):
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    say(f"sglang FAILED: {what}: no answer in {DEADLINE} s")
    return False


def write(ctrl, host, tokens, rng):
    """SGLang's backup of a request's pages: returns their bytes."""
    idx = host.alloc(len(tokens))
    fill(host, idx, rng)
    want = page_bytes(host, idx)
    ctrl.write_storage(idx, tokens, hash_value=get_storage_hash_str(tokens, None, PAGE))
    wait_for("a backup's ack", lambda: ctrl.ack_backup_queue.qsize() > 0)
    ack = ctrl.ack_backup_queue.get()
    if ack.completed_tokens != len(tokens):
        say(f"sglang FAILED: backup stored {ack.completed_tokens} of {len(tokens)} tokens")
    host.free(idx)
    return want


def prefetch(ctrl, host, rid, tokens):
    """SGLang's prefetch: the hit query (batch_exists), then the pages (batch_get_v1) into
    newly allocated host slots. Returns (hit tokens, loaded tokens, the loaded bytes)."""
    op = ctrl.prefetch(rid, tokens, last_hash=None, prefix_keys=[])
    if not wait_for("the hit query", lambda: ctrl.prefetch_hit_queue.qsize() > 0):
        return 0, 0, b""
    op = ctrl.prefetch_hit_queue.get()
    hit = op.storage_hit_count
    if hit == 0:
        return 0, 0, b""
    op.host_indices = host.alloc(hit)
    ctrl.prefetch_buffer.put(op)
    # The loaded tokens come back as SGLang's acks to its scheduler thread (cumulative).
    loaded = [0]

    def acked():
        while ctrl.ack_prefetch_queue.qsize() > 0:
            ack = ctrl.ack_prefetch_queue.get()
            if ack.rid == rid and ack.completed_tokens is not None:
                loaded[0] = max(loaded[0], ack.completed_tokens)
        return loaded[0] >= hit
    wait_for("the prefetch's pages", acked)
    got = page_bytes(host, op.host_indices[:loaded[0]])
    return hit, loaded[0], got


def backend(ctrl):
    b = ctrl.storage_backend
    return getattr(b, "_backend", b)  # under SGLang's fault-injection wrapper, if it is on


def close(ctrl):
    backend(ctrl).close()  # the tier writes finish (bounded), as at a server's exit
    ctrl.storage_stop_event.set()


def requests(rng, n):
    return [[rng.randrange(1, 500) for _ in range(PAGE * rng.randint(2, 5))] for _ in range(n)]


def restart(layout, rng):
    disk = tempfile.mkdtemp(prefix="kvoffload-sglang-disk-")
    extra = {"host_bytes": "1MiB", "tiers": [{"medium": "disk", "path": disk,
                                              "capacity_bytes": "4MiB"}]}
    ctrl, host = controller(layout, extra)
    reqs = requests(rng, 3)
    written = [write(ctrl, host, toks, rng) for toks in reqs]
    stats = backend(ctrl).kvoffload_stats()
    close(ctrl)
    ctrl2, host2 = controller(layout, extra)
    restored = backend(ctrl2)._store.restored
    ok = True
    for i, (toks, want) in enumerate(zip(reqs, written)):
        hit, loaded, got = prefetch(ctrl2, host2, f"r{i}", toks)
        if hit != len(toks) or loaded != len(toks) or got != want:
            ok = False
            say(f"sglang restart {layout} FAILED: request {i}: hit {hit}, loaded {loaded} of "
                f"{len(toks)} tokens, bytes equal: {got == want}")
    # A request never written misses.
    miss, _, _ = prefetch(ctrl2, host2, "other", [7] * (PAGE * 3))
    if miss:
        ok = False
        say(f"sglang restart {layout} FAILED: an unwritten request hit {miss} tokens")
    st = backend(ctrl2).kvoffload_stats()
    close(ctrl2)
    if ok:
        say(f"sglang restart {layout}: 3 requests ({sum(map(len, reqs))} tokens) written through "
            f"the disk tier ({stats.get('tier.disk.blocks_written', 0)} pages written before "
            f"the exit's flush), restored {restored}, every page loaded after the restart "
            f"byte-identical; tier promotions {st.get('tier.disk.promotions')}")
    return disk, extra


def reset(layout, disk, extra, rng):
    ctrl, host = controller(layout, extra)
    toks = requests(rng, 1)[0]
    write(ctrl, host, toks, rng)
    backend(ctrl).clear()
    hit, _, _ = prefetch(ctrl, host, "after-reset", toks)
    close(ctrl)
    ctrl2, host2 = controller(layout, extra)
    hit2, _, _ = prefetch(ctrl2, host2, "after-reset-restart", toks)
    close(ctrl2)
    if hit or hit2:
        say(f"sglang reset FAILED: {hit} tokens hit after clear(), {hit2} after a restart")
    else:
        say("sglang reset: clear() leaves nothing to find, before and after a restart")


def cluster(action, env):
    script = os.path.join(ROOT, "scripts", "valkey-cluster")
    args = [script, action] + (["3"] if action == "start" else [])
    r = subprocess.run(args, env=env, timeout=120, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"valkey-cluster {action} failed: {r.stdout[-2000:]}")


def fleet(rng):
    work = tempfile.mkdtemp(prefix="kvoffload-sglang-fleet-")
    env = dict(os.environ, KVOFFLOAD_VALKEY_PORT=str(PORT), KVOFFLOAD_VALKEY_DIR=work)
    cluster("start", env)
    try:
        secrets = []
        for name in ("fleet", "other"):
            path = os.path.join(work, name)
            with open(path, "w") as f:
                f.write(os.urandom(32).hex())
            os.chmod(path, 0o600)
            secrets.append(path)

        def extra(secret):
            return {"host_bytes": "1MiB", "tiers": [{
                "medium": "shared", "nodes": f"127.0.0.1:{PORT}", "secret_file": secret,
                "reply_timeout_ms": 2000}]}
        a, host_a = controller("page_first", extra(secrets[0]))
        reqs = requests(rng, 2)
        written = [write(a, host_a, t, rng) for t in reqs]
        close(a)
        b, host_b = controller("page_first", extra(secrets[0]))
        results = [prefetch(b, host_b, f"b{i}", t) for i, t in enumerate(reqs)]
        close(b)
        c, host_c = controller("page_first", extra(secrets[1]))
        other = prefetch(c, host_c, "c", reqs[0])
        close(c)
        good = all(h == len(t) and n == len(t) and got == want
                   for (h, n, got), t, want in zip(results, reqs, written))
        if not good or other[0]:
            say(f"sglang fleet FAILED: B's (hit, loaded) {[r[:2] for r in results]}, bytes "
                f"equal {[r[2] == w for r, w in zip(results, written)]}; another secret hit "
                f"{other[0]} tokens")
        else:
            say(f"sglang fleet: B loaded A's {len(reqs)} requests from the Valkey cluster byte-"
                "identical; a server with another secret found none of them")
    finally:
        cluster("stop", env)


def refused():
    cases = [
        ({"host_bytes": "1MiB", "interface_v1": 0}, '"interface_v1": 1'),
        ({"host_bytes": "1MiB", "hosts_bytes": 5}, "unknown key(s) ['hosts_bytes']"),
        ({}, "set host_bytes"),
        ({"host_bytes": "1MiB", "tiers": [{"medium": "shared", "nodes": "127.0.0.1:1",
                                           "password": "x"}]}, "tiers[0].password"),
        ({"host_bytes": "1MiB", "tiers": [{"medium": "disk", "path": "/tmp/x"}]},
         "tiers[0].capacity_bytes"),
        ({"host_bytes": "1MiB", "block_size": 8}, "block_size 8 is not SGLang's page size 4"),
        ({"host_bytes": "1MiB", "timeout_ms": 0}, "timeout_ms 0"),
        # fp8 KV: the pool stores uint8, which cannot tell e4m3 from e5m2 pages apart; with
        # SGLang's kv_cache_dtype unpublished (no server), tiers are refused.
        ({"host_bytes": "1MiB", "tiers": [{"medium": "disk", "path": "/tmp/kvoffload-fp8",
                                           "capacity_bytes": "1MiB"}], "dtype": "fp8"},
         "1-byte KV"),
    ]
    bad = []
    for extra, want in cases:
        extra = dict(extra)
        dtype = torch.float8_e4m3fn if extra.pop("dtype", None) == "fp8" else torch.float16
        try:
            ctrl, _ = controller("page_first", extra, dtype=dtype)
            close(ctrl)
            bad.append(f"{extra}: started")
        except Exception as e:  # noqa: BLE001 - the controller re-raises what the backend did
            if want not in str(e):
                bad.append(f"{extra}: {e!r} (wanted {want!r})")
    if bad:
        say("sglang refused FAILED: " + "; ".join(bad))
    else:
        say(f"sglang refused: {len(cases)} bad extra configs stop the controller at start, each "
            "message naming the field")


def main(argv):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29517 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    get_parallel().override_permanently(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1,
                                        attn_dcp_size=1, attn_dcp_rank=0)
    seed = int(os.environ.get("KVOFFLOAD_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (KVOFFLOAD_SEED={seed} replays)", flush=True)
    rng = random.Random(seed)
    layouts = ["page_first"] if "--quick" in argv else ["page_first", "layer_first",
                                                        "page_first_direct", "page_head"]
    for layout in layouts:
        disk, extra = restart(layout, rng)
    reset(layouts[-1], disk, extra, rng)
    if "--no-cluster" not in argv:
        fleet(rng)
    refused()
    print(json.dumps({"failures": failures}))
    return 1 if failures else 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)  # SGLang's controller threads are daemons of no further use
