#!/usr/bin/env python3
"""The CI smoke test of `kvoffload-bench trace` (issue 50): replays a slice of the Mooncake trace
through the benchmark and checks its hit ratios against figures computed here, from the trace
alone, never from the benchmark's output.

  check_trace.py BENCH TRACE WORKDIR

1. Host cache larger than the slice: nothing is evicted, so the hit ratio must equal the bound
   (a cache that never evicts), computed here.
2. A host cache of 300 blocks (more than any request's 236, so promotions find room) over a disk
   tier larger than the slice: write-through puts every stored block on disk, so again the hit
   ratio must equal the bound, part of it from the disk.
3. The same host cache alone: it evicts, so it must stay below the bound.
4. The offline optimum the bench reports beside each run (Belady, issue 55) must equal the one
   computed here (next uses from the trace, a heap-free scan) at 300 and 60 blocks, be the
   bound when nothing is evicted, and be no worse than the real cache's LRU of the same
   capacity.
5. Policy reuse (issue 55) at 60 and 300 blocks: a hit ratio above 0 and at most the optimum,
   the capacity asked for, no store without room at 300, and the same figures from two runs.

A request's partial last block has no hash in an engine: the bench never stores or hits it,
and neither do the figures computed here (full_ids).
"""
import gzip
import json
import os
import subprocess
import sys

BLOCK_TOKENS = 512


def read(path):
    """The trace's requests (JSON lines, gzip-compressed if the name ends in .gz)."""
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def block_tokens(r):
    """A request's tokens per block: whole blocks, then what its last block holds."""
    n = len(r["hash_ids"])
    return [BLOCK_TOKENS] * (n - 1) + [
        max(0, min(BLOCK_TOKENS, r["input_length"] - BLOCK_TOKENS * (n - 1)))]


def full_ids(r):
    """The hash ids an engine hashes: its full blocks (a partial last block has none)."""
    ids = r["hash_ids"]
    return ids[:-1] if ids and block_tokens(r)[-1] < BLOCK_TOKENS else ids


def bound_of(requests):
    """Token-weighted hit ratio of a never-evicting cache over (hash ids, tokens per block) per
    request: per request, the longest prefix of its hash ids seen in earlier requests (the
    callers pass full_ids: a partial last block is never hit)."""
    seen, hit, total = set(), 0, 0
    for ids, tokens in requests:
        i = 0
        while i < len(ids) and ids[i] in seen:
            hit += tokens[i]
            i += 1
        total += sum(tokens)
        seen.update(ids)
    return hit / total


def bound(path):
    return bound_of((full_ids(r), block_tokens(r)) for r in read(path))


def optimum(path, capacity):
    """Belady's hit ratio with `capacity` blocks, written apart from the bench's: per request,
    the longest held prefix hits; then each of its blocks is used: a held one takes its next
    use, a missing one is admitted if there is room, else in place of the held block (not the
    request's own) used farthest ahead, unless its own next use is farther."""
    reqs = [(full_ids(r), block_tokens(r)) for r in read(path)]
    never = float("inf")
    nxt, later = [None] * len(reqs), {}
    for k in range(len(reqs) - 1, -1, -1):
        nxt[k] = [later.get(h, never) for h in reqs[k][0]]
        for h in reqs[k][0]:
            later[h] = k
    held, hit, total = {}, 0, 0
    for k, (ids, tokens) in enumerate(reqs):
        i = 0
        while i < len(ids) and ids[i] in held:
            hit += tokens[i]
            i += 1
        total += sum(tokens)
        mine = set(ids)
        for h, use in zip(ids, nxt[k]):
            if h in held or len(held) < capacity:
                held[h] = use
                continue
            victims = [(u, b) for b, u in held.items() if b not in mine]
            if not victims:
                continue
            far, victim = max(victims)
            if far > use:
                del held[victim]
                held[h] = use
    return hit / total


def run(bench, trace, out, *args):
    cmd = [bench, "--json", out, "trace", "--format", "mooncake", trace, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
    with open(out) as f:
        return json.load(f)["trace"]


def main():
    bench, trace, work = sys.argv[1:4]
    os.makedirs(work, mode=0o700, exist_ok=True)
    want = bound(trace)
    assert 0.02 < want < 0.5, f"the slice's bound is {want}: not the slice this test expects"
    failures = []

    def check(what, ok):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    # The slice holds 5015 distinct full blocks: 8192 blocks of host cache never evict.
    big = run(bench, trace, os.path.join(work, "big.json"), "--host-tokens",
              str(8192 * BLOCK_TOKENS), "--block-bytes", "64")
    check(f"huge host cache: hit ratio {big['hit_ratio']:.6f} == bound {want:.6f}",
          abs(big["hit_ratio"] - want) < 1e-9)
    check(f"the bench's own bound {big['infinite_hit_ratio']:.6f} == {want:.6f}",
          abs(big["infinite_hit_ratio"] - want) < 1e-9)

    disk_dir = os.path.join(work, "disk")
    os.makedirs(disk_dir, mode=0o700, exist_ok=True)
    tiered = run(bench, trace, os.path.join(work, "disk.json"), "--host-tokens",
                 str(300 * BLOCK_TOKENS), "--disk-tokens", str(8192 * BLOCK_TOKENS), "--disk",
                 disk_dir)
    check(f"300-block host over a disk tier: hit ratio {tiered['hit_ratio']:.6f} == bound",
          abs(tiered["hit_ratio"] - want) < 1e-9)
    disk_part = tiered["tiers"]["disk"]["hit_ratio"]
    check(f"part of it from the disk tier ({disk_part:.6f} > 0)", disk_part > 0)
    check("nothing skipped on the way (stores, writes, promotions)",
          tiered["tiers"]["host"]["stores_without_room"] == 0
          and tiered["tiers"]["disk"]["writes_queue_full"] == 0
          and tiered["tiers"]["disk"]["promotions_without_room"] == 0)

    small = run(bench, trace, os.path.join(work, "small.json"), "--host-tokens",
                str(300 * BLOCK_TOKENS))
    check(f"300-block host alone: hit ratio {small['hit_ratio']:.6f} below the bound",
          0 < small["hit_ratio"] < want - 1e-3)

    best = optimum(trace, 300)
    check(f"huge host cache: the bench's optimum {big['optimum_hit_ratio']:.6f} == bound",
          abs(big["optimum_hit_ratio"] - want) < 1e-9)
    check(f"300 blocks: the bench's optimum {small['optimum_hit_ratio']:.6f} == {best:.6f} "
          "computed here", abs(small["optimum_hit_ratio"] - best) < 1e-9)
    check(f"300 blocks: optimum {best:.6f} >= LRU {small['hit_ratio']:.6f}, <= bound",
          small["hit_ratio"] <= best <= want)
    # 60 blocks: fewer than many requests hold, so the optimum's evictions decide its figure.
    tiny = run(bench, trace, os.path.join(work, "tiny.json"), "--host-tokens",
               str(60 * BLOCK_TOKENS))
    best = optimum(trace, 60)
    check(f"60 blocks: the bench's optimum {tiny['optimum_hit_ratio']:.6f} == {best:.6f} "
          "computed here, below the bound", abs(tiny["optimum_hit_ratio"] - best) < 1e-9
          and best < want - 1e-3 and tiny["hit_ratio"] <= best)
    # Policy reuse (issue 55) in the real scheduler and host cache: within what the memory
    # allows, every store found room, and the same trace gives the same figures twice.
    for blocks in (60, 300):
        runs = [run(bench, trace, os.path.join(work, f"reuse-{blocks}-{i}.json"), "--host-tokens",
                    str(blocks * BLOCK_TOKENS), "--policy", "reuse") for i in range(2)]
        r = runs[0]
        check(f"{blocks} blocks, policy reuse: hit ratio {r['hit_ratio']:.6f} > 0, at most the "
              f"optimum {r['optimum_hit_ratio']:.6f}",
              r["policy"] == "reuse" and 0 < r["hit_ratio"] <= r["optimum_hit_ratio"] + 1e-12)
        # 300 blocks hold any request of the slice (236 at most): every store finds room.
        check(f"{blocks} blocks, policy reuse: capacity {r['tiers']['host']['capacity_tokens']} "
              "tokens as asked" + (", no store without room" if blocks == 300 else ""),
              r["tiers"]["host"]["capacity_tokens"] == blocks * BLOCK_TOKENS
              and (blocks < 300 or r["tiers"]["host"]["stores_without_room"] == 0))
        same = ("hit_ratio", "hit_tokens")
        check(f"{blocks} blocks, policy reuse: deterministic (two runs: "
              f"{[x['hit_ratio'] for x in runs]}, bytes stored "
              f"{[x['tiers']['host']['bytes_stored'] for x in runs]})",
              all(runs[0][k] == runs[1][k] for k in same)
              and runs[0]["tiers"]["host"]["bytes_stored"] == runs[1]["tiers"]["host"]["bytes_stored"])
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")


if __name__ == "__main__":
    main()
