#!/usr/bin/env python3
"""The capacity curve of a production trace (issue 50): runs `kvoffload-bench trace` over host
cache capacities for LRU and ARC (each run also reports the offline optimum of its capacity,
issue 55), then a 3M-token host cache over disk tiers, and writes one
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


def run(bench, trace, work, *args):
    out = os.path.join(work, "run.json")
    cmd = [bench, "--json", out, "trace", "--format", "mooncake", trace, "--block-bytes", "512",
           *args]
    print("$", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=3600)
    with open(out) as f:
        return json.load(f)["trace"]


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
        for policy in ("lru", "arc"):
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
                           "host": host, "disk": disk}}
    with open(out, "w") as f:
        json.dump(doc, f, indent=2)
    print("wrote", out, file=sys.stderr)


if __name__ == "__main__":
    main()
