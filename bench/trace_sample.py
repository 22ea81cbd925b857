"""Samples of the Mooncake conversation trace for the serving benchmarks
(bench/vllm_serve_bench.py, bench/sglang_serve_bench.py): each request's conversation, and a
sample of whole conversations with lengths scaled down for a CPU."""

import gzip
import json
import math
import random
import shutil
import sys

CONVERSATION_BLOCKS = 4  # hash ids a turn shares with its conversation's earlier turns, at least


def conversations(reqs):
    """Each request's conversation: the one that owns the longest prefix of its hash ids seen
    before, if that prefix is CONVERSATION_BLOCKS blocks or more (longer than a shared system
    prompt); otherwise it starts one of its own."""
    owner, out = {}, []
    for k, r in enumerate(reqs):
        ids, j = r["hash_ids"], -1
        while j + 1 < len(ids) and ids[j + 1] in owner:
            j += 1
        c = owner[ids[j]] if j + 1 >= CONVERSATION_BLOCKS else k
        out.append(c)
        for h in ids:
            owner.setdefault(h, c)
    return out


def write_slice(trace, fraction, seed, limit, path, chunk, scale, max_len, served=None):
    """A sample of the trace's conversations (each kept with probability `fraction`, all its
    turns), at most `limit` requests, those that fit the model once scaled: input_length and
    output_length divided by `scale` (rounded up; the input still ends in its last hash id's
    `chunk` tokens), input + output at most `max_len`. `served(hash_ids)`, when given, is the
    prompt's length as the client will really send it (checked against max_len instead).
    Timestamps from the first kept request."""
    opener = gzip.open if trace.endswith(".gz") else open
    with opener(trace, "rt") as src:
        reqs = [json.loads(line) for line in src if line.strip()]
    conv = conversations(reqs)
    rng = random.Random(seed)
    keep = {c for c in sorted(set(conv)) if rng.random() < fraction}
    kept = skipped = 0
    start = None
    with open(path, "w") as dst:
        for r, c in zip(reqs, conv):
            if c not in keep or kept == limit:
                continue
            ids = r["hash_ids"]
            inp = min(len(ids) * chunk, max((len(ids) - 1) * chunk + 1,
                                            math.ceil(r["input_length"] / scale)))
            out = max(1, math.ceil(r["output_length"] / scale))
            if (served(ids) if served else inp) + out > max_len:
                skipped += 1
                continue
            start = r["timestamp"] if start is None else start
            dst.write(json.dumps({"timestamp": r["timestamp"] - start, "input_length": inp,
                                  "output_length": out, "hash_ids": ids}) + "\n")
            kept += 1
    return kept, skipped, len(keep)


def add_sample_args(parser, conversations, requests):
    """The sample's arguments, shared by the serving benchmarks."""
    parser.add_argument("trace")
    parser.add_argument("--conversations", type=float, default=conversations,
                        help="the fraction of the trace's conversations served (all their "
                             "turns)")
    parser.add_argument("--seed", type=int, default=1, help="which conversations")
    parser.add_argument("--requests", type=int, default=requests,
                        help="at most this many requests")
    parser.add_argument("--speedup", type=float, default=15.0,
                        help="arrival times divided by this (1: the trace's own pace)")


def compare(texts, first, n):
    """Whether every run generated `first`'s texts for all n requests, and the first 20
    requests that differ in each run that did not."""
    reference = texts[first]
    differ = {run: [i for i, (x, y) in enumerate(zip(reference, t)) if x != y][:20]
              for run, t in texts.items() if t != reference}
    return all(len(t) == n for t in texts.values()) and not differ, differ


def ratios(base, kv):
    """TTFT quantiles of `base` over kvoffload's (above 1: kvoffload is faster) and kvoffload's
    request throughput over `base`'s, from the two servers' medians."""
    out = {f"ttft_{q}_ratio": base[f"ttft_{q}_ms"] / kv[f"ttft_{q}_ms"] for q in ("p50", "p90",
                                                                              "p99")}
    out["throughput_ratio"] = kv["request_throughput"] / base["request_throughput"]
    return out


def emit(name, doc, path):
    """Prints {name: doc} as JSON, and writes it to `path` if one is given."""
    text = json.dumps({name: doc}, indent=2)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    print(text)


def finish(ok, summary, root):
    """The bench's last line and exit: its work directory removed on success (kept with its
    logs when something failed)."""
    print(("ok" if ok else "FAILED") + ": " + summary, flush=True)
    if ok:
        shutil.rmtree(root, ignore_errors=True)
    sys.exit(0 if ok else 1)
