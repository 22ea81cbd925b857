"""What an SGLang user gains (issue 52, item 4): a real SGLang 0.5.23 server on this machine's
CPU with HiCache, its L3 once SGLang's own file backend and once kvoffload (a disk tier under a
small host pool), each driven by SGLang's own benchmark client (`sglang.bench_serving`, its
`mooncake` dataset) replaying a sample of the Mooncake conversation trace's conversations
(--conversations of them, every turn), arrival times from the trace sped up --speedup times.

SGLang's mooncake dataset turns each hash id into a text of about 130 tokens ("<id>hi hi ...")
and keeps the trace's output lengths; here they are divided by 16 so a 2-core CPU serves the
sample in minutes. The model is a Llama-shaped float32 one with seeded weights (SHAPE) and a
word-level tokenizer written here. HiCache's device cache (--max-total-tokens) and host
pool (twice that) cannot hold the sample, so a later turn finds its conversation's earlier
pages in L3 or recomputes them. Both servers run SGLang's CPU test shim
(tests/sglang/cpu_shim: HiCache cannot run on a CPU as shipped, docs/sglang.md).

Reported side by side: TTFT p50/p90/p99, request and token throughput (the client's figures),
the tokens served from each cache level (the client's --cache-report), and whether both
servers generated the same text for every request.

    python bench/sglang_serve_bench.py TRACE.jsonl[.gz] [--json FILE]

Run in the SGLang environment: scripts/sglang-test serve-bench TRACE does it all.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "sglang"))

import server_check  # noqa: E402 (the model, the servers' start and stop)
import trace_sample  # noqa: E402 (the trace's conversations, a sample of them)

SCALE = 16            # the trace's output tokens per served output token
CHUNK = 130           # tokens SGLang's mooncake dataset makes of one hash id, about (the sample's
                      # input_length; the length checked is prompt_tokens')
SHAPE = dict(hidden_size=256, intermediate_size=768, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, num_hidden_layers=4, vocab_size=512,
             max_position_embeddings=8192)
MODEL_NAME = "Llama-shaped, 4 layers, hidden 256, 4 heads (2 KV heads of 64), float32"
PORT = 31111
CLIENT_TIMEOUT = 1800


def log(msg):
    print(f"[sglang-serve-bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def prompt_tokens(hash_ids):
    """The tokens of SGLang's mooncake prompt for these hash ids with this tokenizer: per id its
    digits and 128 "hi"; around them "user : Round 1 :" and "Tell me a story based on this
    context." (16 tokens), and a margin of 16."""
    return sum(128 + len(str(h)) for h in hash_ids) + 32


WORDS = ["user", "assistant", "Round", "Tell", "me", "a", "story", "based", "on", "this",
         "context", "hi", ":", ".", "\n"] + [str(i) for i in range(10)]


def model_dir(root, seed):
    """The model, and a word-level tokenizer of the words SGLang's mooncake texts are made of
    (digits one by one, so that each hash id's text is its own tokens; every other word of the
    512 ids is "w<id>", and unknown text is <unk>)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    d = server_check.write_model(os.path.join(root, "model"), seed, SHAPE)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}
    for w in WORDS:
        vocab[w] = len(vocab)
    for i in range(len(vocab), SHAPE["vocab_size"]):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(),
                                                 pre_tokenizers.Digits(individual_digits=True)])
    tok.decoder = decoders.WordPiece()  # joins words with spaces
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>", pad_token="<pad>",
                            model_max_length=SHAPE["max_position_embeddings"]).save_pretrained(d)
    return d


def run(a, root, model, slice_path, n, tag, l3):
    """One server (`l3`: "file" or "kvoffload") under the client; its row of figures."""
    store = os.path.join(root, f"{tag}-store")
    args = ["--max-total-tokens", str(a.max_total_tokens), "--context-length",
            str(SHAPE["max_position_embeddings"])]
    env = {}
    if l3 == "file":
        args += server_check.hicache("file")
        env["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = store
    else:
        args += server_check.hicache("dynamic", server_check.extra_config(
            host_bytes=a.host_bytes,
            tiers=[{"medium": "disk", "path": store, "capacity_bytes": "8GiB"}]))
    srv = server_check.Server(tag, model, PORT, root, env=env, args=args)
    try:
        up = srv.wait_ready()
        log(f"{tag}: server up in {up:.0f} s; sglang.bench_serving, {n} requests")
        out = os.path.join(root, f"client-{tag}.jsonl")
        cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang",
               "--host", "127.0.0.1", "--port", str(PORT), "--tokenizer", model,
               "--dataset-name", "mooncake", "--dataset-path", slice_path,
               "--mooncake-workload", "conversation",
               "--mooncake-slowdown-factor", f"{1 / a.speedup:g}", "--num-prompts", str(n),
               "--cache-report", "--output-details", "--output-file", out, "--disable-tqdm"]
        # The client's own imports (Hugging Face datasets), on its path only: the servers run
        # in the environment CI's server check uses.
        site = os.environ.get("KVOFFLOAD_SGLANG_BENCH_SITE", "")
        cenv = dict(os.environ, PYTHONPATH=os.pathsep.join(
            x for x in (site, os.environ.get("PYTHONPATH", "")) if x))
        with open(os.path.join(root, f"client-{tag}.log"), "w") as f:
            subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=True, env=cenv,
                           timeout=CLIENT_TIMEOUT)
    finally:
        srv.stop()
    with open(out) as f:
        r = json.loads(f.readlines()[-1])
    cache = r.get("cache_report") or {}
    row = {"run": tag, "l3": l3, "server_up_s": up, "completed": r["completed"],
           "duration_s": r["duration"], "request_throughput": r["request_throughput"],
           "output_throughput": r["output_throughput"],
           "total_token_throughput": r["total_throughput"],
           "mean_ttft_ms": r["mean_ttft_ms"], "ttft_p50_ms": r["median_ttft_ms"],
           "ttft_p90_ms": r["p90_ttft_ms"], "ttft_p99_ms": r["p99_ttft_ms"],
           "e2el_p50_ms": r["median_e2e_latency_ms"],
           "prompt_tokens": cache.get("total_prompt_tokens"),
           "cached_tokens": cache.get("total_cached_tokens"),
           "device_tokens": cache.get("device_cached_tokens"),
           "host_tokens": cache.get("host_cached_tokens"),
           "storage_tokens": cache.get("storage_cached_tokens") or 0,
           "storage_backend": cache.get("storage_backend")}
    return row, r.get("generated_texts") or []


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    trace_sample.add_sample_args(p, conversations=0.01, requests=200)  # --seed: the weights too
    p.add_argument("--max-total-tokens", type=int, default=8192,
                   help="SGLang's device KV cache in tokens (its host pool holds twice that)")
    p.add_argument("--host-bytes", default="64MiB", help="kvoffload's host pool over its disk")
    p.add_argument("--rounds", type=int, default=2,
                   help="runs of each server, the order alternating")
    p.add_argument("--json")
    a = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = tempfile.mkdtemp(prefix="sglang-serve-bench-")
    model = model_dir(root, a.seed)
    slice_path = os.path.join(root, "slice.jsonl")
    n, skipped, convs = trace_sample.write_slice(a.trace, a.conversations, a.seed, a.requests,
                                                 slice_path, CHUNK, SCALE,
                                                 SHAPE["max_position_embeddings"],
                                                 served=prompt_tokens)
    log(f"{n} requests of {convs} conversations of the trace ({skipped} too long for the model "
        f"skipped), in {root}")
    rows, texts = [], {}
    for k in range(a.rounds):  # the order alternates: neither server always goes first
        for l3 in (("file", "kvoffload") if k % 2 == 0 else ("kvoffload", "file")):
            row, t = run(a, root, model, slice_path, n, f"{l3}-{k}", l3)
            row["round"] = k
            rows.append(row)
            texts[row["run"]] = t
            log(f"{row['run']}: TTFT p50 {row['ttft_p50_ms']:.0f} ms, "
                f"{row['request_throughput']:.2f} req/s, storage tokens "
                f"{row['storage_tokens']} of {row['prompt_tokens']}")
    same, differ = trace_sample.compare(texts, rows[0]["run"], n)
    keys = ("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "mean_ttft_ms", "e2el_p50_ms",
            "request_throughput", "output_throughput", "total_token_throughput",
            "cached_tokens", "device_tokens", "host_tokens", "storage_tokens")
    summary = {l3: {key: statistics.median(r[key] or 0 for r in rows if r["l3"] == l3)
                    for key in keys} for l3 in ("file", "kvoffload")}
    fb, kv = summary["file"], summary["kvoffload"]
    with open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    doc = {"cpu": cpu, "cores": os.cpu_count(), "requests": n, "conversations": convs,
           "conversation_fraction": a.conversations,
           "seed": a.seed, "skipped_too_long": skipped, "output_scale": SCALE,
           "speedup": a.speedup, "max_total_tokens": a.max_total_tokens,
           "host_pool_tokens": 2 * a.max_total_tokens, "kvoffload_host_bytes": a.host_bytes,
           "model": MODEL_NAME, "rounds": a.rounds, "runs": rows, "median": summary,
           "texts": {"runs_compared": len(texts), "all_same": same, "differ": differ},
           **trace_sample.ratios(fb, kv)}
    trace_sample.emit("sglang_serve", doc, a.json)
    # Texts are compared and reported, not required equal: CPU matmuls may round differently
    # in batches of other sizes, and the two servers batch the same arrivals differently.
    ok = all(r["completed"] == n for r in rows) and kv["storage_tokens"] > 0
    trace_sample.finish(ok, f"{len(texts)} runs, every request the same text: {same}; storage "
                        f"tokens file {fb['storage_tokens']:.0f}, kvoffload "
                        f"{kv['storage_tokens']:.0f}; TTFT p50 file {fb['ttft_p50_ms']:.0f} ms, "
                        f"kvoffload {kv['ttft_p50_ms']:.0f} ms (medians)", root)


if __name__ == "__main__":
    main()
