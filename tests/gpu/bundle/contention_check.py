"""The GPU bundle's copies-vs-compute check (issue 49, part 6): what kvoffload's copies and an
engine's compute cost each other when they run at the same time.

A bf16 GEMM loop (torch.matmul, N x N, default 8192, on a torch.cuda.Stream standing for the
engine's compute stream, timed with CUDA events) runs alone, and with kvoffload copies running
at the same time on kvoffload's own streams. The copies: per copy mode (WorkerConfig copy_mode
"kernel" and "batch"), per page size (4 KiB and 32 KiB pages; two KV tensors, K and V, so every
page is its own piece), per direction (d2h: store jobs, GPU -> pinned host pool; h2d: load
jobs), a time-boxed loop keeping a few jobs of about 8 MiB in flight, once alone and once while
the GEMM runs. Per mode/page/direction it reports the copies' GB/s alone and with the GEMM and
the GEMM's TFLOP/s alone and with the copies, and both drops (1 - with / alone).

The workers set no compute stream: a store would otherwise wait, on the GPU, for the GEMMs
queued before it, and the point is that the two run at the same time (the blocks copied are
not the GEMM's).

Bytes are verified: before every timed run the KV tensors are refilled with random bytes (new
data for stores, garbage under the destinations of loads); after it a sample of the pages of
jobs that finished is compared, host pool block against KV page, byte for byte. Jobs are
checked too: each submitted job is reported exactly once, ok, with its byte count.

It is a measurement part: it FAILS only on wrong bytes, a job reported failed, twice, or not at
all, an exception, or a timeout (the whole check past its budget; every loop is bounded in count
and time). Drops, however large, are reported, never judged.

    python3 contention_check.py OUT.json            on a GPU: about 35 s on an H100 (<= 60 s)
    python3 contention_check.py --quick OUT.json    shorter windows: about half
    python3 contention_check.py --cpu OUT.json      the same copy loops and byte checks on CPU
                                                    tensors and the host backend (no GEMM, no
                                                    streams: the GEMM is skipped, said so)

Prints one line per result, each starting with "contention ", and exits 0 (pass) or 1 (fail).
"""

import collections
import random
import sys
import time
import traceback

import numpy as np
import torch

import kvoffload as kv
from bundle_common import (KiB, MiB, Env, host_equal, logger, make_job, parser, setup,
                           versions, write_host, write_json)

PART = "contention"
log = logger(PART)


class Settings:
    def __init__(self, cpu, quick, gemm_n):
        self.cpu, self.quick = cpu, quick
        if cpu:
            self.kv_bytes, self.job_bytes, self.depth = 16 * MiB, 1 * MiB, 4
            self.window, self.budget = 0.3, 50.0
            self.modes = ["host"]
        else:
            self.kv_bytes, self.job_bytes, self.depth = 256 * MiB, 8 * MiB, 8
            self.window = 0.6 if quick else 1.5
            # Inside the bundle's part timeout (40 s, quick 20 s) with room for the start.
            self.budget = 12.0 if quick else 30.0
            self.modes = ["kernel", "batch"]
        self.pages = [4 * KiB, 32 * KiB]
        self.directions = ["d2h", "h2d"]
        self.sample_pages = 256  # (GPU page, host block) pairs compared per run
        self.gemm_n = gemm_n
        self.gemm_chunk_ms = 40.0  # matmuls per chunk: about this long
        self.gemm_ahead = 3  # chunks queued ahead of the GPU

    def as_dict(self):
        return {k: v for k, v in self.__dict__.items()}


class Gemm:
    """A bf16 matmul loop on `stream`, queued a few chunks ahead (never thousands of launches
    at once), each chunk closed by a timing event."""

    def __init__(self, n, stream, s):
        self.n, self.stream, self.s = n, stream, s
        with torch.cuda.stream(stream):
            self.a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
            self.b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
            self.c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        self.flop = 2.0 * n ** 3
        self.per_chunk = 1

    def _mm(self, count):
        for _ in range(count):
            torch.matmul(self.a, self.b, out=self.c)

    def calibrate(self):
        """Warms cuBLAS up and sizes a chunk; returns the ms of one matmul."""
        with torch.cuda.stream(self.stream):
            self._mm(3)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self._mm(10)
            end.record()
        end.synchronize()
        ms = start.elapsed_time(end) / 10
        self.per_chunk = max(1, int(self.s.gemm_chunk_ms / max(ms, 1e-3)))
        return ms

    def start(self, window_s, per_matmul_ms):
        self.chunks = max(2, int(round(window_s * 1000 / (self.per_chunk * per_matmul_ms))))
        self.events, self.checked = [], 0
        self.start_event = torch.cuda.Event(enable_timing=True)
        self.start_event.record(self.stream)
        self.top_up()

    def top_up(self):
        while len(self.events) < self.chunks and len(self.events) - self.done() < self.s.gemm_ahead:
            with torch.cuda.stream(self.stream):
                self._mm(self.per_chunk)
                e = torch.cuda.Event(enable_timing=True)
                e.record()
            self.events.append(e)

    def done(self):
        while self.checked < len(self.events) and self.events[self.checked].query():
            self.checked += 1
        return self.checked

    def finished(self):
        self.top_up()
        return self.done() >= self.chunks

    def run_alone(self, deadline):
        while not self.finished():
            if time.time() > deadline:
                raise TimeoutError("the GEMM loop ran past the budget")
            time.sleep(0.002)
        return self.result()

    def result(self):
        self.events[-1].synchronize()
        ms = self.start_event.elapsed_time(self.events[-1])
        matmuls = self.chunks * self.per_chunk
        return {"tflops": self.flop * matmuls / (ms / 1000) / 1e12, "matmuls": matmuls,
                "seconds": ms / 1000}


class Timer:
    """The GEMM's stand-in on CPU: the same loop control, against the clock."""

    def __init__(self, seconds):
        self.end = time.time() + seconds

    def top_up(self):
        pass

    def finished(self):
        return time.time() >= self.end


class Config:
    """One page size: the KV tensors (K and V, [blocks, page] uint8) and the job cycle."""

    def __init__(self, s, page, device, rng):
        self.page = page
        self.blocks = s.kv_bytes // (2 * page)  # per tensor, block 0 (the null block) unused
        self.per_job = s.job_bytes // (2 * page)
        self.cycle = (self.blocks - 1) // self.per_job
        self.host_blocks = self.cycle * self.per_job
        self.k = torch.empty(self.blocks, page, dtype=torch.uint8, device=device)
        self.v = torch.empty(self.blocks, page, dtype=torch.uint8, device=device)
        gpu = list(range(1, self.blocks))
        host = list(range(self.host_blocks))
        rng.shuffle(gpu)
        rng.shuffle(host)
        # (gpu ids, host ids) per job of the cycle: every page its own piece, neither side in
        # order.
        self.pairs = [(gpu[i * self.per_job:(i + 1) * self.per_job],
                       host[i * self.per_job:(i + 1) * self.per_job]) for i in range(self.cycle)]
        self.job_bytes = self.per_job * 2 * page

    def randomize(self):
        self.k.random_(0, 256)
        self.v.random_(0, 256)
        if self.k.is_cuda:
            torch.cuda.synchronize()

    def jobs(self, kind, first_id):
        return [make_job(first_id + i, kind, g, h) for i, (g, h) in enumerate(self.pairs)]


def copy_loop(worker, jobs, kind, job_bytes, depth, seconds, deadline, gemm=None, min_jobs=1,
              max_jobs=1_000_000):
    """Keeps `depth` jobs of the cycle `jobs` in flight until `seconds` passed (or, with
    `gemm`, until it finished), then drains. Each submission must be reported exactly once,
    ok, with job_bytes. Returns the measurement and the cycle indices of the jobs done."""
    inflight, order = {}, collections.deque()
    done_bytes, done_jobs, submitted, nxt = 0, 0, 0, 0
    completed, errors = set(), []
    hard = min(deadline, time.time() + 3 * seconds + 5)

    def collect():
        nonlocal done_bytes, done_jobs
        for f in worker.get_finished():
            idx = inflight.pop(f.job, None)
            if idx is None:
                errors.append(f"job {f.job} reported but not in flight (reported twice?)")
            elif f.kind != kind or not f.ok or f.bytes != job_bytes:
                errors.append(f"job {f.job}: kind {f.kind} ok {f.ok} bytes {f.bytes} "
                              f"(expected {kind}, {job_bytes}): {f.error}")
            else:
                done_bytes += f.bytes
                done_jobs += 1
                completed.add(idx)
        while order and order[0] not in inflight:
            order.popleft()

    t0 = time.perf_counter()
    while not errors:
        if gemm is not None:
            gemm.top_up()
        over = gemm.finished() if gemm is not None else time.perf_counter() - t0 >= seconds
        if (over and submitted >= min_jobs) or submitted >= max_jobs:
            break
        if time.time() > hard:
            errors.append(f"timeout: the copy loop ran past its bound ({submitted} jobs)")
            break
        if len(inflight) >= depth:
            worker.wait([order[0]])
            collect()
            continue
        job = jobs[nxt]
        if job.id in inflight:  # its last run not reported yet: the cycle is short
            worker.wait([job.id])
            collect()
            continue
        worker.submit(job)
        inflight[job.id] = nxt
        order.append(job.id)
        nxt = (nxt + 1) % len(jobs)
        submitted += 1
        if submitted % 4 == 0:
            collect()
    drain_end = time.time() + 10
    while inflight and time.time() < drain_end:
        worker.wait(list(inflight))
        collect()
        if inflight:
            time.sleep(0.001)
    elapsed = time.perf_counter() - t0
    if inflight:
        errors.append(f"{len(inflight)} jobs never reported (10 s after the loop)")
    return {"gbps": done_bytes / elapsed / 1e9, "bytes": done_bytes, "jobs": done_jobs,
            "submitted": submitted, "seconds": round(elapsed, 4)}, completed, errors


def verify(worker, cfg, completed, rng, count):
    """Compares `count` pages of jobs that finished: host block against the K and V pages
    (a store copies the page there, a load from there). Returns (pages, mismatched, first)."""
    if not completed:
        return 0, 0, None
    idx = sorted(completed)
    picks = []
    for _ in range(count):
        g, h = cfg.pairs[rng.choice(idx)]
        at = rng.randrange(len(g))
        picks.append((g[at], h[at]))
    ids = torch.tensor([g for g, _ in picks], device=cfg.k.device)
    kp, vp = cfg.k[ids].cpu().numpy(), cfg.v[ids].cpu().numpy()
    bad, first = 0, None
    for i, (g, h) in enumerate(picks):
        if not host_equal(worker, h, np.concatenate([kp[i], vp[i]])):
            bad += 1
            first = first or f"gpu block {g} / host block {h}"
    return 2 * len(picks), 2 * bad, first


def fill_host(worker, cfg, np_rng):
    """Random bytes in the pool's blocks, so a load from the wrong block shows."""
    data = np.frombuffer(np_rng.bytes(cfg.host_blocks * 2 * cfg.page), dtype=np.uint8)
    data = data.reshape(cfg.host_blocks, 2 * cfg.page)
    for h in range(cfg.host_blocks):
        write_host(worker, h, data[h])


def run(s, results):
    env = Env(s.cpu)
    cuda, device = env.cuda, env.device
    rng = random.Random(49)
    np_rng = np.random.default_rng(49)
    deadline = time.time() + s.budget
    compute = env.stream()
    gemm, per_mm = None, None
    alone = []
    if cuda:
        gemm = Gemm(s.gemm_n, compute, s)
        per_mm = gemm.calibrate()
        gemm.start(s.window, per_mm)
        alone.append(gemm.run_alone(deadline))
        results["gemm"] = {"n": s.gemm_n, "matmul_ms": round(per_mm, 4),
                           "matmuls_per_chunk": gemm.per_chunk, "alone": alone}
        log(f"gemm alone: {alone[0]['tflops']:.1f} TFLOP/s (bf16 {s.gemm_n}x{s.gemm_n}, "
            f"{per_mm:.3f} ms per matmul)")
    else:
        results["gemm"] = {"skipped": "no GPU (--cpu): the GEMM is not timed; the copy loops "
                                      "run against a timer instead"}
        log("gemm skipped: no GPU (--cpu); the copies' 'with' runs use a timer instead")
    next_id = 1
    for page in s.pages:
        cfg = Config(s, page, device, rng)
        for mode in s.modes:
            if time.time() > deadline:
                results["errors"].append(f"timeout: budget of {s.budget} s spent before "
                                         f"{mode} {page // KiB} KiB")
                return
            worker = kv.Worker(kv.WorkerConfig(
                tensors=[kv.tensor_of(cfg.k), kv.tensor_of(cfg.v)],
                groups=[[(0, page), (1, page)]], host_blocks=cfg.host_blocks,
                copy_mode=mode if cuda else "auto", **env.backend_args()))
            fill_host(worker, cfg, np_rng)
            stores, loads = cfg.jobs("store", next_id), cfg.jobs("load", next_id + cfg.cycle)
            next_id += 2 * cfg.cycle
            # Warm-up, untimed: the first submissions allocate rings and load the kernels.
            for jobs, kind in ((stores, "store"), (loads, "load")):
                _, _, err = copy_loop(worker, jobs[:2], kind, cfg.job_bytes, 2, 0.0, deadline,
                                      min_jobs=2, max_jobs=2)
                if err:
                    raise RuntimeError(f"warm-up {mode} {kind}: {err[0]}")
            for direction in s.directions:
                kind, jobs = ("store", stores) if direction == "d2h" else ("load", loads)
                before = worker.cuda_stats() if cuda else None
                row = {"mode": mode, "page_bytes": page, "direction": direction, "kind": kind,
                       "job_bytes": cfg.job_bytes, "errors": []}
                checked = mismatched = 0
                for phase in ("alone", "with_gemm"):
                    cfg.randomize()
                    g = None
                    if phase == "with_gemm":
                        if cuda:
                            gemm.start(s.window, per_mm)
                            g = gemm
                        else:
                            g = Timer(s.window)
                    m, completed, err = copy_loop(worker, jobs, kind, cfg.job_bytes, s.depth,
                                                  s.window, deadline, gemm=g)
                    if cuda and g is not None:
                        m["gemm"] = g.result()
                    if not cuda and g is not None:
                        m["gemm"] = None
                    c, bad, first = verify(worker, cfg, completed, rng, s.sample_pages)
                    checked, mismatched = checked + c, mismatched + bad
                    if bad:
                        err.append(f"{bad} of {c} pages wrong (first: {first})")
                    row[phase] = m
                    row["errors"] += [f"{phase}: {e}" for e in err]
                    if err:
                        break
                row["pages_checked"], row["mismatched"] = checked, mismatched
                if cuda:
                    after = worker.cuda_stats()
                    row["cuda_stats_delta"] = {k: after[k] - before[k] for k in after}
                    used = row["cuda_stats_delta"].get(f"jobs_{mode}", 0)
                    row["mode_used"] = used > 0
                    if not row["mode_used"]:
                        row["warning"] = f"no job ran in {mode} mode: {row['cuda_stats_delta']}"
                a, w = row.get("alone"), row.get("with_gemm")
                if a and w and a["gbps"] > 0:
                    row["copy_drop"] = round(1 - w["gbps"] / a["gbps"], 4)
                if cuda and w and w.get("gemm"):
                    ga = alone[-1]["tflops"]
                    row["gemm_alone_tflops"] = round(ga, 2)
                    row["gemm_with_copies_tflops"] = round(w["gemm"]["tflops"], 2)
                    row["gemm_drop"] = round(1 - w["gemm"]["tflops"] / ga, 4)
                results["results"].append(row)
                label = f"{mode} {page // KiB}KiB {direction}"
                if row["errors"]:
                    log(f"{label}: FAIL {row['errors'][0]}")
                    results["errors"] += [f"{label}: {e}" for e in row["errors"]]
                    continue
                text = (f"{label}: copies {a['gbps']:.2f} -> {w['gbps']:.2f} GB/s "
                        f"(drop {row['copy_drop']:+.1%})")
                if cuda:
                    text += (f", gemm {row['gemm_alone_tflops']:.1f} -> "
                             f"{row['gemm_with_copies_tflops']:.1f} TFLOP/s "
                             f"(drop {row['gemm_drop']:+.1%})")
                else:
                    text += " (the 'with' run against a timer: no GEMM on CPU)"
                text += f", bytes ok ({checked} pages)"
                if row.get("warning"):
                    text += f" WARNING {row['warning']}"
                log(text)
            del stores, loads, worker
        del cfg
        if cuda:
            torch.cuda.empty_cache()
    if cuda and time.time() < deadline:
        gemm.start(s.window, per_mm)
        alone.append(gemm.run_alone(deadline))
        log(f"gemm alone again at the end: {alone[-1]['tflops']:.1f} TFLOP/s")


def main(argv):
    p = parser(__doc__, "contention.json", "CPU tensors, host backend, no GEMM",
               "shorter windows (about half the time)", raw=True)
    p.add_argument("--gemm-n", type=int, default=8192, help="GEMM size N (N x N bf16)")
    args = p.parse_args(argv)
    setup()
    env = Env(args.cpu)
    start = time.time()
    results = {"part": PART, "mode": env.mode, "quick": args.quick, **versions(),
               "results": [], "errors": []}
    s = Settings(args.cpu, args.quick, args.gemm_n)
    results["settings"] = s.as_dict()
    try:
        if env.missing_device():
            raise RuntimeError("no CUDA device visible to torch (use --cpu off a GPU)")
        results["device"] = env.device_name()
        run(s, results)
    except Exception as e:  # noqa: BLE001 (reported, the part fails)
        results["errors"].append(f"{type(e).__name__}: {e}")
        results["traceback"] = traceback.format_exc()
        log(f"error: {type(e).__name__}: {e}")
    results["seconds"] = round(time.time() - start, 2)
    results["status"] = "fail" if results["errors"] else "pass"
    write_json(args.out, results)
    log(f"{results['status'].upper()} in {results['seconds']:.1f} s: "
        f"{len(results['results'])} runs, {len(results['errors'])} errors "
        "(a measurement: fails only on wrong bytes, failed jobs, errors or timeouts)")
    return 0 if results["status"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
