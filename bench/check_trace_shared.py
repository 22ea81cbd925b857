#!/usr/bin/env python3
"""The CI test of `kvoffload-bench trace --shared` (issue 50): engines in separate processes
share a slice of the Mooncake trace's KV through a real Valkey cluster. Every expected figure
is computed here from the trace alone, never from the benchmark's output.

  check_trace_shared.py BENCH TRACE WORKDIR NODES

1. Engine A, a host cache that never evicts, writes through to the cluster: its hit ratio is
   the bound, and it writes every distinct full block of the slice exactly once.
2. Engine B, a new process with a 300-block host cache and A's fleet name and secret: every
   full block of every request is in the cluster, so every token of a full block is a hit (a
   partial last block has no hash in an engine: never stored), most of them from the shared
   tier, none failed.
3. Engine C, another fleet name (every shared run has the same weights identity, so only the
   name's namespace keeps it apart), and engine D, A's name under another secret: A's keys
   are not theirs, so each reaches exactly the bound, nothing from the shared tier, and no
   existence check finds a key.
"""
import json
import os
import secrets
import shutil
import subprocess
import sys

from check_trace import BLOCK_TOKENS, block_tokens, bound, full_ids, run


def valkey(addr, *args, stdin=None):
    host, port = addr.rsplit(":", 1)
    cli = shutil.which("valkey-cli") or shutil.which("redis-cli") or "valkey-cli"
    return subprocess.run([cli, "-h", host, "-p", port, *args], input=stdin, text=True,
                          capture_output=True, check=True, timeout=60).stdout


def our_keys(seed):
    """The kvo:* keys on every master of the cluster, per master (a master that does not
    answer fails the test: the test cluster is ours and healthy)."""
    nodes = [line.split() for line in valkey(seed, "cluster", "nodes").splitlines()]
    masters = [n[1].split("@")[0] for n in nodes if "master" in n[2].split(",")]
    return {m: set(valkey(m, "--scan", "--pattern", "kvo:*").split()) for m in masters}


def main():
    bench, trace, work, nodes = sys.argv[1:5]
    # The test cluster is shared: the keys this test writes are deleted at its end (a slot
    # holding keys cannot be moved, which another cluster test does).
    seed = nodes.split(",")[0]
    before = set().union(*our_keys(seed).values())
    try:
        checks(bench, trace, work, nodes)
    finally:
        for master, keys in our_keys(seed).items():
            new = keys - before
            if new:
                valkey(master, stdin="".join(f"DEL {k}\n" for k in sorted(new)))
        left = set().union(*our_keys(seed).values()) - before
        if left:  # DEL through valkey-cli's standard input reports errors only on its output
            sys.exit(f"{len(left)} key(s) this test wrote are still in the cluster")


def checks(bench, trace, work, nodes):
    os.makedirs(work, mode=0o700, exist_ok=True)
    want = bound(trace)
    distinct, full = set(), 0
    with open(trace) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                distinct.update(full_ids(r))
                full += sum(block_tokens(r)[:len(full_ids(r))])
    failures = []

    def check(what, ok):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    def secret_file(name):
        path = os.path.join(work, name)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(secrets.token_hex(32))
        return path

    fleet, other = secret_file("fleet-secret"), secret_file("other-secret")
    name = "check-" + secrets.token_hex(8)  # a run of its own, whatever the cluster holds

    def engine(tag, host_blocks, fleet_name, secret):
        return run(bench, trace, os.path.join(work, tag + ".json"), "--host-tokens",
                   str(host_blocks * BLOCK_TOKENS), "--block-bytes", "64", "--shared", nodes,
                   "--shared-name", fleet_name, "--shared-secret-file", secret)

    a = engine("a", 8192, name, fleet)
    check(f"A: hit ratio {a['hit_ratio']:.6f} == bound {want:.6f}",
          abs(a["hit_ratio"] - want) < 1e-9)
    written = a["tiers"]["shared"]["bytes_stored"] // 64
    check(f"A: wrote {written} blocks == the slice's {len(distinct)} distinct blocks",
          written == len(distinct))

    b = engine("b", 300, name, fleet)
    check(f"B (a new process): hit tokens {b['hit_tokens']} == the slice's {full} tokens in "
          "full blocks (every one in the cluster; a partial last block is never stored)",
          b["hit_tokens"] == full and b["unattributed_hit_tokens"] == 0)
    part = b["tiers"]["shared"]["hit_ratio"]
    check(f"B: most of it from the shared tier ({part:.6f} > 0.5)", part > 0.5)
    check("B: no promotion failed, none overdue, no bad value",
          b["tiers"]["shared"]["failed_promotions"] == 0
          and b["tiers"]["shared"]["promotions_overdue"] == 0
          and b["tiers"]["shared"]["bad_values"] == 0)

    for tag, fleet_name, secret, what in (("c", name + "-other", fleet, "another fleet name"),
                                          ("d", name, other, "A's name, another secret")):
        e = engine(tag, 8192, fleet_name, secret)
        found = e["tiers"]["shared"]["presence_hits"]
        check(f"{tag.upper()} ({what}): hit ratio {e['hit_ratio']:.6f} == bound, "
              f"shared part {e['tiers']['shared']['hit_ratio']:.6f} == 0, keys found {found}",
              abs(e["hit_ratio"] - want) < 1e-9 and e["tiers"]["shared"]["hit_ratio"] == 0
              and found == 0)
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")


if __name__ == "__main__":
    main()
