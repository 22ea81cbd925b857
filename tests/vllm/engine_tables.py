"""Issue 54 in the real engine: the block tables vLLM makes on ordinary traffic, each run with
and without KvoffloadConnector (tests/vllm/engine_check.py runs them as the check "tables").

Models (config.json written here, seeded weights from engine_plugin.py): "mamba2" (pure
Mamba2, two layers) and "nemotron" (NemotronH, a mamba layer and an attention layer), both in
vLLM's align mode (prefix caching on), GPU blocks of 32; "hybrid" (engine_check's Llama with a
64-token sliding-window layer).

  mamba-hit     (a) A = 100 shared tokens + 20 (NemotronH: 140 + 20); B = the same prefix + 100
                (200): vLLM's prefix cache hits B, whose mamba table becomes [0, 0, hit, 0,
                state] (NemotronH's mamba blocks are 64 tokens: vLLM sizes them to the
                attention page). kvoffload 0.5 refused that step and vLLM's engine core died. Then
                vLLM's GPU prefix cache is reset and C (B's prompt and 24 more) must load B's
                blocks from kvoffload.
  mamba-chunks  (b) chunked prefill with a small token budget: chunks of two (f = 3) or three
                (f = 2) GPU blocks give [0, s1, 0, s3, 0, s5, ...]; offloaded blocks with a
                hole inside. A 300-token prompt, vLLM's prefix cache reset, then two prompts
                sharing its first 288 and 192 tokens load from kvoffload.
  mamba-decode  (issue 47) engine_features' turns on Mamba2 without drafts: T1 decodes across
                mamba blocks; blocks completed during decode are not stored (their states
                are decode-time states; counted in unfinal_state_skips) and T2's hit ends at
                the last prefill state.
  window-reuse  (c) hybrid, f = 1, 30 host blocks, 64 GPU blocks, 600 tokens a step: A and B
                (300 tokens) and C (560, max_offload_tokens 0) in one generate(). A's store
                fills the host cache, B's waits for room while vLLM frees B's window blocks and
                gives them to C; kvoffload 0.5 then stored C's KV under B's keys. After a GPU
                prefix-cache reset, prompts sharing B's first 100, 160 and 230 tokens must give
                the tokens of the engine without the connector.

Every output is compared with the same engine configuration without the connector (tokens
equal, logprobs within engine_check.LOGPROB_TOL).
"""

import functools
import json
import os
import random

VOCAB = 512


def model_dir(kind, root):
    d = os.path.join(root, kind)
    os.makedirs(d, exist_ok=True)
    common = {"vocab_size": VOCAB, "torch_dtype": "float32", "tie_word_embeddings": False,
              "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "hidden_size": 128,
              "num_hidden_layers": 2, "layer_norm_epsilon": 1e-5, "conv_kernel": 4,
              "n_groups": 1, "use_bias": False, "use_conv_bias": True, "chunk_size": 256}
    if kind == "mamba2":
        cfg = dict(common, architectures=["Mamba2ForCausalLM"], model_type="mamba2",
                   state_size=16, expand=2, num_heads=8, head_dim=32, hidden_act="silu",
                   residual_in_fp32=True, rms_norm=True, norm_before_gate=False)
    elif kind == "nemotron":
        cfg = dict(common, architectures=["NemotronHForCausalLM"], model_type="nemotron_h",
                   intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=32, hybrid_override_pattern="M*", ssm_state_size=16,
                   mamba_num_heads=8, mamba_head_dim=32, expand=2, mlp_bias=False,
                   mlp_hidden_act="relu2", mamba_hidden_act="silu",
                   max_position_embeddings=2048, residual_in_fp32=False,
                   rescale_prenorm_residual=True, attention_bias=False)
    else:
        raise ValueError(kind)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return d


def toks(rng, n):
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def gen_each(ctx, named, max_tokens=8):
    """named: [(name, prompt, kv_transfer_params or None)], in one generate()."""
    from vllm.inputs import TokensPrompt
    params = []
    for _, _, kv in named:
        sp = ctx.sp.clone()
        sp.max_tokens = max_tokens
        if kv is not None:
            sp.extra_args = {"kv_transfer_params": kv}
        params.append(sp)
    outs = ctx.llm.generate([TokensPrompt(prompt_token_ids=t) for _, t, _ in named], params,
                            use_tqdm=False)
    for (name, _, _), o in zip(named, outs):
        record(ctx, name, o)


def record(ctx, name, output):
    """ctx.outputs[name]: the first sample's tokens and logprobs, and the cached tokens."""
    c = output.outputs[0]
    lps = [float(d[t].logprob) for t, d in zip(c.token_ids, c.logprobs)]
    ctx.outputs[name] = [list(c.token_ids), lps, int(output.num_cached_tokens or 0)]


def note_stats(ctx):
    if ctx.conn is not None:
        s = ctx.stats()
        ctx.notes["kv"] = {k: s.get(k) for k in ("hits", "hit_tokens", "blocks_stored",
                                             "blocks_loaded", "partial_stores",
                                             "reused_sub_blocks", "unsafe_skips",
                                             "unfinal_state_skips", "stores_without_room",
                                             "failed_loads")}


def sc_mamba_hit(ctx):
    groups = ctx.llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config.kv_cache_groups
    hybrid = len(groups) > 1  # NemotronH: a mamba group and an attention group
    rng = random.Random(54)
    shared = toks(rng, 140 if hybrid else 100)
    ctx.gen([("A", shared + toks(rng, 20))], max_tokens=8)
    b = shared + toks(rng, 200 if hybrid else 100)
    ctx.gen([("B", b)], max_tokens=8)  # vLLM's prefix cache hits: nulls between states
    ctx.llm.reset_prefix_cache()  # vLLM's GPU prefix cache only
    ctx.gen([("C", b + toks(rng, 24))], max_tokens=8)
    note_stats(ctx)


def sc_mamba_chunks(ctx):
    rng = random.Random(55)
    p = toks(rng, 300)
    ctx.gen([("P", p)], max_tokens=8)
    ctx.llm.reset_prefix_cache()
    ctx.gen([("Q288", p[:288] + toks(rng, 30))], max_tokens=8)
    ctx.llm.reset_prefix_cache()
    ctx.gen([("Q192", p[:192] + toks(rng, 30))], max_tokens=8)
    note_stats(ctx)


def sc_window_reuse(ctx):
    rng = random.Random(56)
    a, b, c = toks(rng, 300), toks(rng, 300), toks(rng, 560)
    gen_each(ctx, [("A", a, None), ("B", b, None), ("C", c, {"max_offload_tokens": 0})])
    for n in (100, 160, 230):
        ctx.llm.reset_prefix_cache()
        gen_each(ctx, [(f"B{n}", b[:n] + toks(rng, 40), None)])
    note_stats(ctx)


SCENARIOS = {"mamba-hit": sc_mamba_hit, "mamba-chunks": sc_mamba_chunks,
             "window-reuse": sc_window_reuse}

# (tag, model kind, engine settings, scenarios): the baseline engines run the same settings
# without the connector; block_size_factor only matters with it.
# "unit": the connector's block_size is unit * f (vLLM's largest GPU block among the groups).
ENGINES = [
    ("mamba2-b96", "mamba2", {"max_num_batched_tokens": 96},
     [(1, ["mamba-hit", "mamba-decode"]), (2, ["mamba-hit", "mamba-chunks", "mamba-decode"])]),
    ("mamba2-b64", "mamba2", {"max_num_batched_tokens": 64}, [(3, ["mamba-chunks"])]),
    ("nemotron-b128", "nemotron", {"max_num_batched_tokens": 128, "unit": 64},
     [(1, ["mamba-hit"])]),
    ("hybrid-window", "hybrid", {"max_num_batched_tokens": 600, "gpu_blocks": 64,
                                 "host_blocks": 30}, [(1, ["window-reuse"])]),
]


def tables_tasks(root, models, run_engine, compare, block, line):
    """One task (a callable) per engine of ENGINES: its baseline, then its runs with kvoffload.
    The tasks are independent of each other: engine_check runs them side by side."""
    only = [t for t in os.environ.get("KVOFFLOAD_TABLES", "").split(",") if t]
    # KVOFFLOAD_TABLES=hybrid-window,...: those engines only
    return [functools.partial(tables_one, root, models, run_engine, compare, block, line, *e)
            for e in ENGINES if not only or e[0] in only]


def tables_one(root, models, run_engine, compare, block, line, tag, kind, settings, runs):
    model = models[kind]
    engine = {"model": model, "prefix_caching": True,
              "max_num_batched_tokens": settings["max_num_batched_tokens"]}
    if settings.get("gpu_blocks"):
        engine["gpu_blocks"] = settings["gpu_blocks"]
    scenarios = sorted({s for _, sc in runs for s in sc})
    try:
        base = run_engine(root, f"{tag}-base", dict(engine, extra=None,
                                                    scenarios=scenarios))["scenarios"]
    except RuntimeError as e:
        line(f"engine tables {tag}-base: FAILED: {e}")
        return
    for f, sc in runs:
        extra = {"block_size": settings.get("unit", block) * f,
                 "host_blocks": settings.get("host_blocks", 64)}
        try:
            r = run_engine(root, f"{tag}-f{f}", dict(engine, extra=extra, scenarios=sc))
        except RuntimeError as e:  # kvoffload 0.5: the engine core died (a), (b)
            lines = str(e).splitlines()
            why = [x for x in lines if "Error" in x or "kvoffload." in x][-1:]
            line(f"engine tables {tag}-f{f}: FAILED: {lines[0]} {' '.join(why)}")
            continue
        for name, res in r["scenarios"].items():
            got, notes = res["outputs"], res["notes"]
            ok, diff, worst = compare(base[name]["outputs"], got)
            kv = notes.get("kv", {})
            cached = {n: v[2] for n, v in got.items()}
            problems = [] if ok else [f"outputs differ from the engine without kvoffload: "
                                      f"{diff}"]
            loaded = {"mamba-hit": ["C"], "mamba-chunks": ["Q288", "Q192"],
                      "window-reuse": ["B100", "B160", "B230"],
                      "mamba-decode": ["T2", "P96", "P128", "P160"]}[name]
            if not any(cached.get(n, 0) for n in loaded):
                problems.append(f"none of {loaded} loaded anything from kvoffload")
            if name == "mamba-chunks" and not kv.get("partial_stores"):
                problems.append("no mamba block was stored partly written: the chunked "
                                "tables' holes are not exercised")
            # Issue 47: states of blocks completed during decode are never stored.
            if name == "mamba-decode" and not kv.get("unfinal_state_skips"):
                problems.append("no decode-time mamba state was skipped: the case is not "
                                "exercised")
            if name == "window-reuse" and not kv.get("reused_sub_blocks"):
                problems.append("no store met a window block vLLM had given to another "
                                "request: the case is not exercised")
            label = f"engine tables {name} {tag}-f{f}"
            info = f"cached tokens {cached}; kvoffload {kv}"
            if problems:
                line(f"{label}: FAILED: {'; '.join(problems)}; {info}")
            else:
                line(f"{label}: identical tokens and logprobs over {len(got)} requests "
                     f"(max |logprob diff| {worst:.3g}); {info}")
