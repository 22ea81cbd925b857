#!/usr/bin/env python3
"""Turns kvoffload-bench JSON into PNG charts.

usage: bench/plot.py RESULTS.json OUT_DIR
Writes copy_host.png (HostBackend bandwidth vs piece size with the memcpy ceiling),
copy_cuda_<dir>.png (per mode, with the one-copy ceiling) when the GPU sweep is present, and
scheduler.png (step cost per configuration), soak.png (resident memory over a soak run), and
vllm_engine_ttft.png (bench/vllm_engine_bench.py's time to first token) and trace_curve.png
(bench/trace_curve.py's capacity sweep). Needs matplotlib (pip install matplotlib).
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def size_label(b):
    return f"{b // (1 << 20)} MiB" if b >= 1 << 20 else f"{b // 1024} KiB"


def copy_host(doc, out):
    rows = doc["copy_host"]["results"]
    x = [r["piece_bytes"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(x, [r["host_backend_gbps"]["median_gbps"] for r in rows], "o-",
            label=f"HostBackend ({doc['copy_host']['threads']} threads)")
    ax.plot(x, [r["memcpy_ceiling_gbps"]["median_gbps"] for r in rows], "k--",
            label="one memcpy of the same bytes (ceiling)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(x, [size_label(v) for v in x], rotation=45)
    ax.set_xlabel("piece size")
    ax.set_ylabel("GB/s (median)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Host copies, {doc['machine']['cpu']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "copy_host.png"), dpi=110)


def copy_cuda(doc, out):
    cuda = doc.get("copy_cuda", {})
    if "results" not in cuda:
        return
    for direction in ("d2h", "h2d", "both"):
        fig, ax = plt.subplots(figsize=(7, 4))
        modes = sorted({r["mode"] for r in cuda["results"]})
        for mode in modes:
            rows = [r for r in cuda["results"] if r["mode"] == mode]
            ax.plot([r["piece_bytes"] for r in rows],
                    [r[direction]["gbps"]["median_gbps"] for r in rows], "o-", label=mode)
        ax.axhline(0, color="k")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("piece size (bytes)")
        ax.set_ylabel("GB/s (median)")
        ax.set_title(f"CUDA {direction}, {cuda.get('device', '')}; ceiling: ratio 1.0 in the JSON")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"copy_cuda_{direction}.png"), dpi=110)


def scheduler(doc, out):
    sweep = doc.get("scheduler", {}).get("sweep")
    if not sweep:
        return
    labels = [f"{r['groups']}g f{r['block_size_factor']}" for r in sweep]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(labels, [r["decode_step_median_us"] for r in sweep])
    a.set_title(f"decode step, {sweep[0]['requests']} requests (us, median)")
    b.bar(labels, [r["prefill_step_ms"] for r in sweep])
    b.set_title("prefill step (ms, median)")
    for ax in (a, b):
        ax.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "scheduler.png"), dpi=110)


def soak(doc, out):
    data = doc.get("soak")
    if not data:
        return
    curve = data["curve"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([p["step"] for p in curve], [p["rss_mib"] for p in curve], "o-", markersize=3)
    ax.set_xlabel("engine step")
    ax.set_ylabel("resident memory (MiB)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"soak: {data['steps']:,} verified steps, growth after warm-up "
                 f"{data['rss_growth_after_warmup_mib']:.2f} MiB")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "soak.png"), dpi=110)


def vllm_engine(doc, out):
    """bench/vllm_engine_bench.py's JSON: B's time to first token per prompt length."""
    rows = doc.get("ttft", {}).get("rows")
    if not rows:
        return
    import numpy as np
    x = np.arange(len(rows))
    w = 0.27
    fig, ax = plt.subplots(figsize=(7, 4))
    series = [("ttft_recompute_s", "recompute (no kvoffload)"),
              ("ttft_host_hit_s", "kvoffload host hit"),
              ("ttft_disk_hit_s", "kvoffload disk hit after a restart")]
    for i, (key, label) in enumerate(series):
        ax.bar(x + (i - 1) * w, [r[key]["median"] * 1e3 for r in rows], w, label=label)
    for j, r in enumerate(rows):
        ax.annotate(f"{r['recompute_over_host_hit']:.1f}x", (x[j], r["ttft_host_hit_s"]["median"] * 1e3),
                    ha="center", va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(x, [f"{r['prompt_tokens']}" for r in rows])
    ax.set_xlabel("prompt tokens (all but the last 64 shared with an earlier request)")
    ax.set_ylabel("time to first token, ms (median)")
    ax.set_title(f"vLLM {doc['vllm']} on {doc['machine']['cores']} CPU cores, {doc['model']}",
                 fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "vllm_engine_ttft.png"), dpi=110)


def vllm_engine_gains(doc, out):
    """bench/vllm_engine_bench.py's JSON: multi-turn throughput and TTFT, and the cost when
    nothing is reused (each round's batch with the connector against the one without)."""
    mt, oh = doc.get("multiturn"), doc.get("overhead")
    if not mt or not oh or "overhead_percent_ci95" not in oh:
        return
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(10, 3.6))
    labels = ["without", "kvoffload"]
    rps = [mt["requests_per_s_without"]["median"], mt["requests_per_s_kvoffload"]["median"]]
    a.bar(labels, rps, color=["tab:gray", "tab:blue"])
    a.set_ylabel("requests per second (median)")
    a.set_title(f"multi-turn: {mt['throughput_ratio']:.2f}x requests/s", fontsize=9)
    ttft = [mt["ttft_mean_s_without"]["median"] * 1e3, mt["ttft_mean_s_kvoffload"]["median"] * 1e3]
    b.bar(labels, ttft, color=["tab:gray", "tab:blue"])
    b.set_ylabel("mean time to first token, ms")
    b.set_title(f"multi-turn: TTFT {mt['ttft_ratio']:.2f}x lower", fontsize=9)
    per = oh["overhead_percent_per_round"]
    c.axhspan(-2, 2, color="tab:green", alpha=0.12, label="target: within 2%")
    c.plot(range(1, len(per) + 1), per, "o", ms=3, color="tab:blue", label="round")
    c.axhline(oh["overhead_percent"], color="tab:blue", lw=1,
              label=f"median {oh['overhead_percent']:.1f}%")
    lo, hi = oh["overhead_percent_ci95"]
    c.axhspan(lo, hi, color="tab:blue", alpha=0.15, label=f"95% interval {lo:.1f}..{hi:.1f}%")
    c.axhline(0, color="black", lw=0.5)
    c.set_xlabel("round (batches seconds apart)")
    c.set_ylabel("% slower with the connector")
    c.set_title("nothing reused, everything stored", fontsize=9)
    c.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"vLLM {doc['vllm']} on {doc['machine']['cores']} CPU cores, {doc['model']}",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "vllm_engine_gains.png"), dpi=110)


def trace_curve(doc, out):
    """bench/trace_curve.py's sweep: hit ratio vs host capacity (LRU, ARC, reuse, the offline
    optimum), the never-evicting bound, the paper's 3M and 50M points, and a 3M host cache
    over disk tiers; beside it issue 55's held-out half, as fractions of its bound, with
    reuse's hinted variants."""
    if "trace_curve" not in doc:
        return
    c = doc["trace_curve"]
    held = c.get("held_out")
    fig, axes = plt.subplots(1, 2 if held else 1, figsize=(13 if held else 7.5, 4.8))
    ax = axes[0] if held else axes
    styles = {"lru": "o-", "arc": "s--", "reuse": "v-"}
    colors = {"lru": "tab:blue", "arc": "tab:orange", "reuse": "tab:red"}
    for policy, style in styles.items():
        rows = [r for r in c["host"] if r["policy"] == policy]
        if rows:
            ax.plot([r["host_tokens"] for r in rows], [r["hit_ratio"] for r in rows], style,
                    color=colors[policy], label=f"host cache only, {policy.upper()}")
    best = [r for r in c["host"] if r["policy"] == "lru" and "optimum_hit_ratio" in r]
    if best:  # issue 55: Belady's offline optimum at each capacity
        ax.plot([r["host_tokens"] for r in best], [r["optimum_hit_ratio"] for r in best], "^-.",
                color="tab:green",
                label="offline optimum (Belady: next use known)")
    ax.axhline(c["bound"], color="k", linestyle=":", label=f"bound (never evicts): {c['bound']:.3f}")
    for x, name in ((3e6, "3M (paper: under 50% of the bound)"), (5e7, "50M (paper: near it)")):
        ax.axvline(x, color="grey", linewidth=0.8)
        ax.text(x, 0.02, " " + name, rotation=90, va="bottom", fontsize=7, color="grey")
    for r, color in zip(c["disk"], ("tab:purple", "tab:brown", "tab:pink", "tab:gray")):
        ax.plot([r["host_tokens"]], [r["hit_ratio"]], "D", markersize=8, color=color,
                label=f"3M host + {r['disk_tokens'] / 1e6:.0f}M disk tier: {r['hit_ratio']:.3f}")
    ax.set_xscale("log")
    ax.set_xlabel("host cache capacity (tokens)")
    ax.set_ylabel("token-weighted hit ratio")
    ax.set_ylim(0, max(0.5, c["bound"] * 1.15))
    ax.set_title(f"Mooncake conversation trace ({c['requests']} requests), real scheduler",
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    if held:
        ax = axes[1]
        rows = held["host"]
        for policy, style in styles.items():
            sel = [r for r in rows if r["policy"] == policy and r["hint_accuracy"] == 0]
            ax.plot([r["host_tokens"] for r in sel], [r["fraction_of_bound"] for r in sel], style,
                    color=colors[policy], label=policy.upper())
        for acc, color in zip(sorted({r["hint_accuracy"] for r in rows} - {0}, reverse=True),
                              ("tab:cyan", "tab:olive", "tab:purple", "tab:gray")):
            sel = [r for r in rows if r["policy"] == "reuse" and r["hint_accuracy"] == acc]
            ax.plot([r["host_tokens"] for r in sel], [r["fraction_of_bound"] for r in sel], ".:",
                    color=color, label=f"REUSE + hint right {acc:.0%} (engine signal)")
        opt = [r for r in rows if r["policy"] == "lru" and r["hint_accuracy"] == 0]
        ax.plot([r["host_tokens"] for r in opt], [r["optimum_fraction_of_bound"] for r in opt],
                "^-.", color="tab:green", label="offline optimum")
        ax.axhline(1.0, color="k", linestyle=":", label=f"bound: {held['bound']:.3f}")
        ax.axhline(0.6, color="tab:red", linewidth=0.8, linestyle="--",
                   label="issue 55's target at 3M: 0.6")
        ax.axvline(3e6, color="grey", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("host cache capacity (tokens)")
        ax.set_ylabel("fraction of the bound")
        ax.set_title(f"held out: the second half ({held['requests']} requests), cold cache",
                     fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "trace_curve.png"), dpi=110)


def main():
    doc = json.load(open(sys.argv[1]))
    out = sys.argv[2]
    os.makedirs(out, exist_ok=True)
    if "copy_host" in doc:
        copy_host(doc, out)
    copy_cuda(doc, out)
    scheduler(doc, out)
    soak(doc, out)
    vllm_engine(doc, out)
    vllm_engine_gains(doc, out)
    trace_curve(doc, out)
    print("charts in", out)


if __name__ == "__main__":
    main()
