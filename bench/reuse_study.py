#!/usr/bin/env python3
"""Issue 55's study: which signals predict that a host block will be used again, measured on a
Mooncake trace before any policy goes into the library (a prototype, not kvoffload's cache).

The cache model is the trace bench's (bench/trace_bench.cpp): 512-token blocks, a request hits
the longest prefix of its full blocks the cache holds (a partial last block has no hash in an
engine, so it is never stored), hit ratios are token-weighted, the bound is
the cache that never evicts. Tuned on the first half of the trace by time, reported on the
second half from a cold cache, as fractions of that half's bound. Policies:

  lru      least recently used, a request's first block the most recent (kvoffload's LRU)
  reuse    a block belongs to the last request that used it (its owner). Eviction
           samples --samples owners (a seeded generator: deterministic) and takes the deepest
           block of the least valuable one, so a chain is cut from its end, never holed. An
           owner's value is LHD's hit density (Beckmann et al., NSDI 2018) for its class at its
           age: P(used again | not yet, age) / E[time until then], where the class is the
           chain's turn count (1, 2, 3, 4+: how many times the prefix was extended) and the
           gap since the previous turn; both tables come from the first half. A block that
           --shared-min or more requests used (a system prompt) is worth at least 1/age.
  hint     reuse, with a per-request "this conversation continues" hint an engine would get
           from its client or router (kv_transfer_params), right with probability
           --hint-accuracy: the trace lacks it, so it is drawn from the trace's own future.

    python3 bench/reuse_study.py TRACE.jsonl[.gz] [--capacities 1e5,3e5,1e6,3e6,1e7]
        [--samples 64] [--shared-min 2] [--hint-accuracy 1,0.9,0.8,0.7] [--seed 1]
"""

import argparse
import bisect
import collections
import random

from check_trace import BLOCK_TOKENS as BLOCK, block_tokens, bound_of, full_ids, read

AGES = [0] + [2 ** i for i in range(13)]  # seconds: the tables' age buckets


def load(path):
    """(timestamp, tokens per block, full blocks' hash ids) per request (check_trace's token
    count and full_ids: an engine hashes no partial block, so none is stored or hit)."""
    return [(r["timestamp"], block_tokens(r), full_ids(r)) for r in read(path)]


def bound(trace):
    return bound_of((ids, toks) for _, toks, ids in trace)


def replay(trace, cache):
    hit = total = 0
    for k, r in enumerate(trace):
        i = 0
        while i < len(r[2]) and cache.has(r[2][i]):
            i += 1
        hit += sum(r[1][:i])
        total += sum(r[1])
        cache.access(k, r)
    return hit / total


def chains(trace):
    """Per request, as an engine sees it online: its parent (the request whose whole prompt but
    the partial last block, which has no hash, its hit prefix covers) or -1, and its turn
    count."""
    owner, turn, parent = {}, [1] * len(trace), [-1] * len(trace)
    for k, (_, _, ids) in enumerate(trace):
        m = 0
        while m < len(ids) and ids[m] in owner:
            m += 1
        if m:
            p = owner[ids[m - 1]]
            if m >= len(trace[p][2]):
                parent[k], turn[k] = p, turn[p] + 1
        for h in ids:
            owner[h] = k
    return turn, parent


def klass(trace, k, turn, parent):
    p = parent[k]
    gap = -1 if p < 0 else (trace[k][0] - trace[p][0]) / 1000
    return min(turn[k], 4), (-1 if gap < 0 else 0 if gap <= 30 else 1 if gap <= 300 else 2)


def fit(trace, turn, parent):
    """Hit density per class and age bucket, from `trace` (the first half)."""
    n, c, gaps = collections.Counter(), collections.Counter(), collections.defaultdict(list)
    for k in range(len(trace)):
        n[klass(trace, k, turn, parent)] += 1
        if parent[k] >= 0:
            key = klass(trace, parent[k], turn, parent)
            c[key] += 1
            gaps[key].append((trace[k][0] - trace[parent[k]][0]) / 1000)
    table = {}
    for key in n:
        p = min(1.0, c[key] / n[key])
        g = sorted(gaps[key]) or [1e9]
        row = []
        for a in AGES:
            j = bisect.bisect_right(g, a)
            f = j / len(g)
            again = p * (1 - f) / max(1e-9, 1 - p * f)  # used again, given not yet at age a
            rest = g[j:]
            wait = sum(rest) / len(rest) - a if rest else 1e9
            row.append(again / max(1.0, wait))
        table[key] = row
    return table


class Lru:
    def __init__(self, capacity):
        self.capacity, self.blocks = capacity, collections.OrderedDict()

    def has(self, h):
        return h in self.blocks

    def access(self, k, r):
        mine = set(r[2])
        for h in reversed(r[2]):
            self.blocks[h] = 1
            self.blocks.move_to_end(h)
        while len(self.blocks) > self.capacity:
            victim = next((h for h in self.blocks if h not in mine), None)
            if victim is None:
                return
            del self.blocks[victim]


class Reuse:
    def __init__(self, capacity, trace, table, samples, shared_min, seed, hint=None):
        self.capacity, self.trace, self.table = capacity, trace, table
        self.samples, self.shared_min, self.rng, self.hint = samples, shared_min, random.Random(seed), hint
        self.turn, self.parent = chains(trace)  # online: each entry uses only earlier requests
        self.owner, self.blocks, self.uses = {}, {}, collections.Counter()
        self.owners, self.index, self.held = [], {}, 0

    def has(self, h):
        return h in self.owner

    def _drop(self, o):
        del self.blocks[o]
        i, last = self.index.pop(o), self.owners.pop()
        if last != o:
            self.owners[i], self.index[last] = last, i

    def value(self, o, now):
        age = (now - self.trace[o][0]) / 1000
        v = self.table.get(klass(self.trace, o, self.turn, self.parent),
                           [0.0] * len(AGES))[bisect.bisect_right(AGES, age) - 1]
        if self.uses[self.blocks[o][-1]] >= self.shared_min:
            v = max(v, 1.0 / max(1.0, age))
        if self.hint is not None:
            v *= 4.0 if self.hint[o] else 0.05
        return v

    def access(self, k, r):
        now, toks, ids = r
        keep = ids
        for h in keep:
            self.uses[h] += 1
            o = self.owner.get(h)
            if o is None:
                self.held += 1
            elif o != k:
                self.blocks[o].remove(h)
                if not self.blocks[o]:
                    self._drop(o)
            self.owner[h] = k
        if keep:
            self.blocks[k] = list(keep)
            self.index[k] = len(self.owners)
            self.owners.append(k)
        while self.held > self.capacity:
            best = None
            for _ in range(self.samples):
                o = self.owners[self.rng.randrange(len(self.owners))]
                if o != k and (best is None or self.value(o, now) < best[1]):
                    best = (o, self.value(o, now))
            if best is None:
                return
            h = self.blocks[best[0]].pop()
            del self.owner[h]
            self.held -= 1
            if not self.blocks[best[0]]:
                self._drop(best[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--capacities", default="1e5,3e5,1e6,3e6,1e7")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--shared-min", type=int, default=2)
    ap.add_argument("--hint-accuracy", default="1,0.9,0.8,0.7")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    trace = load(a.trace)
    end = trace[-1][0]
    mid = next(k for k, r in enumerate(trace) if r[0] >= end / 2)
    first, second = trace[:mid], trace[mid:]
    turn, parent = chains(first)
    table = fit(first, turn, parent)
    best = bound(second)
    _, parent2 = chains(second)
    continued = [False] * len(second)
    for p in parent2:
        if p >= 0:
            continued[p] = True
    print(f"trace: {len(trace)} requests; tuned on the first {mid}, reported on the last "
          f"{len(second)} (cold cache), their bound {best:.3f}; seed {a.seed}")
    accs = [float(x) for x in a.hint_accuracy.split(",") if x]
    print("capacity  lru    reuse  " + "  ".join(f"hint{x:g}" for x in accs) + "   (fractions of the bound)")
    for cap in [float(x) for x in a.capacities.split(",")]:
        blocks = int(cap // BLOCK)
        row = [replay(second, Lru(blocks)),
               replay(second, Reuse(blocks, second, table, a.samples, a.shared_min, a.seed))]
        for acc in accs:
            rng = random.Random(a.seed + 6)
            hint = [c if rng.random() < acc else not c for c in continued]
            row.append(replay(second, Reuse(blocks, second, table, a.samples, a.shared_min,
                                            a.seed, hint)))
        print(f"{cap:8.0e}  " + "  ".join(f"{x / best:.3f}" for x in row), flush=True)


if __name__ == "__main__":
    main()
