"""kvoffload in a real SGLang 0.5.23 server doing forward passes on the CPU, compared with the
same server without HiCache: greedy, float32, 8 output tokens with logprobs; tokens must be
identical and logprobs within LOGPROB_TOL.

SGLang cannot run HiCache on a CPU as shipped (docs/sglang.md): tests/sglang/cpu_shim (on
PYTHONPATH, KVOFFLOAD_SGLANG_CPU_SHIM=1) leaves its host pool unpinned and gives the "direct"
io backend a torch index copy. Everything else is SGLang's: its HTTP server, scheduler, radix
tree, HiCacheController, page hashes and the "dynamic" backend loading
kvoffload.sglang.KvoffloadStorage by module path. The model is a tiny Llama written here from
a seed (2 layers, weights N(0, 1/fan-in), so every prompt token matters).

  plain      a server without HiCache: the reference outputs of prompts A (300 tokens), B (A's
             first 256 tokens, then its own), C (400); SGLang prefetches from storage only
             from 256 tokens on (its prefetch threshold)
  tiers      server 1 (disk tier D1 + a Valkey cluster with a fleet secret): A, B, C; once their
             pages are in both tiers, /flush_cache empties SGLang's GPU and host caches and A
             and C must come back from storage (cached_tokens_details.storage), identical
  fleet      server 2 (its own disk tier D2, the same cluster and secret), running beside
             server 1: A and C from the cluster, identical
  restart    server 3 (disk tier D1 only) after both stopped: A and C from disk, identical
  control    the check itself, in server 3: after a flag file appears, one token of the first
             page each kvoffload load fills has its layer-0 keys and values negated in SGLang's
             host pool (the shim's fault, as if the store served one wrong token); A, loaded
             again after /flush_cache, must differ (tokens, or logprobs beyond LOGPROB_TOL), or
             the check is blind
  refused    a server whose extra config has a misspelt key must exit at start, its log
             naming the key

Every server poisons its KV pools whenever SGLang clears them (the shim's test hook):
/flush_cache frees slots but keeps their bytes, so a hit that copied nothing could otherwise
read the right KV left behind. kvoffload's servers wait for SGLang's prefetches to complete
(--hicache-storage-prefetch-policy wait_complete), so a slow machine costs time, not hits.

    python tests/sglang/server_check.py
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PAGE = 16
PORT = 31101  # servers listen on PORT, PORT + 1, ...
CLUSTER = 7391  # the Valkey cluster's first port (7391-7393)
START_TIMEOUT = 240  # seconds a server may take to start (about 35 on this machine)
CALL_TIMEOUT = 120
LOGPROB_TOL = 1e-4
OUTPUT = 8  # tokens generated per prompt
PAGE_BYTES = 2 * 2 * PAGE * 2 * 16 * 4  # K and V, 2 layers, 2 KV heads of 16 float32s
# A disk-tier slot: a 4 KiB header, then the page rounded up to 4 KiB (src/tiers/disk).
SLOT_BYTES = 4096 + -(-PAGE_BYTES // 4096) * 4096

failures = []


def say(text):
    print(text, flush=True)
    if "FAILED" in text:
        failures.append(text)


TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, num_hidden_layers=2, vocab_size=512, max_position_embeddings=2048)


def write_model(d, seed, shape=None):
    """A Llama (float32 safetensors; TINY unless `shape` is given) whose weights are drawn per
    parameter name from `seed`: N(0, 1) embeddings, N(0, 1/fan-in) matrices, unit norms."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(**(shape or TINY), bos_token_id=1, eos_token_id=2,
                      tie_word_embeddings=False, torch_dtype="float32")
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            g = torch.Generator().manual_seed(seed ^ zlib.crc32(name.encode()))
            if "norm" in name:
                p.fill_(1.0)
            elif "embed" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    model.save_pretrained(d)
    return d


def hicache(storage, extra=None, prefetch=None):
    """The server flags of HiCache over SGLang's `storage` backend (the ones the CPU shim
    serves: the direct io backend, layer_first host pages); prefetch: SGLang's prefetch policy
    (its default, "timeout", gives up on a slow prefetch after about a second)."""
    args = ["--enable-hierarchical-cache", "--hicache-ratio", "2", "--hicache-io-backend",
            "direct", "--hicache-mem-layout", "layer_first", "--hicache-storage-backend", storage]
    args += ["--hicache-storage-prefetch-policy", prefetch] if prefetch else []
    return args + (["--hicache-storage-backend-extra-config", extra] if extra else [])


def extra_config(**kw):
    return json.dumps(dict({"backend_name": "kvoffload", "module_path": "kvoffload.sglang",
                            "class_name": "KvoffloadStorage", "interface_v1": 1,
                            "host_bytes": "4MiB"}, **kw))


def disk(path):
    return {"medium": "disk", "path": path, "capacity_bytes": "64MiB"}


def shared(secret):
    return {"medium": "shared", "nodes": f"127.0.0.1:{CLUSTER}", "secret_file": secret,
            "reply_timeout_ms": 2000}


class Server:
    def __init__(self, name, model, port, work, extra=None, env=None, args=None):
        """extra: kvoffload's extra config (HiCache on, the dynamic backend, prefetches waited
        for), else none; args: the server's flags after the model's, the port's and the
        device's (default: tokenizer off, a KV cache of 4096 tokens)."""
        self.name, self.port = name, port
        self.log_path = os.path.join(work, f"server-{name}.log")
        args = [sys.executable, "-m", "sglang.launch_server", "--model-path", model,
                "--device", "cpu", "--dtype", "float32", "--page-size", str(PAGE),
                "--host", "127.0.0.1", "--port", str(port), "--nccl-port", str(port + 1000),
                "--random-seed", "0"] + \
            (["--max-total-tokens", "4096", "--skip-tokenizer-init"] if args is None else args)
        if extra is not None:
            args += hicache("dynamic", extra, prefetch="wait_complete")
        shim = os.path.join(HERE, "cpu_shim")
        penv = dict(os.environ, KVOFFLOAD_SGLANG_CPU_SHIM="1",
                    PYTHONPATH=shim + os.pathsep + os.environ.get("PYTHONPATH", ""),
                    **(env or {}))
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, env=penv, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.t0 = time.time()

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_ready(self):
        while True:  # probed at least once, however long ago the server was started
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.name} exited ({self.proc.returncode}) at "
                                   f"start:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url("/health_generate"), timeout=10) as r:
                    if r.status == 200:
                        return round(time.time() - self.t0, 1)
            except (urllib.error.URLError, OSError):
                pass
            if time.time() - self.t0 > START_TIMEOUT:
                break
            time.sleep(1)
        raise RuntimeError(f"server {self.name} not up in {START_TIMEOUT} s:\n{self.tail()}")

    def wait_exit(self):
        try:
            return self.proc.wait(timeout=START_TIMEOUT)
        except subprocess.TimeoutExpired:
            return None

    def tail(self, n=30):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def post(self, path, body=None):
        data = json.dumps(body).encode() if body is not None else b""
        req = urllib.request.Request(self.url(path), data,
                                     {"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=CALL_TIMEOUT) as r:
            text = r.read()
        return json.loads(text) if text.strip().startswith(b"{") else text

    def gen(self, tokens):
        """[output tokens, their logprobs, cached tokens, of which from storage]"""
        o = self.post("/generate", {"input_ids": tokens, "return_logprob": True,
                                    "sampling_params": {"temperature": 0,
                                                        "max_new_tokens": OUTPUT}})
        m = o["meta_info"]
        storage = (m.get("cached_tokens_details") or {}).get("storage", 0)
        return [o["output_ids"], [lp[0] for lp in m["output_token_logprobs"]],
                m["cached_tokens"], storage]

    def flush(self):
        # SGLang refuses a flush while its own write-through is in flight; with a timeout it
        # waits for that (up to 60 s), then flushes.
        self.post("/flush_cache?timeout=60")

    def stop(self):
        """The server's whole process group, even when its leader has exited already."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                continue
            time.sleep(0.5)  # its children, after the leader
        if not self.log.closed:
            self.log.close()


def same(got, want):
    return got[0] == want[0] and all(abs(a - b) <= LOGPROB_TOL for a, b in zip(got[1], want[1]))


def stored_pages(prompts):
    """The distinct pages SGLang stores for these prompts: every whole page of the prompt and
    the output but the last token (B's first 256 tokens are A's)."""
    return sum((len(t) + OUTPUT - 1) // PAGE for t in prompts.values()) - 256 // PAGE


def pages_of(tokens):
    """The tokens SGLang can take from a cache for this prompt: its whole pages but the last
    token (a prefill computes at least one)."""
    return (len(tokens) - 1) // PAGE * PAGE


def wait_for(what, cond, deadline=60):
    t0 = time.time()
    while not cond():
        if time.time() - t0 > deadline:
            raise RuntimeError(f"waited {deadline} s for {what}")
        time.sleep(0.5)


def disk_pages(path):
    """Pages the disk tier's slab files hold (allocated bytes / a slot's bytes)."""
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(d, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total // SLOT_BYTES


def cluster_keys():
    cli = shutil.which("valkey-cli") or shutil.which("redis-cli")
    n = 0
    for i in range(3):
        r = subprocess.run([cli, "-p", str(CLUSTER + i), "dbsize"], stdout=subprocess.PIPE,
                           text=True, timeout=10)
        n += int(r.stdout.strip() or 0)
    return n


def refusal(log):
    """The message of the log's line that names the unknown key, from "kvoffload" on."""
    line = next(ln for ln in log.splitlines() if "unknown key(s)" in ln)
    return line[max(0, line.find("kvoffload")):][:240]


def cluster(action, env):
    args = [os.path.join(ROOT, "scripts", "valkey-cluster"), action] + \
        (["3"] if action == "start" else [])
    r = subprocess.run(args, env=env, timeout=120, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"valkey-cluster {action} failed: {r.stdout[-2000:]}")


def check(name, srv, prompts, want, from_storage):
    """Runs `prompts` on `srv`; outputs must equal `want`'s, and the prompts named in
    from_storage must have all their cacheable tokens loaded from kvoffload."""
    got = {p: srv.gen(prompts[p]) for p in prompts}
    bad = [p for p in prompts if not same(got[p], want[p])]
    short = [f"{p}: storage {got[p][3]} of {pages_of(prompts[p])}" for p in from_storage
             if got[p][3] != pages_of(prompts[p])]
    hits = {p: got[p][3] for p in prompts}
    if bad or short:
        say(f"sglang server {name} FAILED: outputs differ for {bad} "
            f"({ {p: (got[p][0], want[p][0]) for p in bad} }); {short}")
    else:
        say(f"sglang server {name}: {len(prompts)} prompts identical to the plain server; "
            f"tokens from kvoffload {hits}")
    return got


def main(argv):
    seed = int(os.environ.get("KVOFFLOAD_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (KVOFFLOAD_SEED={seed} replays)", flush=True)
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix="kvoffload-sglang-server-")
    model = write_model(os.path.join(work, "tiny-llama"), seed)
    a = [rng.randrange(3, 512) for _ in range(300)]
    prompts = {"A": a, "B": a[:256] + [rng.randrange(3, 512) for _ in range(44)],
               "C": [rng.randrange(3, 512) for _ in range(400)]}
    d1, d2 = os.path.join(work, "disk1"), os.path.join(work, "disk2")
    secret = os.path.join(work, "fleet-secret")
    with os.fdopen(os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(os.urandom(32).hex())
    cenv = dict(os.environ, KVOFFLOAD_VALKEY_PORT=str(CLUSTER),
                KVOFFLOAD_VALKEY_DIR=os.path.join(work, "valkey"))
    servers = []

    def start(*args, env=None, **kw):
        # Every server poisons its KV pools when it clears them (the shim's test hook): a hit
        # that copied nothing cannot read the right KV left behind by /flush_cache.
        s = Server(*args, env=dict(env or {}, KVOFFLOAD_SGLANG_TEST_POISON="1"), **kw)
        servers.append(s)
        return s

    def stop_on_sigterm(signum, frame):  # scripts/sglang-test's timeout: stop the servers too
        raise SystemExit(f"signal {signum}")
    signal.signal(signal.SIGTERM, stop_on_sigterm)

    try:
        # Servers start together where the scenario allows (a start is ~30 s of imports).
        cluster("start", cenv)
        plain = start("plain", model, PORT, work)
        s1 = start("tiers", model, PORT + 1, work,
                   extra_config(tiers=[disk(d1), shared(secret)]))
        s2 = start("fleet", model, PORT + 2, work, extra_config(tiers=[disk(d2), shared(secret)]))
        up = plain.wait_ready()
        want = {p: plain.gen(t) for p, t in prompts.items()}
        plain.stop()
        say(f"sglang server plain: up in {up} s, reference outputs of {len(prompts)} prompts")
        s1.wait_ready()
        check("tiers (cold)", s1, prompts, want, [])
        need = stored_pages(prompts)
        wait_for(f"{need} pages on disk", lambda: disk_pages(d1) >= need)
        wait_for(f"{need} pages in the cluster", lambda: cluster_keys() >= need)
        s1.flush()
        check("tiers (after /flush_cache)", s1, {"A": prompts["A"], "C": prompts["C"]}, want,
              ["A", "C"])

        s2.wait_ready()
        if disk_pages(d2):
            raise RuntimeError(f"server 2's disk tier holds {disk_pages(d2)} pages before its "
                               "first request: its hits would not prove the cluster")
        check("fleet (second server, one cluster)", s2,
              {"A": prompts["A"], "C": prompts["C"]}, want, ["A", "C"])
        s2.stop()
        wait_for(f"{need} pages on disk", lambda: disk_pages(d1) >= need)
        s1.stop()
        cluster("stop", cenv)

        flag = os.path.join(work, "corrupt-now")
        s3 = start("restart", model, PORT + 3, work, extra_config(tiers=[disk(d1)]),
                   env={"KVOFFLOAD_SGLANG_TEST_CORRUPT": flag})
        s4 = start("refused", model, PORT + 4, work,
                   extra_config(tiers=[disk(os.path.join(work, "disk4"))], hosts_bytes=5))
        s3.wait_ready()
        check("restart (disk tier, new process)", s3, {"A": prompts["A"], "C": prompts["C"]},
              want, ["A", "C"])
        open(flag, "w").close()
        s3.flush()
        bad = s3.gen(prompts["A"])
        diff = max(abs(x - y) for x, y in zip(bad[1], want["A"][1]))
        if bad[3] != pages_of(prompts["A"]) or same(bad, want["A"]):
            say(f"sglang server control FAILED: with one token of one page negated, A loaded "
                f"{bad[3]} tokens from storage and gave {bad[0]} (plain {want['A'][0]}, "
                f"max |logprob diff| {diff:.2g}): the check is blind")
        else:
            say(f"sglang server control: one token of one loaded page negated (layer 0) changes "
                f"A's output (tokens {bad[0]} vs {want['A'][0]}, max |logprob diff| "
                f"{diff:.2g}), so the comparisons above can fail")
        s3.stop()

        code = s4.wait_exit()
        text = s4.tail(100000)
        if code in (None, 0) or "unknown key(s) ['hosts_bytes']" not in text:
            say(f"sglang server refused FAILED: exit {code}, log:\n{s4.tail(20)}")
        else:
            say(f"sglang server refused: a misspelt extra-config key stops the server at start "
                f"(exit {code}), naming it: "
                + refusal(text))
        s4.stop()
    except Exception as e:  # noqa: BLE001 - reported with the servers' logs
        say(f"sglang server FAILED: {e!r}")
        for s in servers:
            print(f"--- {s.name} ({s.log_path}):\n{s.tail()}", flush=True)
    finally:
        for s in servers:
            try:
                s.stop()
            except Exception:  # noqa: BLE001
                pass
        try:
            cluster("stop", cenv)
        except Exception:  # noqa: BLE001
            pass
    print(json.dumps({"failures": failures}))
    if not failures:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
