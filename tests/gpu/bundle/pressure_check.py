"""The GPU bundle's pressure check: kvoffload with the GPU's memory nearly full, and loads that
must not queue behind stores.

What it proves.
  under-pressure      With only about 256 MiB of device memory left free (the rest taken by
                      torch.empty chunks, as an engine's KV cache and activations take it), a
                      Worker per copy mode (kernel, batch, memcpy, staged) is built and runs two
                      batches of store jobs and load jobs (K and V: two uint8 KV tensors of
                      64 KiB pages; 8 jobs of 16 blocks each way, --quick 4): nothing crashes,
                      every job is reported exactly once, every job reported ok is byte-exact
                      (host block against the GPU page, both ways), and any job that failed has
                      an error naming what failed (memory, a CUDA call, a ring...). A Worker
                      that cannot be built must raise such an error too. Per mode the device
                      memory the Worker and its first batch took is recorded; outside staged
                      mode it must stay under the 64 MiB staging buffer (only staged mode
                      allocates one), and in kernel mode the second batch must take no more
                      than 2 MiB (the upload rings are allocated once, no job allocates).
  after-free          The filler freed: the same batches in every mode, every job ok and
                      byte-exact.
  loads-behind-stores A 1 MiB load submitted right after a 256 MiB store (256 KiB pages) that
                      waits, on the GPU, for a 50 ms sleep on the compute stream (the Worker's
                      compute_stream, loads_wait_for_compute=False): the load must be reported
                      done in under 5 ms from its submission (the median of 3 timed runs,
                      --quick 2, after an untimed one; measured by polling get_finished in a
                      tight, bounded loop), before the store, while the store takes at least
                      the sleep (else the store did not wait for the compute stream: a fail).
                      Per copy mode kernel, batch, memcpy. Both jobs' bytes are checked.

HOW IT CAN FAIL. A crash or a hang (every loop is bounded in count and time; a call that never
returns ends the process past the check's guard), a wrong byte, a job reported twice or never,
a failed job whose error is empty or names nothing, a Worker that raised without a reason, any
failed job once the filler is freed, memory taken as above, a load 5 ms or slower or reported
after the store, a store that did not wait for the sleep. A fill that leaves more than 512 MiB
free makes the under-pressure part "blind" (a fail): it tested nothing.

    python3 pressure_check.py [--quick] OUT.json   on a GPU: exit 0 pass, 1 fail, 2 no CUDA
                                                   device; bounded by 30 s (--quick 15 s) on an
                                                   H100 (the whole process: 60 s)
    python3 pressure_check.py --cpu OUT.json       the host backend on CPU tensors: the batches
                                                   and their byte checks run once (no device
                                                   memory to fill: under-pressure is skipped,
                                                   said so); loads-behind-stores runs without a
                                                   compute stream or sleep, timed, not judged

Output: OUT.json ({"fill", "under_pressure": {mode: {...}}, "after_free": {...},
"loads_behind_stores": {...}, "errors", "status"}) and lines starting with "pressure " on stdout.
"""

import statistics
import sys
import time
import traceback

import numpy as np
import torch

import kvoffload as kv
from bundle_common import (KiB, MiB, Deadline, Env, err_text, hard_timeout, host_bytes, logger,
                           make_job, parser, setup, sleep_cycles_per_us, used_modes, versions,
                           wait_all, write_host, write_json)

PART = "pressure"
log = logger(PART)
GiB = 1024 * MiB
MODES = ("kernel", "batch", "memcpy", "staged")
FREE_LEFT = 256 * MiB  # what the filler leaves free
BLIND_FREE = 512 * MiB  # more than this free under pressure: the part tested nothing
STAGING_BYTES = 64 * MiB  # CudaBackendConfig::staging_bytes
RING_GROWTH = 2 * MiB  # what a kernel-mode second batch may take
ERROR_WORDS = ("memory", "cuda", "alloc", "ring", "staging", "out of", "event", "stream",
               "launch", "copy", "batch", "memcpy", "kernel", "refused", "register")
# under-pressure and after-free: K and V, 64 KiB pages, jobs of 16 blocks
P1_PAGE, P1_PER_JOB = 64 * KiB, 16
# loads-behind-stores
P2_PAGE = 256 * KiB
P2_STORE_BLOCKS = 256 * MiB // (2 * P2_PAGE)  # 512: 256 MiB over K and V
P2_LOAD_BLOCKS = 1 * MiB // (2 * P2_PAGE)  # 2: 1 MiB
P2_MODES = ("kernel", "batch", "memcpy")
LOAD_LIMIT_MS = 5.0
SLEEP_MS = 50
JOB_TIMEOUT_S = 20
GUARD_S = 60  # the whole check: past it the process ends (faulthandler), the JSON so far stays
BUDGET_S, QUICK_BUDGET_S = 28, 15  # the bundle's part: 40 s (quick 25 s), with the start
MAX_FILL_CHUNKS = 2048


def error_names_something(e):
    return bool(e) and any(w in e.lower() for w in ERROR_WORDS)


class Kv:
    """K and V ([blocks, page] uint8) and a pool layout: host block h holds K's page then V's."""

    def __init__(self, env, blocks, page, host_blocks, seed):
        self.env, self.page, self.host_blocks = env, page, host_blocks
        self.k = torch.empty(blocks, page, dtype=torch.uint8, device=env.device)
        self.v = torch.empty(blocks, page, dtype=torch.uint8, device=env.device)
        self.gen = np.random.default_rng(seed)
        self.randomize()

    def randomize(self):
        self.k.random_(0, 256)
        self.v.random_(0, 256)
        self.env.sync()

    def worker(self, mode, **kw):
        return kv.Worker(kv.WorkerConfig(
            tensors=[kv.tensor_of(self.k), kv.tensor_of(self.v)],
            groups=[[(0, self.page), (1, self.page)]], host_blocks=self.host_blocks,
            copy_mode=mode if self.env.cuda else "auto", **self.env.backend_args(), **kw))

    def garbage(self, worker, hosts):
        """Random bytes into host blocks (a copy that did nothing shows)."""
        for h in hosts:
            write_host(worker, h, self.gen.integers(0, 256, 2 * self.page, dtype=np.uint8))

    def snapshot(self):
        """K and V on the CPU (a device-to-host copy: no device memory taken)."""
        self.env.sync()
        return self.k.cpu().numpy(), self.v.cpu().numpy()

    def wrong_pairs(self, worker, pairs, snap):
        """(gpu, host) pairs whose host block is not K's page then V's (snap: snapshot())."""
        k, v = snap
        return [(g, h) for g, h in pairs
                if not np.array_equal(host_bytes(worker, h, 2 * self.page),
                                      np.concatenate([k[g], v[g]]))]


# -- under-pressure and after-free --------------------------------------------------------------


def fill(target_free, deadline):
    """torch.empty chunks until about target_free bytes are left free (bounded)."""
    torch.cuda.empty_cache()
    chunks, step = [], GiB
    oom = getattr(torch, "OutOfMemoryError", RuntimeError)
    t0 = time.time()
    free0, total = torch.cuda.mem_get_info()
    for _ in range(MAX_FILL_CHUNKS):
        if deadline.over():
            break
        free, _ = torch.cuda.mem_get_info()
        want = (free - target_free) // (2 * MiB) * (2 * MiB)
        if want < 2 * MiB:
            break
        size = min(step, want)
        try:
            chunks.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        except oom:
            if step <= 2 * MiB:
                break
            step //= 2
    free1, _ = torch.cuda.mem_get_info()
    return chunks, {"total_bytes": total, "free_before_bytes": free0, "free_after_bytes": free1,
                    "filled_bytes": sum(c.numel() for c in chunks), "chunks": len(chunks),
                    "target_free_bytes": target_free, "seconds": round(time.time() - t0, 3)}


def device_free(env):
    if not env.cuda:
        return None
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def batch(kvs, worker, first_id, jobs_each):
    """jobs_each stores (source blocks -> host), then jobs_each loads (host -> other blocks),
    each of P1_PER_JOB blocks. Returns what happened to each job and the bytes' verdict."""
    n = jobs_each * P1_PER_JOB
    src, dst, host = list(range(1, 1 + n)), list(range(1 + n, 1 + 2 * n)), list(range(n))
    out = {"jobs": 2 * jobs_each, "ok": 0, "failed": [], "unreported": [], "wrong_pages": 0,
           "checked_pages": 0}
    kvs.garbage(worker, host)
    jid = first_id
    for kind in ("store", "load"):
        jobs = {}
        for i in range(jobs_each):
            part = slice(i * P1_PER_JOB, (i + 1) * P1_PER_JOB)
            gpu = src[part] if kind == "store" else dst[part]
            try:
                worker.submit(make_job(jid, kind, gpu, host[part]))
                jobs[jid] = list(zip(gpu, host[part]))
            except Exception as e:  # noqa: BLE001 (refused at submit: a failed job, judged so)
                out["failed"].append({"job": jid, "kind": kind, "error": err_text(e),
                                      "raised": True})
            jid += 1
        got = wait_all(worker, list(jobs), JOB_TIMEOUT_S)
        snap = kvs.snapshot()
        for j, pairs in jobs.items():
            f = got.get(j)
            if f is None:
                out["unreported"].append(j)
            elif not f.ok:
                out["failed"].append({"job": j, "kind": kind, "error": f.error})
            else:
                out["ok"] += 1
                wrong = kvs.wrong_pairs(worker, pairs, snap)
                out["checked_pages"] += 2 * len(pairs)
                out["wrong_pages"] += 2 * len(wrong)  # a pair: K's page and V's
                if wrong and "first_wrong" not in out:
                    out["first_wrong"] = f"{kind} job {j}: gpu block {wrong[0][0]} / host " \
                                         f"block {wrong[0][1]}"
    return out, jid


def run_batches(env, kvs, mode, jobs_each, first_id, pressure):
    """A Worker in `mode` and two batches; the record and its problems."""
    rec, problems = {"copy_mode": mode}, []
    free0 = device_free(env)
    rec["free_at_start_bytes"] = free0
    if pressure and free0 is not None and free0 > BLIND_FREE:
        problems.append(f"blind: {free0 / MiB:.0f} MiB free, not under pressure")
    try:
        worker = kvs.worker(mode)
    except Exception as e:  # noqa: BLE001
        rec["worker"] = err_text(e)
        if not pressure or not error_names_something(str(e)):
            problems.append(f"the Worker could not be built: {rec['worker']}")
        return rec, problems, first_id
    rec["worker"] = "built"
    free1 = device_free(env)
    first, first_id = batch(kvs, worker, first_id, jobs_each)
    free2 = device_free(env)
    second, first_id = batch(kvs, worker, first_id, jobs_each)
    free3 = device_free(env)
    rec["batches"] = [first, second]
    rec["cuda_stats"] = used_modes(worker)
    del worker
    if env.cuda:
        rec["worker_device_bytes"] = free0 - free1
        rec["first_batch_device_bytes"] = free1 - free2
        rec["second_batch_device_bytes"] = free2 - free3
        taken = free0 - free2
        if mode != "staged" and taken >= STAGING_BYTES:
            problems.append(f"the {mode} Worker and its first batch took {taken / MiB:.1f} MiB "
                            f"of device memory (>= the {STAGING_BYTES // MiB} MiB staging "
                            "buffer, which only staged mode may allocate)")
        if mode == "kernel" and free2 - free3 > RING_GROWTH:
            problems.append(f"the second kernel-mode batch took {(free2 - free3) / MiB:.1f} MiB "
                            "(jobs must not allocate)")
    for b in (first, second):
        if b["wrong_pages"]:
            problems.append(f"{b['wrong_pages']} of {b['checked_pages']} pages wrong "
                            f"({b['first_wrong']})")
        if b["unreported"]:
            problems.append(f"jobs never reported: {b['unreported']}")
        for f in b["failed"]:
            if not pressure:
                problems.append(f"job {f['job']} ({f['kind']}) failed: {f['error']}")
            elif not error_names_something(f["error"]):
                problems.append(f"job {f['job']} ({f['kind']}) failed with an error naming "
                                f"nothing: {f['error']!r}")
    return rec, problems, first_id


def pressure_part(env, doc, quick, deadline):
    jobs_each = 4 if quick else 8
    n = jobs_each * P1_PER_JOB
    kvs = Kv(env, 1 + 2 * n, P1_PAGE, n, seed=5)
    next_id = 1
    phases = [("under_pressure", True), ("after_free", False)] if env.cuda else \
        [("after_free", False)]
    chunks = []
    if env.cuda:
        chunks, doc["fill"] = fill(FREE_LEFT, deadline)
        f = doc["fill"]
        log(f"fill: {f['filled_bytes'] / GiB:.1f} GiB in {f['chunks']} chunks, "
            f"{f['free_after_bytes'] / MiB:.0f} MiB left free (target {FREE_LEFT // MiB} MiB), "
            f"{f['seconds']} s")
    else:
        doc["fill"] = {"skipped": "no GPU (--cpu): no device memory to fill"}
        doc["under_pressure"] = {"skipped": doc["fill"]["skipped"]}
        log("under-pressure: SKIPPED: no GPU (--cpu), no device memory to fill; the batches "
            "run once on the host backend (after-free)")
    for phase, pressure in phases:
        doc[phase] = {}
        for mode in (MODES if env.cuda else ("host",)):
            t0 = time.time()
            try:
                deadline.check(f"{phase} {mode}")
                if not pressure:
                    kvs.randomize()
                rec, problems, next_id = run_batches(env, kvs, mode, jobs_each, next_id, pressure)
            except Exception as e:  # noqa: BLE001
                rec, problems = {"copy_mode": mode, "traceback": traceback.format_exc()}, \
                    [err_text(e)]
            rec["problems"] = problems
            rec["verdict"] = "fail" if problems else "pass"
            rec["seconds"] = round(time.time() - t0, 3)
            doc[phase][mode] = rec
            bs = rec.get("batches", [])
            failed = sum(len(b["failed"]) for b in bs)
            text = (f"{phase.replace('_', '-')} {mode}: {rec['verdict'].upper()} "
                    f"{sum(b['ok'] for b in bs)}/{sum(b['jobs'] for b in bs)} jobs ok, "
                    f"{failed} failed, {sum(b['checked_pages'] for b in bs)} pages checked")
            if rec.get("worker_device_bytes") is not None:
                text += (f", Worker took {rec['worker_device_bytes'] / MiB:.1f} MiB + first "
                         f"batch {rec['first_batch_device_bytes'] / MiB:.1f} MiB + second "
                         f"{rec['second_batch_device_bytes'] / MiB:.1f} MiB")
            if rec.get("worker") not in (None, "built"):
                text += f", Worker: {rec['worker']}"
            if failed:
                text += f" (first error: {next(f for b in bs for f in b['failed'])['error']})"
            if problems:
                text += f" [{'; '.join(problems[:3])}]"
            log(text)
        if pressure:
            del chunks[:]
            torch.cuda.empty_cache()
            doc["fill"]["free_after_release_bytes"] = torch.cuda.mem_get_info()[0]
    del kvs
    if env.cuda:
        torch.cuda.empty_cache()


# -- loads behind stores ------------------------------------------------------------------------


def poll_two(worker, load_id, store_id, t_load, limit_s):
    """Polls get_finished: tightly until the load is reported, then every 0.5 ms until the
    store is too (bounded by limit_s and a count). Returns {id: (report, perf_counter time)}."""
    seen = {}
    for _ in range(20_000_000):
        for f in worker.get_finished():
            seen[f.job] = (f, time.perf_counter())
        if store_id in seen and load_id in seen:
            break
        if time.perf_counter() - t_load > limit_s:
            break
        if load_id in seen:
            time.sleep(0.0005)
    return seen


def loads_behind_stores(env, doc, quick, deadline):
    reps = 2 if quick else 3
    store_blocks = P2_STORE_BLOCKS if env.cuda else 64  # the CPU: 32 MiB
    blocks = 1 + store_blocks + P2_LOAD_BLOCKS
    host_blocks = store_blocks + P2_LOAD_BLOCKS
    kvs = Kv(env, blocks, P2_PAGE, host_blocks, seed=9)
    src, src_host = list(range(1, 1 + store_blocks)), list(range(store_blocks))
    dst = list(range(1 + store_blocks, blocks))
    dst_host = list(range(store_blocks, host_blocks))
    compute = env.stream()
    cycles = int(sleep_cycles_per_us(compute) * SLEEP_MS * 1000) if env.cuda else 0
    doc["loads_behind_stores"] = out = {
        "store_bytes": store_blocks * 2 * P2_PAGE, "load_bytes": P2_LOAD_BLOCKS * 2 * P2_PAGE,
        "page_bytes": P2_PAGE, "sleep_ms": SLEEP_MS if env.cuda else 0, "sleep_cycles": cycles,
        "limit_ms": LOAD_LIMIT_MS, "judged": env.cuda, "reps": reps, "modes": {}}
    if not env.cuda:
        out["note"] = ("cpu: the host backend has no compute stream and no GPU sleep: the load "
                       "is timed behind a 32 MiB store, reported, not judged")
    next_id = 1_000_000
    for mode in (P2_MODES if env.cuda else ("host",)):
        rec, problems, t0 = {"runs": []}, [], time.time()
        try:
            deadline.check(f"loads-behind-stores {mode}")
            kw = {"compute_stream": compute, "loads_wait_for_compute": False} if env.cuda else {}
            w = kvs.worker(mode, **kw)
            for rep in range(1 + reps):  # the first: untimed (kernels load, rings fill)
                kvs.randomize()  # new bytes to store
                kvs.garbage(w, dst_host)
                kvs.k[dst] = 0
                kvs.v[dst] = 0
                env.sync()
                store = make_job(next_id, "store", src, src_host)
                load = make_job(next_id + 1, "load", dst, dst_host)
                next_id += 2
                if env.cuda:
                    with torch.cuda.stream(compute):
                        torch.cuda._sleep(cycles)
                t_store = time.perf_counter()
                w.submit(store)
                t_load = time.perf_counter()
                w.submit(load)
                seen = poll_two(w, load.id, store.id, t_load, JOB_TIMEOUT_S)
                run = {"warm_up": rep == 0}
                for name, job, t in (("store", store, t_store), ("load", load, t_load)):
                    f, at = seen.get(job.id, (None, None))
                    run[name] = {"ok": f.ok if f else None, "error": f.error if f else None,
                                 "ms": round((at - t) * 1000, 3) if f else None}
                    if f is None or not f.ok:
                        problems.append(f"run {rep}: the {name} was not ok: {run[name]}")
                snap = kvs.snapshot()
                loaded = [(g, h) for g, h in zip(dst, dst_host)]
                stored = list(zip(src, src_host))
                if rep < reps:  # a sample of the store's blocks; all of them in the last run
                    stored = stored[::max(1, len(stored) // 16)]
                # A load's bytes: the host block is K's page then V's, so the same comparison.
                run["wrong_pairs"] = {"load": len(kvs.wrong_pairs(w, loaded, snap)),
                                      "store": len(kvs.wrong_pairs(w, stored, snap))}
                run["store_pairs_checked"] = len(stored)
                if any(run["wrong_pairs"].values()):
                    problems.append(f"run {rep}: wrong bytes {run['wrong_pairs']}")
                if env.cuda and run["store"]["ms"] is not None and run["load"]["ms"] is not None:
                    if run["store"]["ms"] < 0.8 * SLEEP_MS:
                        problems.append(f"run {rep}: the store took {run['store']['ms']} ms, "
                                        f"less than the {SLEEP_MS} ms compute sleep: it did not "
                                        "wait for the compute stream")
                    if seen[load.id][1] >= seen[store.id][1]:
                        problems.append(f"run {rep}: the load was reported after the store")
                rec["runs"].append(run)
            rec["cuda_stats"] = used_modes(w)
            del w
            timed = [r["load"]["ms"] for r in rec["runs"][1:] if r["load"]["ms"] is not None]
            if timed:
                rec["load_ms_median"] = round(statistics.median(timed), 3)
                rec["load_ms_max"] = max(timed)
                stores = [r["store"]["ms"] for r in rec["runs"][1:] if r["store"]["ms"]]
                rec["store_ms_median"] = round(statistics.median(stores), 3) if stores else None
                if env.cuda and rec["load_ms_median"] >= LOAD_LIMIT_MS:
                    problems.append(f"the load took {rec['load_ms_median']} ms (median), not "
                                    f"under {LOAD_LIMIT_MS} ms")
        except Exception as e:  # noqa: BLE001
            problems.append(err_text(e))
            rec["traceback"] = traceback.format_exc()
        rec["problems"] = problems
        rec["verdict"] = "fail" if problems else "pass" if env.cuda else "info"
        rec["seconds"] = round(time.time() - t0, 3)
        out["modes"][mode] = rec
        log(f"loads-behind-stores {mode}: {rec['verdict'].upper()} 1 MiB load "
            f"{rec.get('load_ms_median')} ms median (max {rec.get('load_ms_max')}, limit "
            f"{LOAD_LIMIT_MS}{'' if env.cuda else ', not judged on CPU'}) behind a "
            f"{out['store_bytes'] // MiB} MiB store of {rec.get('store_ms_median')} ms"
            + (f" [{'; '.join(problems[:3])}]" if problems else ""))
    del kvs


def main(argv):
    args = parser(__doc__, "pressure.json", "CPU tensors, host backend: the bookkeeping only",
                  "fewer jobs and timed runs").parse_args(argv)
    setup()
    env = Env(args.cpu)
    if env.missing_device():
        log("FAIL: no CUDA device (use --cpu for the logic check)")
        return 2
    started = time.time()
    deadline = Deadline(QUICK_BUDGET_S if args.quick else BUDGET_S)
    doc = {"part": PART, "mode": env.mode, "quick": args.quick, **versions(),
           "device": env.device_name(), "budget_s": deadline.seconds, "errors": []}
    if not env.cuda:
        log("note: --cpu: no device memory to fill and no compute stream: the jobs, their "
            "bookkeeping and byte checks run on the host backend; the rest is skipped or "
            "reported only")
    with hard_timeout(GUARD_S):
        for name, fn in (("pressure", pressure_part), ("loads-behind-stores",
                                                       loads_behind_stores)):
            try:
                fn(env, doc, args.quick, deadline)
            except Exception as e:  # noqa: BLE001 (reported, the check fails)
                doc["errors"].append(f"{name}: {err_text(e)}")
                doc.setdefault("tracebacks", []).append(traceback.format_exc())
                log(f"{name}: FAIL {err_text(e)}")
            write_json(args.out, doc)
    recs = [r for k in ("under_pressure", "after_free") for r in doc.get(k, {}).values()
            if isinstance(r, dict) and "verdict" in r]
    recs += list(doc.get("loads_behind_stores", {}).get("modes", {}).values())
    failed = [r for r in recs if r["verdict"] == "fail"]
    doc["status"] = "fail" if failed or doc["errors"] or not recs else "pass"
    doc["seconds"] = round(time.time() - started, 2)
    write_json(args.out, doc)
    log(f"overall: {doc['status'].upper()} ({len(recs)} runs, {len(failed)} failed, "
        f"{len(doc['errors'])} errors, {doc['seconds']} s"
        f"{', cpu: bookkeeping only' if not env.cuda else ''})")
    return 0 if doc["status"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
