#!/usr/bin/env python3
"""The capacity curve of a production trace (issue 50): runs `kvoffload-bench trace` over host
cache capacities for LRU, ARC and reuse (each run also reports the offline optimum of its
capacity, issue 55), then a 3M-token host cache over disk tiers, then issue 55's held-out
protocol: the same policies on the second half of the trace by time from a cold cache (the
first half is what policy reuse's built-in counts were learnt on), with reuse also given a
"conversation continues" hint drawn from the trace's future at several accuracies. Writes one
JSON document for bench/plot.py (trace_curve.png) and docs/bench/trace.md.

  trace_curve.py BENCH TRACE[.gz] OUT.json [WORKDIR]

Blocks move 512 bytes each (--block-bytes; the hit ratios do not depend on it) so that a
1e8-token host cache fits this machine while the real copy and disk code paths run.
"""
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile

HOST_TOKENS = [1e5, 3e5, 1e6, 3e6, 1e7, 3e7, 5e7, 1e8]
DISK_TOKENS = [1e7, 5e7]
POLICIES = ("lru", "arc", "reuse")
HINT_ACCURACY = (1.0, 0.9, 0.8, 0.7)


def run(bench, trace, work, *args):
    out = os.path.join(work, "run.json")
    cmd = [bench, "--json", out, "trace", "--format", "mooncake", trace, "--block-bytes", "512",
           *args]
    print("$", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=3600)
    with open(out) as f:
        return json.load(f)["trace"]


def held_out(bench, trace, work):
    """Issue 55's protocol: the second half of the trace by time, from a cold cache."""
    with open(trace) as f:
        lines = [line for line in f if line.strip()]
    end = json.loads(lines[-1])["timestamp"]
    mid = next(k for k, line in enumerate(lines) if json.loads(line)["timestamp"] >= end / 2)
    second = os.path.join(work, "second-half.jsonl")
    with open(second, "w") as f:
        f.writelines(lines[mid:])
    rows, first = [], None
    for tokens in HOST_TOKENS:
        runs = [(policy, 0.0) for policy in POLICIES]
        runs += [("reuse", a) for a in HINT_ACCURACY]
        for policy, accuracy in runs:
            r = run(bench, second, work, "--host-tokens", f"{tokens:g}", "--policy", policy,
                    "--hint-accuracy", f"{accuracy:g}")
            first = first or r
            rows.append({"host_tokens": tokens, "policy": policy, "hint_accuracy": accuracy,
                         "hit_ratio": r["hit_ratio"], "fraction_of_bound": r["fraction_of_bound"],
                         "optimum_hit_ratio": r["optimum_hit_ratio"],
                         "optimum_fraction_of_bound": r["optimum_fraction_of_bound"],
                         "stores_without_room": r["tiers"]["host"]["stores_without_room"]})
    return {"first_request": mid, "requests": first["requests"],
            "bound": first["infinite_hit_ratio"], "host": rows}


def main():
    bench, trace, out = sys.argv[1:4]
    work = sys.argv[4] if len(sys.argv) > 4 else tempfile.mkdtemp(prefix="trace-curve-")
    os.makedirs(work, mode=0o700, exist_ok=True)
    if trace.endswith(".gz"):
        plain = os.path.join(work, "trace.jsonl")
        with gzip.open(trace, "rb") as src, open(plain, "wb") as dst:
            shutil.copyfileobj(src, dst)
        trace = plain
    host, disk, first = [], [], None
    for tokens in HOST_TOKENS:
        for policy in POLICIES:
            r = run(bench, trace, work, "--host-tokens", f"{tokens:g}", "--policy", policy)
            first = first or r
            host.append({"host_tokens": tokens, "policy": policy, "hit_ratio": r["hit_ratio"],
                         "fraction_of_bound": r["fraction_of_bound"],
                         "optimum_hit_ratio": r["optimum_hit_ratio"],
                         "requests_per_second": r["requests_per_second"],
                         "speedup_over_arrival": r["speedup_over_arrival"],
                         "peak_rss_mib": r["peak_rss_mib"],
                         "stores_without_room": r["tiers"]["host"]["stores_without_room"],
                         "scheduler_seconds_per_request": r["scheduler_seconds_per_request"]})
    for tokens in DISK_TOKENS:
        d = os.path.join(work, f"disk-{tokens:g}")
        os.makedirs(d, mode=0o700, exist_ok=True)
        r = run(bench, trace, work, "--host-tokens", "3e6", "--disk-tokens", f"{tokens:g}",
                "--disk", d)
        disk.append({"host_tokens": 3e6, "disk_tokens": tokens, "hit_ratio": r["hit_ratio"],
                     "host_hit_ratio": r["tiers"]["host"]["hit_ratio"],
                     "disk_hit_ratio": r["tiers"]["disk"]["hit_ratio"],
                     "fraction_of_bound": r["fraction_of_bound"],
                     "disk_bytes_stored": r["tiers"]["disk"]["bytes_stored"],
                     "disk_bytes_loaded": r["tiers"]["disk"]["bytes_loaded"],
                     "writes_queue_full": r["tiers"]["disk"]["writes_queue_full"],
                     "promotions_without_room": r["tiers"]["disk"]["promotions_without_room"],
                     "failed_promotions": r["tiers"]["disk"]["failed_promotions"],
                     "requests_per_second": r["requests_per_second"]})
        shutil.rmtree(d, ignore_errors=True)
    doc = {"trace_curve": {"requests": first["requests"], "prompt_tokens": first["prompt_tokens"],
                           "bound": first["infinite_hit_ratio"], "block_tokens": 512,
                           "host": host, "disk": disk, "held_out": held_out(bench, trace, work)}}
    with open(out, "w") as f:
        json.dump(doc, f, indent=2)
    print("wrote", out, file=sys.stderr)


if __name__ == "__main__":
    main()
