#!/usr/bin/env python3
"""Global vs local KV on a production trace (issue 50, item 3): N engine processes
(`kvoffload-bench trace`, each a real scheduler, worker and host cache) share the trace's
requests, routed round-robin or prefix-affine, paced by the trace's arrival times so that
they replay in step; first each alone, then all over one shared tier on a Valkey cluster
(scripts/valkey-cluster, a fleet secret), its memory the N host caches' sum ("pooled", what a
pooled cache such as the Mooncake paper's holds) and then unbounded. Writes one JSON document
(docs/bench/trace-fleet-cpu-vm.json) and prints a Markdown table.

  trace_fleet.py BENCH TRACE[.gz] OUT.json WORKDIR [--engines N] [--pace X] [--port P] ...

The routes and the bounds are computed here from the trace alone; the hit ratios, bytes and
latencies are the engines' own (their JSON). Every process and cluster command has a timeout.
"""
import argparse
import collections
import gzip
import json
import math
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VALUE_HEADER = 112     # the shared tier's value header (docs/tiers.md)
# A Valkey key's name, entry and allocator slack beyond its value: INFO used_memory over DBSIZE
# on a 3-node cluster holding 7,000 values of 1,136 bytes was about 1.6 KiB a key (Valkey 8.0);
# the pooled runs ended holding about 9% more keys than this sizing aims at (their JSON says).
KEY_OVERHEAD = 480
# Counters that mean the cluster failed us (not a capacity miss): a run with any is refused.
SHARED_FAILURES = ("presence_errors", "read_errors", "write_errors", "failed_writes", "timeouts",
                   "bad_values")


def read_trace(path, limit):
    opener = gzip.open if path.endswith(".gz") else open
    lines = []
    with opener(path, "rt") as f:
        for line in f:
            if line.strip():
                lines.append(line)
            if limit and len(lines) == limit:
                break
    return lines, [json.loads(line) for line in lines]


def block_tokens(req, i, bt):
    n = len(req["hash_ids"])
    return bt if i + 1 < n else req["input_length"] - bt * (n - 1)


def bound(reqs, bt):
    """Token-weighted hit ratio of a cache that never evicts and sees every request (full
    blocks only: an engine hashes no partial block)."""
    seen, hit, total = set(), 0, 0
    for r in reqs:
        n = len(r["hash_ids"])
        ids = r["hash_ids"][:n - 1 if n and block_tokens(r, n - 1, bt) < bt else n]  # full ones
        i = 0
        while i < len(ids) and ids[i] in seen:
            hit += block_tokens(r, i, bt)
            i += 1
        total += sum(block_tokens(r, k, bt) for k in range(n))
        seen.update(ids)
    return hit, total


def route_round_robin(reqs, n, _capacity, _bt):
    return [k % n for k in range(len(reqs))]


def route_prefix_affine(reqs, n, capacity, bt):
    """The engine whose cache (mirrored here: an LRU of `capacity` blocks per engine) holds
    the longest prefix of the request, as a cache-aware scheduler (the paper's Conductor)
    routes; load kept even: an engine more than 20% (+8) ahead of its share is skipped.
    Ties: the engine with fewer requests."""
    caches = [collections.OrderedDict() for _ in range(n)]
    counts = [0] * n
    out = []
    for k, r in enumerate(reqs):
        m = len(r["hash_ids"])  # its full blocks: an engine hashes no partial one
        ids = r["hash_ids"][:m - 1 if m and block_tokens(r, m - 1, bt) < bt else m]
        cap = (k + 1) / n * 1.2 + 8

        def matched(e):
            m = 0
            while m < len(ids) and ids[m] in caches[e]:
                m += 1
            return m

        best = max((e for e in range(n) if counts[e] < cap),
                   key=lambda e: (matched(e), -counts[e], -e))
        counts[best] += 1
        out.append(best)
        c = caches[best]
        for h in ids:
            c.pop(h, None)
            c[h] = True
        while len(c) > capacity:
            c.popitem(last=False)
    return out


def local_bound(reqs, route, n, bt):
    """What N never-evicting caches, each seeing only its own requests, reach."""
    hit = total = 0
    for e in range(n):
        h, t = bound([r for r, x in zip(reqs, route) if x == e], bt)
        hit, total = hit + h, total + t
    return hit / total


class Cluster:
    def __init__(self, port, work):
        self.env = dict(os.environ, KVOFFLOAD_VALKEY_PORT=str(port),
                        KVOFFLOAD_VALKEY_DIR=os.path.join(work, "valkey"))
        self.port = port

    def script(self, *args):
        subprocess.run([os.path.join(ROOT, "scripts", "valkey-cluster"), *args], env=self.env,
                       check=True, stdout=subprocess.DEVNULL, timeout=120)

    def cli(self, node, *args):
        return subprocess.run(["valkey-cli", "-p", str(self.port + node), *args], check=True,
                              capture_output=True, text=True, timeout=30).stdout

    def info(self, node, field):
        for line in self.cli(node, "info", "memory").splitlines():
            if line.startswith(field + ":"):
                return int(line.split(":")[1])
        raise RuntimeError(f"valkey node {node}: no {field} in INFO memory")

    def start(self, value_bytes, blocks):
        """Three masters; each may hold a third of `blocks` values (None: 1 GiB each)."""
        self.script("start", "3")
        if blocks is not None:
            for node in range(3):
                limit = self.info(node, "used_memory") + \
                    blocks // 3 * (value_bytes + KEY_OVERHEAD)
                self.cli(node, "config", "set", "maxmemory", str(limit))

    def keys(self):
        return sum(int(self.cli(node, "dbsize").strip()) for node in range(3))

    def stop(self):
        self.script("stop")


def run_fleet(a, lines, route, tag, shared, origin):
    """Runs the N engines at once on their slices, each request at its trace time from
    `origin` sped up a.pace times (one clock for all); returns their JSON documents."""
    d = os.path.join(a.work, tag)
    os.makedirs(d, mode=0o700, exist_ok=True)
    start_at = int(time.time() * 1000) + 3000 + 500 * a.engines
    procs = []
    try:
        start_engines(a, lines, route, tag, shared, origin, d, start_at, procs)
        deadline = time.time() + 3600
        for p, _ in procs:
            p.wait(timeout=max(1, deadline - time.time()))
            if p.returncode != 0:
                raise RuntimeError(f"{tag}: an engine failed (logs in {d})")
    finally:
        for p, log in procs:  # none left running, whatever happened
            try:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired) as e:
                print(f"{tag}: engine {p.pid} not reaped: {e}", file=sys.stderr)
            log.close()
    return [json.load(open(os.path.join(d, f"engine-{e}.json")))["trace"]
            for e in range(a.engines)]


def start_engines(a, lines, route, tag, shared, origin, d, start_at, procs):
    for e in range(a.engines):
        path = os.path.join(d, f"engine-{e}.jsonl")
        with open(path, "w") as f:
            f.writelines(line for line, x in zip(lines, route) if x == e)
        cmd = [a.bench, "--json", os.path.join(d, f"engine-{e}.json"), "trace", "--format",
               "mooncake", path, "--host-tokens", f"{a.host_tokens:g}", "--block-bytes",
               str(a.block_bytes), "--pace", f"{a.pace:g}", "--start-at", str(start_at),
               "--origin-ms", str(origin), "--latency-samples"]
        if shared:
            cmd += ["--shared", f"127.0.0.1:{a.port}", "--shared-name", tag,
                    "--shared-secret-file", a.secret]
        log = open(os.path.join(d, f"engine-{e}.log"), "w")
        try:
            procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log))
        except OSError:
            log.close()
            raise
    print("$", " ".join(cmd), f"(and {a.engines - 1} more)", file=sys.stderr, flush=True)


def quantile(v, q):
    """Nearest rank."""
    if not v:
        return 0.0
    v = sorted(v)
    return v[min(len(v), max(1, math.ceil(q * len(v)))) - 1]


def fleet_row(runs, tag, routing, shared, bound_local, held=None):
    total = sum(r["prompt_tokens"] for r in runs)
    hit = sum(r["hit_tokens"] for r in runs)
    host = sum(r["tiers"]["host"]["hit_ratio"] * r["prompt_tokens"] for r in runs)
    tier = {k: sum(r["tiers"].get("shared", {}).get(k, 0) for r in runs)
            for k in ("bytes_stored", "bytes_loaded", "failed_promotions", "promotions_overdue",
                      "writes_queue_full", "writes_skipped", "writes_without_room", "read_misses",
                      *SHARED_FAILURES)}
    unattributed = sum(r["unattributed_hit_tokens"] for r in runs)
    if unattributed:
        raise RuntimeError(f"{tag}: {unattributed} hit tokens neither in host memory nor promoted")
    if shared != "none":
        failed = {k: tier[k] for k in SHARED_FAILURES if tier[k]}
        if failed or tier["bytes_stored"] == 0:
            raise RuntimeError(f"{tag}: the cluster failed the fleet ({failed or 'nothing stored'})"
                               "; not a result")
    samples = collections.defaultdict(list)
    for r in runs:
        for source, s in r["seconds_to_loaded"].items():
            samples[source].extend(s["samples_s"])
    hits = samples["host"] + samples["tier"]
    row = {"run": tag, "routing": routing, "shared": shared,
           "hit_ratio": hit / total, "host_hit_ratio": host / total,
           "shared_hit_ratio": (hit - host) / total, "local_bound": bound_local,
           "per_engine_hit_ratio": [r["hit_ratio"] for r in runs],
           "host_bytes_loaded": sum(r["tiers"]["host"]["bytes_loaded"] for r in runs),
           "late_requests": sum(r["late_requests"] for r in runs),
           "max_lag_seconds": max(r["max_lag_seconds"] for r in runs),
           "peak_rss_mib": max(r["peak_rss_mib"] for r in runs)}
    row["shared_tier"] = tier if shared != "none" else None
    row["shared_keys_held_at_end"] = held
    for name, v in (("hit", hits), ("host_hit", samples["host"]), ("shared_hit", samples["tier"]),
                    ("miss", samples["miss"])):
        row[f"{name}_requests"] = len(v)
        row[f"{name}_p50_ms"] = quantile(v, 0.5) * 1e3
        row[f"{name}_p99_ms"] = quantile(v, 0.99) * 1e3
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bench")
    p.add_argument("trace")
    p.add_argument("out")
    p.add_argument("work")
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--pace", type=float, default=100)
    p.add_argument("--host-tokens", type=float, default=3e6)
    p.add_argument("--block-bytes", type=int, default=1024)
    p.add_argument("--block-tokens", type=int, default=512)
    p.add_argument("--requests", type=int, default=0)
    p.add_argument("--port", type=int, default=7301)
    a = p.parse_args()
    if not 1 <= a.engines <= 16:
        p.error("--engines: 1 to 16")
    a.work = os.path.abspath(a.work)  # the cluster's nodes run elsewhere
    os.makedirs(a.work, mode=0o700, exist_ok=True)
    a.secret = os.path.join(a.work, "fleet-secret")
    with open(os.open(a.secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(os.urandom(32).hex())
    lines, reqs = read_trace(a.trace, a.requests)
    bt = a.block_tokens
    hit, total = bound(reqs, bt)
    origin = min(r["timestamp"] for r in reqs)
    capacity = int(a.host_tokens) // bt
    pooled = capacity * a.engines
    cluster = Cluster(a.port, a.work)
    rows = []
    try:
        for routing, router in (("round-robin", route_round_robin),
                                ("prefix-affine", route_prefix_affine)):
            route = router(reqs, a.engines, capacity, bt)
            lb = local_bound(reqs, route, a.engines, bt)
            for shared in ("none", "pooled", "unbounded"):
                tag = f"{routing}-{shared}"
                held = None
                if shared != "none":
                    cluster.start(a.block_bytes + VALUE_HEADER,
                                  pooled if shared == "pooled" else None)
                runs = run_fleet(a, lines, route, tag, shared != "none", origin)
                if shared != "none":
                    held = cluster.keys()
                    cluster.stop()
                rows.append(fleet_row(runs, tag, routing, shared, lb, held))
                r = rows[-1]
                print(f"{tag}: hit ratio {r['hit_ratio']:.4f} (host {r['host_hit_ratio']:.4f}),"
                      f" p50/p99 of hits {r['hit_p50_ms']:.2f}/{r['hit_p99_ms']:.2f} ms",
                      file=sys.stderr, flush=True)
    finally:
        cluster.stop()
    doc = {"trace_fleet": {"requests": len(reqs), "prompt_tokens": total, "bound": hit / total,
                           "engines": a.engines, "host_tokens": a.host_tokens,
                           "pooled_tokens": pooled * bt, "block_tokens": bt,
                           "block_bytes": a.block_bytes, "pace": a.pace, "runs": rows}}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=2)
    print("wrote", a.out, file=sys.stderr)
    print(markdown(doc["trace_fleet"]))
    shutil.rmtree(os.path.join(a.work, "valkey"), ignore_errors=True)


def markdown(t):
    out = ["| routing | shared tier | hit ratio | of which shared | x alone | local bound "
           "| hits p50 / p99 ms | shared hits p50 / p99 ms | shared GB loaded / stored |",
           "|---|---|---|---|---|---|---|---|---|"]
    alone = {r["routing"]: r["hit_ratio"] for r in t["runs"] if r["shared"] == "none"}
    for r in t["runs"]:
        s = r["shared_tier"]
        moved = f"{s['bytes_loaded'] / 1e9:.2f} / {s['bytes_stored'] / 1e9:.2f}" if s else "-"
        sh = (f"{r['shared_hit_p50_ms']:.2f} / {r['shared_hit_p99_ms']:.2f}"
              if r["shared_hit_requests"] else "-")
        out.append(f"| {r['routing']} | {r['shared']} | {r['hit_ratio']:.3f} | "
                   f"{r['shared_hit_ratio']:.3f} | {r['hit_ratio'] / alone[r['routing']]:.2f} | "
                   f"{r['local_bound']:.3f} | {r['hit_p50_ms']:.2f} / {r['hit_p99_ms']:.2f} | "
                   f"{sh} | {moved} |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
