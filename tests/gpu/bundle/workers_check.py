"""The GPU bundle's many-workers, soak and sticky-fault check (issue 49, part 8).

  many-workers  Four kvoffload Workers in one process, as tensor-parallel ranks are: each with
                its own KV tensors (K and V, 64 KiB pages), its own host pool, its own thread
                and its own torch compute stream (the Worker's compute_stream). Each runs 2,000
                mixed store and load jobs (seeded; the seed is printed and --seed repeats the
                job sequences): a store's source blocks are first written on the compute stream,
                now and then behind a GPU sleep, and the store is submitted at once (it must
                wait for those writes on the GPU); a load copies host blocks a finished store
                wrote into other GPU blocks. After each submission a random choice waits for the
                job, for a few jobs in flight, for all of them, or for none, and polls
                (get_finished) or not; one of the four defers its stores (defer_stores, started
                by start_step or a wait). Proves: every job is reported exactly once, ok, with
                its byte count; the bytes are right (every page every load wrote, compared
                before any later load may overwrite it; at the middle 64 host blocks, at the end
                every host block and every loaded page, against what the model says they hold:
                an 8-byte tag header and tag-dependent bytes); Worker.stats() agrees. Then
                compares the four's summed throughput with one Worker's alone (the same
                workload, in the same run, first): FAILS on a GPU below 0.9x (on CPU: reported
                only).
  soak          20,000 small jobs on one Worker, the same mix: device memory in use
                (torch.cuda.mem_get_info) and the process's RSS (/proc/self/statm) sampled; each
                must grow by at most 16 MiB from the sample at 10% of the jobs to the end.
  sticky-fault  In a subprocess (workers_fault.py): a kernel-mode store whose KV tensor is
                host memory the GPU cannot read (pageable memory, never registered; where the
                GPU can read that, HMM or ATS, a PROT_NONE mapping) must fail, and so must
                every job after it, on that Worker and on a good one (a CUDA illegal-address
                fault poisons the context): none is ever reported ok. The jobs before the
                fault must be ok. A kvoffload that refuses such a tensor when the Worker is
                built (not memory of its device) leaves no fault to test: the part is then
                skipped, said so. --no-fault skips it.

Fails on: a job reported twice, never, failed, or with the wrong kind or byte count; a wrong
byte; an exception; a part past its time bound (every loop is bounded in count and time);
on a GPU, the summed throughput below 0.9x one Worker's; memory growth over 16 MiB; a job
reported ok after the fault, or no fault produced.

    python3 workers_check.py OUT.json            on a GPU: under 90 s on an H100
    python3 workers_check.py --quick OUT.json    half the jobs (under 45 s)
    python3 workers_check.py --cpu OUT.json      the same logic on CPU tensors and the host
                                                 backend (no streams, no device memory, no
                                                 fault: those are skipped, said so)
    options: --seed N, --no-fault

Prints one line per part, each starting with "workers ", and exits 0 (pass) or 1 (fail).
"""

import argparse
import collections
import gc
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import traceback

import torch

import kvoffload as kv
from bundle_common import (KiB, MiB, Env, host_equal, logger, make_job, parser, setup,
                           stream_ctx, versions, write_json)
from workers_fault import fault_child, fault_line, sticky_fault

PART = "workers"
RATIO_TARGET = 0.9
GROWTH_LIMIT = 16 * MiB
VERIFY_CHUNK = 64  # blocks compared at once (bounds the check's own temporaries)
log = logger(PART)


def pattern(tags, k, base):
    """The page K (k = 0) or V (k = 1) holds for `tags` ([n] int64): an 8-byte header with the
    tag and k, then the Driver's random row base[k] plus the tag mod 251 (uint8 arithmetic:
    cheap enough to compare every load's pages, even on a CPU)."""
    out = base[k][None, :] + (tags % 251).to(torch.uint8)[:, None]
    out[:, :8] = tags.view(torch.uint8).reshape(-1, 8)
    out[:, 8] = k
    return out


def rss_bytes():
    """Resident and resident anonymous (resident - shared: no code paged in) bytes."""
    with open("/proc/self/statm") as f:
        v = [int(x) for x in f.read().split()]
    page = os.sysconf("SC_PAGE_SIZE")
    return v[1] * page, (v[1] - v[2]) * page


def device_used():
    free, total = torch.cuda.mem_get_info()
    return total - free


class Params:
    def __init__(self, jobs, page, s_blocks, d_blocks, host_blocks, bmin, bmax, max_inflight,
                 p_sleep, seconds):
        self.__dict__.update(locals())
        del self.__dict__["self"]


class Driver:
    """One Worker and the model of what its blocks hold. GPU ids 1..S are the store sources
    (written on the compute stream before each store), S+1..S+D the load destinations."""

    SLEEP_CYCLES = 1_000_000  # about 0.5 ms: a store that does not wait would read old data

    def __init__(self, name, p, seed, cuda, defer_stores=False, tag_base=0):
        self.name, self.p, self.cuda, self.defer = name, p, cuda, defer_stores
        self.seed = seed
        self.rng = random.Random(seed)
        self.device = "cuda" if cuda else "cpu"
        blocks = 1 + p.s_blocks + p.d_blocks
        self.k = torch.zeros(blocks, p.page, dtype=torch.uint8, device=self.device)
        self.v = torch.zeros(blocks, p.page, dtype=torch.uint8, device=self.device)
        self.stream = torch.cuda.Stream() if cuda else None
        # Made here and synchronized: every later use is on this Driver's stream.
        gen = torch.Generator().manual_seed(seed)
        self.base = torch.randint(0, 256, (2, p.page), dtype=torch.uint8,
                                  generator=gen).to(self.device)
        if cuda:
            torch.cuda.synchronize()
        self.worker = kv.Worker(kv.WorkerConfig(
            tensors=[kv.tensor_of(self.k), kv.tensor_of(self.v)],
            groups=[[(0, p.page), (1, p.page)]], host_blocks=p.host_blocks,
            backend="cuda" if cuda else "host", threads=0 if cuda else 1,
            compute_stream=self.stream, defer_stores=defer_stores))
        self.s_ids = list(range(1, 1 + p.s_blocks))
        self.d_ids = list(range(1 + p.s_blocks, blocks))
        self.s_busy, self.d_busy = set(), set()
        self.d_tag = {}
        self.d_unchecked = set()  # loaded, not compared yet: never loaded into again before
        self.host_tag = [None] * p.host_blocks
        self.host_writing = set()
        self.host_readers = collections.Counter()
        self.known_hosts = 0  # host blocks with a tag
        self.inflight, self.order = {}, collections.deque()
        self.first_id = 1
        self.reported = bytearray(p.jobs + 2)
        self.tag = tag_base
        self.errors = []
        self.counts = collections.Counter()
        self.bytes_done = 0
        self.t_first = self.t_last = None
        self.checked_pages = self.mismatched_pages = 0
        self.first_mismatch = None
        self.samples = []

    # -- choosing blocks -------------------------------------------------------------------------

    def _pick(self, candidates, n, ok):
        """n distinct random members of `candidates` (a list) passing ok(), or None."""
        out, seen = [], set()
        for _ in range(8 * n + 16):
            c = candidates[self.rng.randrange(len(candidates))]
            if c not in seen and ok(c):
                seen.add(c)
                out.append(c)
                if len(out) == n:
                    return out
        return None

    def _host_free(self, h):
        return h not in self.host_writing and self.host_readers[h] == 0

    def _host_loadable(self, h):
        return self.host_tag[h] is not None and h not in self.host_writing

    # -- jobs -------------------------------------------------------------------------------------

    def _submit(self, jid, kind, gpu_ids, host_ids, tags):
        job = make_job(jid, kind, gpu_ids, host_ids)
        self.worker.submit(job)
        nbytes = len(gpu_ids) * 2 * self.p.page
        self.inflight[jid] = (kind, gpu_ids, host_ids, tags, nbytes)
        self.order.append(jid)
        if self.t_first is None:
            self.t_first = time.perf_counter()
        self.counts["submitted_" + kind] += 1

    def _store(self, jid, n):
        s = self._pick(self.s_ids, n, lambda g: g not in self.s_busy)
        h = self._pick(range(self.p.host_blocks), n, self._host_free) if s else None
        if not s or not h:
            return False
        tags = list(range(self.tag, self.tag + n))
        self.tag += n
        # The forward pass writing the blocks the store reads, on the compute stream.
        with stream_ctx(self.stream):
            t = torch.tensor(tags, dtype=torch.int64, device=self.device)
            idx = torch.tensor(s, device=self.device)
            if self.cuda and self.rng.random() < self.p.p_sleep:
                torch.cuda._sleep(self.SLEEP_CYCLES)
                self.counts["stores_behind_sleep"] += 1
            self.k.index_copy_(0, idx, pattern(t, 0, self.base))
            self.v.index_copy_(0, idx, pattern(t, 1, self.base))
        self.s_busy.update(s)
        self.host_writing.update(h)
        self._submit(jid, "store", s, h, tags)
        return True

    def _load(self, jid, n):
        h = self._pick(range(self.p.host_blocks), n, self._host_loadable)
        free = lambda g: g not in self.d_busy and g not in self.d_unchecked  # noqa: E731
        d = self._pick(self.d_ids, n, free) if h else None
        if h and not d and self.d_unchecked:
            self.check_loads()  # every load's pages are compared before they are overwritten
            d = self._pick(self.d_ids, n, free)
        if not h or not d:
            return False
        tags = [self.host_tag[x] for x in h]
        for x in h:
            self.host_readers[x] += 1
        self.d_busy.update(d)
        self._submit(jid, "load", d, h, tags)
        return True

    def collect(self):
        for f in self.worker.get_finished():
            rec = self.inflight.pop(f.job, None)
            at = f.job - self.first_id
            if rec is None:
                seen = 0 <= at < len(self.reported) and self.reported[at]
                self.errors.append(f"job {f.job} reported {'twice' if seen else 'but unknown'}")
                continue
            self.reported[at] = 1
            kind, gpu_ids, host_ids, tags, nbytes = rec
            good = f.ok and f.kind == kind and f.bytes == nbytes
            if not good:
                self.counts["failed"] += 1
                if len(self.errors) < 20:
                    self.errors.append(f"job {f.job} ({kind}): ok {f.ok}, kind {f.kind}, bytes "
                                       f"{f.bytes} of {nbytes}: {f.error}")
            else:
                self.counts["ok_" + kind] += 1
                self.bytes_done += f.bytes
            if kind == "store":
                self.s_busy.difference_update(gpu_ids)
                self.host_writing.difference_update(host_ids)
                for x, t in zip(host_ids, tags):
                    was = self.host_tag[x]
                    self.host_tag[x] = t if good else None
                    self.known_hosts += (self.host_tag[x] is not None) - (was is not None)
            else:
                for x in host_ids:
                    self.host_readers[x] -= 1
                self.d_busy.difference_update(gpu_ids)
                for g, t in zip(gpu_ids, tags):
                    self.d_tag[g] = t if good else None
                    if good:
                        self.d_unchecked.add(g)
                    else:
                        self.d_unchecked.discard(g)
            self.t_last = time.perf_counter()
        while self.order and self.order[0] not in self.inflight:
            self.order.popleft()

    def _wait_oldest(self):
        if self.defer:
            self.worker.start_step()
        oldest = self.order[0] if self.order else None
        if oldest is not None:
            self.worker.wait([oldest])
        self.collect()
        if oldest is not None and oldest in self.inflight:
            time.sleep(0.0005)  # waited for, yet not reported: get_finished will say (or not)

    def step(self, jid):
        """Submits job jid (a store or a load), then waits and polls at random."""
        p, rng = self.p, self.rng
        n = rng.randint(p.bmin, p.bmax)
        for _ in range(50):
            want_load = self.known_hosts >= n and rng.random() < 0.5
            if (self._load(jid, n) if want_load else self._store(jid, n)):
                break
            if (self._store(jid, n) if want_load else self._load(jid, n)):
                break
            if not self.inflight:
                n = max(1, n // 2)
            self._wait_oldest()  # every block is busy: let some jobs finish
        else:
            raise RuntimeError(f"job {jid}: no free blocks after 50 tries")
        r = rng.random()
        if r < 0.25:
            self.worker.wait([jid])
            self.counts["wait_one"] += 1
        elif r < 0.35 and self.inflight:
            ids = list(self.inflight)
            self.worker.wait(rng.sample(ids, min(3, len(ids))))
            self.counts["wait_some"] += 1
        elif r < 0.40:
            self.worker.wait(list(self.inflight))
            self.counts["wait_all"] += 1
        if self.defer and rng.random() < 0.3:
            self.worker.start_step()
        if rng.random() < 0.5:
            self.collect()
            self.counts["polls"] += 1
        stall = time.time() + 20
        while len(self.inflight) >= p.max_inflight:
            self._wait_oldest()
            if time.time() > stall:
                raise RuntimeError(f"job {self.order[0]} not reported 20 s after its wait")

    def drain(self, seconds=20):
        end = time.time() + seconds
        while self.inflight and time.time() < end:
            if self.defer:
                self.worker.start_step()
            self.worker.wait(list(self.inflight))
            self.collect()
            if self.inflight:
                time.sleep(0.001)
        if self.inflight:
            self.errors.append(f"{len(self.inflight)} jobs never reported ({seconds} s after "
                               "the last submission)")

    # -- checks -----------------------------------------------------------------------------------

    def check_loads(self):
        """The pages of every load finished since the last check."""
        self._check_gpu(sorted(self.d_unchecked))
        self.d_unchecked.clear()

    def _check_gpu(self, ds):
        """GPU blocks ds against their d_tag pages, K and V (one synchronization)."""
        if not ds:
            return
        with stream_ctx(self.stream):
            bads = []
            for at in range(0, len(ds), VERIFY_CHUNK):
                chunk = ds[at:at + VERIFY_CHUNK]
                idx = torch.tensor(chunk, device=self.device)
                tags = torch.tensor([self.d_tag[g] for g in chunk], dtype=torch.int64,
                                    device=self.device)
                bads.append(torch.stack([(t[idx] != pattern(tags, k, self.base)).any(dim=1)
                                         for k, t in ((0, self.k), (1, self.v))], dim=1))
            bad = torch.cat(bads).cpu()  # [len(ds), 2]: K, V
        self.checked_pages += 2 * len(ds)
        nbad = int(bad.sum())
        if nbad:
            self.mismatched_pages += nbad
            row, k = (int(x) for x in bad.nonzero()[0])
            self._mismatch(f"GPU block {ds[row]} ({'KV'[k]}), tag {self.d_tag[ds[row]]}")

    def verify(self, host_sample=None):
        """The loads not compared yet, then every loaded GPU page not being loaded again (again:
        nothing may have overwritten them), and the host blocks not being written (a sample of
        them, or all), against the pages their tags name."""
        p = self.p
        self.check_loads()
        self._check_gpu([g for g, t in self.d_tag.items()
                         if t is not None and g not in self.d_busy])
        with stream_ctx(self.stream):
            hs = [h for h in range(p.host_blocks)
                  if self.host_tag[h] is not None and h not in self.host_writing]
            if host_sample is not None and len(hs) > host_sample:
                hs = self.rng.sample(hs, host_sample)
            for at in range(0, len(hs), VERIFY_CHUNK):
                chunk = hs[at:at + VERIFY_CHUNK]
                tags = torch.tensor([self.host_tag[h] for h in chunk], dtype=torch.int64,
                                    device=self.device)
                want = torch.cat([pattern(tags, 0, self.base),
                                  pattern(tags, 1, self.base)], dim=1).cpu().numpy()
                for i, h in enumerate(chunk):
                    self.checked_pages += 2
                    if not host_equal(self.worker, h, want[i]):
                        self.mismatched_pages += 2
                        self._mismatch(f"host block {h}, tag {self.host_tag[h]}")

    def _mismatch(self, what):
        if self.first_mismatch is None:
            self.first_mismatch = what
            self.errors.append(f"wrong bytes: {what}")

    # -- a whole run ------------------------------------------------------------------------------

    def run(self, deadline, sample_every=0, on_sample=None, checks=None):
        """Runs p.jobs jobs, verifying (64 host blocks) after the job counts in `checks`
        (default: the middle), then drains and verifies everything."""
        p = self.p
        checks = set(checks if checks is not None else [p.jobs // 2])
        end = min(deadline, time.time() + p.seconds)
        done = 0
        try:
            for n in range(p.jobs):
                if time.time() > end:
                    self.errors.append(f"timeout: {n} of {p.jobs} jobs submitted in "
                                       f"{p.seconds} s")
                    break
                self.step(self.first_id + n)
                done = n + 1
                if sample_every and on_sample and done % sample_every == 0:
                    on_sample(self, done)
                if done in checks:
                    self.verify(host_sample=64)
            self.drain(max(2.0, min(20.0, deadline - time.time())))
            if on_sample:
                on_sample(self, done, final=True)
            self.verify()
        except Exception as e:  # noqa: BLE001 (reported)
            self.errors.append(f"{type(e).__name__}: {e}")
            self.traceback = traceback.format_exc()
        self.jobs_done = done
        return self

    def summary(self):
        missing = sum(1 for i in range(self.jobs_done) if not self.reported[i])
        st = self.worker.stats()
        ok = self.counts["ok_store"] + self.counts["ok_load"]
        if not self.errors:
            if missing:
                self.errors.append(f"{missing} jobs never reported")
            if ok != self.jobs_done:
                self.errors.append(f"{ok} of {self.jobs_done} jobs ok")
            if st["store_jobs"] + st["load_jobs"] != self.jobs_done or st["failed_jobs"]:
                self.errors.append(f"Worker.stats() disagrees: {st}")
            if self.checked_pages == 0:
                self.errors.append("no page was checked")
        seconds = (self.t_last - self.t_first) if self.t_first and self.t_last else 0
        return {"name": self.name, "seed": self.seed, "defer_stores": self.defer,
                "jobs": self.jobs_done, "not_reported": missing,
                "counts": dict(self.counts), "bytes": self.bytes_done,
                "seconds": round(seconds, 4),
                "gbps": self.bytes_done / seconds / 1e9 if seconds > 0 else 0.0,
                "pages_checked": self.checked_pages, "mismatched": self.mismatched_pages,
                "stats": st, "cuda_stats": self.worker.cuda_stats(),
                "errors": self.errors[:20]}

    def close(self):
        self.worker = None
        self.k = self.v = self.base = None
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


# -- (a) many workers ---------------------------------------------------------------------------


def many_workers(cfg, seed, deadline):
    cuda, p = cfg["cuda"], cfg["many"]
    out = {"workers": 4, "jobs_per_worker": p.jobs, "page_bytes": p.page, "seed": seed}
    # Untimed: the process's first jobs pay for loading kernels and first allocations.
    warm = Driver("warm-up", Params(**{**p.__dict__, "jobs": 64}), seed ^ 0x5A5A, cuda)
    w = warm.run(deadline).summary()
    warm.close()
    alone = Driver("alone", p, seed, cuda).run(deadline)
    a = alone.summary()
    alone.close()
    out["alone"] = a
    errors = [f"warm-up: {e}" for e in w["errors"]] + [f"alone: {e}" for e in a["errors"]]
    drivers = [Driver(f"w{i}", p, seed + 1 + i, cuda, defer_stores=(i == 3),
                      tag_base=(i + 1) << 40) for i in range(4)]
    threads = [threading.Thread(target=d.run, args=(deadline,), daemon=True, name=d.name)
               for d in drivers]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1.0, deadline - time.time() + 5))
    wall = time.perf_counter() - t0
    hung = [t.name for t in threads if t.is_alive()]
    if hung:
        errors.append(f"timeout: threads {hung} still running")
        out["workers_detail"] = []
        out["errors"] = errors
        return out, True
    rows = [d.summary() for d in drivers]
    for d in drivers:
        d.close()
    out["workers_detail"] = rows
    for r in rows:
        errors += [f"{r['name']}: {e}" for e in r["errors"]]
    first = min(d.t_first for d in drivers if d.t_first) if all(d.t_first for d in drivers) else 0
    last = max(d.t_last for d in drivers if d.t_last) if all(d.t_last for d in drivers) else 0
    span = last - first if first and last else wall
    total = sum(r["bytes"] for r in rows)
    out["sum_gbps"] = total / span / 1e9 if span > 0 else 0.0
    out["alone_gbps"] = a["gbps"]
    out["ratio"] = out["sum_gbps"] / a["gbps"] if a["gbps"] > 0 else 0.0
    out["ratio_target"] = RATIO_TARGET
    out["ratio_enforced"] = cuda
    out["span_seconds"] = round(span, 4)
    if cuda and not errors and out["ratio"] < RATIO_TARGET:
        errors.append(f"summed throughput {out['sum_gbps']:.2f} GB/s is {out['ratio']:.3f}x "
                      f"one Worker's alone ({a['gbps']:.2f} GB/s), below {RATIO_TARGET}x")
    out["errors"] = errors
    return out, False


# -- (b) soak -----------------------------------------------------------------------------------


def soak(cfg, seed, deadline):
    cuda, p = cfg["cuda"], cfg["soak"]
    samples = []

    def sample(d, done, final=False):
        if final or done == p.jobs // 10:
            gc.collect()
        samples.append([done, *rss_bytes(), device_used() if cuda else None])

    d = Driver("soak", p, seed + 100, cuda)
    samples.append([0, *rss_bytes(), device_used() if cuda else None])
    # Checks every 10% from 5% on: the first, before the baseline at 10%, gives the check's own
    # temporaries their memory (torch's caching allocator, malloc's heap), so the growth from
    # there to the end is the Worker's.
    d.run(deadline, sample_every=max(1, p.jobs // 50), on_sample=sample,
          checks=range(p.jobs // 20, p.jobs, max(1, p.jobs // 10)))
    s = d.summary()
    d.close()
    out = {"jobs": p.jobs, "page_bytes": p.page, "limit_bytes": GROWTH_LIMIT, "worker": s,
           "samples": samples,
           "sample_columns": ["jobs", "rss_bytes", "rss_anon_bytes", "device_used_bytes"]}
    errors = [f"soak: {e}" for e in s["errors"]]
    base = next((x for x in samples if x[0] >= p.jobs // 10), None)
    end = samples[-1]
    if base is None or base is end:
        errors.append("too few samples to judge growth")
    else:
        out["baseline_at_jobs"] = base[0]
        out["rss_growth_bytes"] = end[1] - base[1]
        out["rss_anon_growth_bytes"] = end[2] - base[2]
        out["rss_max_bytes"] = max(x[1] for x in samples)
        if out["rss_growth_bytes"] > GROWTH_LIMIT:
            errors.append(f"RSS grew {out['rss_growth_bytes'] / MiB:.1f} MiB from job {base[0]} "
                          f"to the end (limit {GROWTH_LIMIT // MiB} MiB)")
        if cuda:
            out["device_growth_bytes"] = end[3] - base[3]
            if out["device_growth_bytes"] > GROWTH_LIMIT:
                errors.append(f"device memory grew {out['device_growth_bytes'] / MiB:.1f} MiB "
                              f"from job {base[0]} to the end (limit {GROWTH_LIMIT // MiB} MiB)")
        else:
            out["device_growth_bytes"] = None
            out["device_skipped"] = "no GPU (--cpu): device memory not sampled"
    out["errors"] = errors
    return out


# -- main ---------------------------------------------------------------------------------------


def settings(cpu, quick):
    half = 2 if quick else 1
    if cpu:
        return {
            "many": Params(jobs=2000 // half, page=16 * KiB, s_blocks=256, d_blocks=256,
                           host_blocks=256, bmin=2, bmax=16, max_inflight=8, p_sleep=0.0,
                           seconds=25),
            "soak": Params(jobs=20000 // half, page=4 * KiB, s_blocks=256, d_blocks=256,
                           host_blocks=256, bmin=1, bmax=4, max_inflight=16, p_sleep=0.0,
                           seconds=25),
            "caps": {"many-workers": 25, "soak": 20, "sticky-fault": 10}, "budget": 60,
        }
    return {
        "many": Params(jobs=2000 // half, page=64 * KiB, s_blocks=1024, d_blocks=1024,
                       host_blocks=1024, bmin=16, bmax=96, max_inflight=8, p_sleep=0.1,
                       seconds=25 // half),
        "soak": Params(jobs=20000 // half, page=16 * KiB, s_blocks=512, d_blocks=512,
                       host_blocks=512, bmin=1, bmax=8, max_inflight=16, p_sleep=0.0,
                       seconds=20 // half),
        # Each part's bound (s), the whole run's after them (the import and CUDA start before):
        # inside the bundle's part timeout (70 s, quick 45 s) with room for the start.
        "caps": ({"many-workers": 25, "soak": 20, "sticky-fault": 10} if not quick else
                 {"many-workers": 14, "soak": 10, "sticky-fault": 8}),
        "budget": 55 if not quick else 32,
    }


def main(argv):
    p = parser(__doc__, "workers.json", "CPU tensors, host backend", "half the jobs", raw=True)
    p.add_argument("--seed", type=int, default=None, help="the job sequences' seed")
    p.add_argument("--no-fault", action="store_true", help="skip the sticky-fault part")
    p.add_argument("--fault-child", metavar="JSON", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    setup()
    if args.fault_child:
        fault_child(args.fault_child, args.cpu)
        sys.stdout.flush()
        os._exit(0)  # a poisoned context's exit handlers are not this check's subject
    env = Env(args.cpu)
    cuda = env.cuda
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little") >> 1
    start = time.time()
    cfg = settings(args.cpu, args.quick)
    cfg["cuda"] = cuda
    deadline = start + cfg["budget"]
    log(f"seed {seed} (--seed {seed} repeats the job sequences)")
    results = {"part": PART, "mode": env.mode, "quick": args.quick, "seed": seed, **versions(),
               "settings": {k: (v.__dict__ if isinstance(v, Params) else v)
                            for k, v in cfg.items()}, "parts": {}}
    cfg["tmp"] = tempfile.mkdtemp(prefix="kvoffload-workers-")
    hung = False
    if env.missing_device():
        results["device"] = None
        parts = {"many-workers": None, "soak": None, "sticky-fault": None}
        for name in parts:
            results["parts"][name] = {"status": "fail", "errors": [
                "no CUDA device visible to torch (use --cpu off a GPU)"]}
    else:
        results["device"] = env.device_name()
        for name, fn in (("many-workers", lambda d: many_workers(cfg, seed, d)),
                         ("soak", lambda d: soak(cfg, seed, d)),
                         ("sticky-fault", lambda d: sticky_fault(cfg, d, not args.no_fault,
                                                                 os.path.abspath(__file__)))):
            t0 = time.time()
            part_deadline = min(deadline, t0 + cfg["caps"][name])
            if hung:
                r = {"errors": ["not run: an earlier part's threads still run"]}
            else:
                try:
                    r = fn(part_deadline)
                    if name == "many-workers":
                        r, hung = r
                except Exception as e:  # noqa: BLE001 (reported, the part fails)
                    r = {"errors": [f"{type(e).__name__}: {e}"],
                         "traceback": traceback.format_exc()}
            r["seconds"] = round(time.time() - t0, 2)
            r["status"] = ("fail" if r["errors"] else "skipped" if "skipped" in r else "pass")
            results["parts"][name] = r
            log(f"{name}: {r['status'].upper()} in {r['seconds']:.1f} s  {line_of(name, r)}")
    shutil.rmtree(cfg["tmp"], ignore_errors=True)
    results["seconds"] = round(time.time() - start, 2)
    failed = [n for n, r in results["parts"].items() if r["status"] == "fail"]
    results["status"] = "fail" if failed else "pass"
    write_json(args.out, results)
    log(f"{results['status'].upper()} in {results['seconds']:.1f} s"
        + (f" (failed: {', '.join(failed)})" if failed else "") + f", seed {seed}")
    sys.stdout.flush()
    if hung:
        os._exit(1)  # a thread stuck in a wait would hold the interpreter's exit
    return 1 if failed else 0


def line_of(name, r):
    if r["errors"]:
        return "; ".join(r["errors"][:3])
    if name == "many-workers":
        pages = sum(w["pages_checked"] for w in r["workers_detail"])
        return (f"4 workers x {r['jobs_per_worker']} jobs: each reported once, ok, bytes right "
                f"({pages} pages checked); sum {r['sum_gbps']:.2f} GB/s vs one alone "
                f"{r['alone_gbps']:.2f} GB/s = {r['ratio']:.2f}x (>= {RATIO_TARGET}"
                f"{' required' if r['ratio_enforced'] else ', not judged on CPU'})")
    if name == "soak":
        dev = (f"device {r['device_growth_bytes'] / MiB:+.1f} MiB"
               if r.get("device_growth_bytes") is not None else "device not sampled (CPU)")
        return (f"{r['jobs']} jobs ok, bytes right; growth from job {r['baseline_at_jobs']} to "
                f"the end: RSS {r['rss_growth_bytes'] / MiB:+.1f} MiB, {dev} (limit "
                f"{GROWTH_LIMIT // MiB} MiB)")
    if name == "sticky-fault":
        return fault_line(r)
    return ""


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
