#!/usr/bin/env python3
"""Checks that a kvoffload-bench JSON document is complete: every section, every number."""
import json
import math
import sys

REQUIRED = {
    "machine": ["cpu", "cores"],
    "scheduler": ["reference", "sweep", "requests_sweep", "lookup_32k_tokens"],
    "manager": ["lru", "arc"],
    "index": ["results", "timer_cost_ns"],
    "copy_host": ["results", "threads"],
    "copy_cuda": ["backend"],
    "calibrate": [],
    "compact": [],
    "source_order": [],
    "pool": ["results", "speedup_all_threads_vs_one", "pool_vs_memset_all_cores"],
    "e2e": ["steps_per_second"],
    "disk": ["throughput", "lookup_to_loaded"],
    "disk_restart": ["results"],
    "loads": ["host", "sim", "disk"],
}
REFERENCE = ["decode_step_median_us", "decode_step_min_us", "prefill_step_ms",
             "allocations_per_decode_step"]


def numbers(node, path, bad):
    if isinstance(node, dict):
        for k, v in node.items():
            numbers(v, f"{path}.{k}", bad)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            numbers(v, f"{path}[{i}]", bad)
    elif isinstance(node, float) and not math.isfinite(node):
        bad.append(path)


def main():
    doc = json.load(open(sys.argv[1]))
    missing = []
    for section, keys in REQUIRED.items():
        if section not in doc:
            missing.append(section)
            continue
        missing += [f"{section}.{k}" for k in keys if k not in doc[section]]
    ref = doc.get("scheduler", {}).get("reference", {})
    missing += [f"scheduler.reference.{k}" for k in REFERENCE if k not in ref]
    if not doc.get("copy_host", {}).get("results"):
        missing.append("copy_host.results (empty)")
    bad = []
    numbers(doc, "", bad)
    if missing or bad:
        print("missing:", missing, "not finite:", bad)
        return 1
    print("benchmark JSON complete:", ", ".join(k for k in REQUIRED))
    return 0


if __name__ == "__main__":
    sys.exit(main())
