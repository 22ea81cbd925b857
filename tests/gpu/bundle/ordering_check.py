"""The GPU bundle's ordering check (v2): kvoffload's copies wait for the engine's forward pass.

What it proves. A store must copy the KV bytes a forward pass writes, not what the blocks held
before; a load must not overwrite blocks a queued forward pass still reads or writes. kvoffload
promises this without any host synchronization: with the compute stream set
(WorkerConfig.compute_stream / Worker.set_compute_stream), each job waits on the GPU for the
work queued on that stream when it is submitted (a deferred store, started later by
Worker.start_step, for at least the work queued up to its submission), and after a stream
switch also for the old stream's work up to the switch.

How each case runs (nothing in it synchronizes the host with the GPU). Every tensor it needs
(block indices, the values to write, a scratch tensor) is made and the GPU synchronized first.
Then, on stream S1, the "forward pass": torch.cuda._sleep (about 25 ms) followed by the KV
writes (index_copy_ of the prepared values into the blocks). Right away the job is submitted
through kvoffload.Worker (built from kvoffload.Job objects, one group, 8 bf16 tensors of
32 KiB pages), in each copy mode (WorkerConfig copy_mode "kernel", "batch", "memcpy"; the
modes the jobs really ran in are checked with Worker.cuda_stats, so a silent fallback fails):

  store  deferred=False  submit at once
  store  deferred=True   defer_stores: submit queues it, Worker.start_step starts it
  switched=True          the worker's compute stream moves to an idle second stream S2 after
                         the forward pass is queued: for a deferred store between submit and
                         start_step, for an immediate store or a load before submit. The job
                         must still wait for S1 (the backend remembers the old stream).
  load                   the forward pass reads the destination blocks (into a scratch tensor)
                         and then writes other values into them; the load (submitted right
                         away, loads_wait_for_compute=True) must land after both: the scratch
                         holds the old bytes and the blocks end up holding the loaded bytes.

Stores are checked on the host side (Worker.host_block against the expected bytes, per 32 KiB
page); loads with torch.equal of the GPU blocks and of the scratch tensor. Every case is repeated
(3 times; with --quick once, behind half the sleep).

HOW IT CAN FAIL. Each case has a CONTROL run the same way without the wait: stores with no
compute stream (Worker.set_compute_stream(None) before the forward pass; the switched control
still moves to S2, which is idle), loads on a worker built with loads_wait_for_compute=False.
A control must see the race (mismatches > 0: the store copies the old bytes, the load lands
before the forward pass reads). A control that sees none makes the case FAIL as "blind": the
check could not have seen the bug it is for. A real case with any mismatching page FAILs.
(The Python API has no switch for the backend's unsafe_skip_compute_wait_for_testing, so the
controls turn the wait off with the public API instead.)

    python3 ordering_check.py [--quick] OUT.json     on a GPU: exit 0 only if every case passes
    python3 ordering_check.py --cpu OUT.json         the same cases on CPU tensors and the host
                                                     backend (no streams, no sleeps): checks the
                                                     script's logic and bookkeeping only; the
                                                     controls cannot race there (not meaningful):
                                                     each emulates its race by copying before
                                                     the forward pass, which shows the
                                                     comparison would see one

Output: OUT.json ({"cases": [{mode, kind, deferred, switched, mismatches, control, verdict,
...}], "status", ...}) and one line per case starting with "ordering " on stdout.
"""

import sys
import time
import traceback

import torch

import kvoffload as kv
from bundle_common import (Env, hard_timeout, host_bytes, make_job, mode_problem, parser, setup,
                           used_modes, versions, wait_for, write_host, write_json)

MODES = ("kernel", "batch", "memcpy")
TENSORS = 8  # 4 layers, K and V apart
BLOCK, HEADS, HEAD_DIM = 16, 8, 128  # bf16: 32 KiB pages
ELEMS = BLOCK * HEADS * HEAD_DIM
NUM_BLOCKS = 64
HOST_BLOCKS = 64
PER_CASE = 16  # blocks per job
SLEEP_CYCLES = 50_000_000  # about 25 ms at 2 GHz: the writes land long after the submission
CASE_TIMEOUT_S = 10  # one job
CASE_GUARD_S = 45  # one case, every repetition and its control


class Rig:
    def __init__(self, env):
        self.env, self.cuda, self.device = env, env.cuda, env.device
        self.tensors = [torch.zeros(NUM_BLOCKS, BLOCK, HEADS, HEAD_DIM, dtype=torch.bfloat16,
                                    device=self.device) for _ in range(TENSORS)]
        self.page = ELEMS * 2
        self.streams = (env.stream(), env.stream())
        self.base = torch.arange(ELEMS, device=self.device, dtype=torch.int64) * 5
        self.next_job = 1
        self.serial = 0

    def sync(self):
        self.env.sync()

    def worker(self, mode, deferred, loads_wait=True):
        return kv.Worker(kv.WorkerConfig(
            tensors=[kv.tensor_of(t) for t in self.tensors],
            groups=[[(k, self.page) for k in range(TENSORS)]],
            host_blocks=HOST_BLOCKS, block_size_factor=1,
            backend=self.env.backend, threads=1, copy_mode=mode,
            defer_stores=deferred, loads_wait_for_compute=loads_wait,
            compute_stream=self.streams[0]))

    def pattern(self, seed, n):
        """[TENSORS, n, BLOCK, HEADS, HEAD_DIM] bf16, integers in [-128, 127] (exact); two
        seeds that differ by less than 36 differ in every element."""
        k = torch.arange(TENSORS, device=self.device).view(TENSORS, 1, 1)
        i = torch.arange(n, device=self.device).view(1, n, 1)
        v = (self.base.view(1, 1, ELEMS) + seed * 7 + k * 13 + i * 31) % 256 - 128
        return v.to(torch.bfloat16).view(TENSORS, n, BLOCK, HEADS, HEAD_DIM)

    def case_blocks(self):
        """GPU and host blocks for the next case, and three seeds (old, new, mid)."""
        s = self.serial
        self.serial += 1
        first = 1 + (s % 3) * PER_CASE  # block 0 unused (the engine's null block)
        gpu = list(range(first, first + PER_CASE))
        hfirst = (s % (HOST_BLOCKS // PER_CASE)) * PER_CASE
        host = list(range(hfirst, hfirst + PER_CASE))
        return gpu, host, (4 * s) % 200, (4 * s + 1) % 200, (4 * s + 2) % 200

    def job(self, kind, gpu, host):
        jid = self.next_job
        self.next_job += 1
        return make_job(jid, kind, gpu, host, request_id=f"ordering-{jid}")

    def host_pages(self, worker, h):
        b = host_bytes(worker, h, TENSORS * self.page)
        return torch.from_numpy(b).view(TENSORS, self.page)


def as_pages(vals):
    """[TENSORS, n, ...] bf16 -> [TENSORS, n, page] uint8 on the CPU."""
    t, n = vals.shape[0], vals.shape[1]
    return vals.reshape(t, n, ELEMS).cpu().view(torch.uint8)


def forward(rig, fn):
    """The forward pass: a long GPU sleep on S1, then fn() (queued behind it)."""
    if rig.cuda:
        with torch.cuda.stream(rig.streams[0]):
            torch.cuda._sleep(rig.sleep_cycles)
            fn()
    else:
        fn()


def store_case(rig, worker, deferred, switched, control):
    gpu, host, s_old, s_new, _ = rig.case_blocks()
    n = len(gpu)
    idx = torch.tensor(gpu, device=rig.device)
    old, new = rig.pattern(s_old, n), rig.pattern(s_new, n)
    for k, t in enumerate(rig.tensors):
        t.index_copy_(0, idx, old[k])
    rig.sync()  # everything above is done before the case starts
    if rig.cuda:
        worker.set_compute_stream(None if control else rig.streams[0])

    def writes():
        for k, t in enumerate(rig.tensors):
            t.index_copy_(0, idx, new[k])

    # On the CPU there is no stream to race on: the control emulates the race by running the
    # forward pass after the copy (it checks this script's comparison, not the library).
    emulate = control and not rig.cuda
    if not emulate:
        forward(rig, writes)
    job = rig.job("store", gpu, host)
    if switched and rig.cuda and not deferred:
        worker.set_compute_stream(rig.streams[1])
    worker.submit(job)
    if switched and rig.cuda and deferred:
        worker.set_compute_stream(rig.streams[1])
    if deferred:
        worker.start_step()
    f = wait_for(worker, job.id, CASE_TIMEOUT_S)
    if not f.ok:
        raise RuntimeError(f"store job failed: {f.error}")
    if emulate:
        forward(rig, writes)
    rig.sync()
    want = as_pages(new)
    bad = 0
    for i, h in enumerate(host):
        got = rig.host_pages(worker, h)
        bad += sum(not torch.equal(got[k], want[k, i]) for k in range(TENSORS))
    if rig.cuda:
        worker.set_compute_stream(rig.streams[0])
    return bad, n * TENSORS


def load_case(rig, worker, switched, control=False):
    """The forward pass reads the destination blocks into scratch, then writes `mid` into
    them; the load of `new` must land after both."""
    gpu, host, s_old, s_new, s_mid = rig.case_blocks()
    n = len(gpu)
    idx = torch.tensor(gpu, device=rig.device)
    old, new, mid = rig.pattern(s_old, n), rig.pattern(s_new, n), rig.pattern(s_mid, n)
    scratch = torch.empty_like(old)
    for k, t in enumerate(rig.tensors):
        t.index_copy_(0, idx, old[k])
    want_new = as_pages(new)
    for i, h in enumerate(host):
        write_host(worker, h, want_new[:, i])
    rig.sync()
    if rig.cuda:
        worker.set_compute_stream(rig.streams[0])

    def read_then_write():
        for k, t in enumerate(rig.tensors):
            torch.index_select(t, 0, idx, out=scratch[k])
            t.index_copy_(0, idx, mid[k])

    emulate = control and not rig.cuda  # as in store_case
    if not emulate:
        forward(rig, read_then_write)
    if switched and rig.cuda:
        worker.set_compute_stream(rig.streams[1])
    job = rig.job("load", gpu, host)
    worker.submit(job)
    f = wait_for(worker, job.id, CASE_TIMEOUT_S)
    if not f.ok:
        raise RuntimeError(f"load job failed: {f.error}")
    if emulate:
        forward(rig, read_then_write)
    rig.sync()
    bad = 0
    for k, t in enumerate(rig.tensors):
        for i, b in enumerate(gpu):
            bad += not torch.equal(scratch[k, i], old[k, i])  # the forward read the old bytes
            bad += not torch.equal(t[b], new[k, i])  # the load landed last
    if rig.cuda:
        worker.set_compute_stream(rig.streams[0])
    return bad, 2 * n * TENSORS


def one_case(rig, kind, deferred, switched, reps, workers, load_ctrl):
    """Every repetition of a case and of its control: the record's verdict fields."""
    real, ctrl, pages = [], [], 0
    for _ in range(reps):
        if kind == "store":
            w = workers[deferred]
            bad, pages = store_case(rig, w, deferred, switched, False)
            real.append(bad)
            ctrl.append(store_case(rig, w, deferred, switched, True)[0])
        else:
            bad, pages = load_case(rig, workers[False], switched)
            real.append(bad)
            ctrl.append(load_case(rig, load_ctrl, switched, True)[0])
    rec = {"mismatches": sum(real), "pages_per_rep": pages, "reps": reps, "per_rep": real,
           "control": {"how": ("no compute stream" if kind == "store"
                               else "loads_wait_for_compute=False"),
                       "mismatches": sum(ctrl), "per_rep": ctrl,
                       "race_observed": sum(ctrl) > 0}}
    if not rig.cuda:
        rec["control"]["how"] = "emulated: the copy first, the forward pass after"
        rec["note"] = ("cpu: bookkeeping only; the control is an emulated race "
                       "(not meaningful for the library)")
    rec["verdict"] = "fail" if rec["mismatches"] else "blind" if not sum(ctrl) else "pass"
    return rec


def run_mode(rig, mode, reps, emit):
    results = []
    workers = {d: rig.worker(mode, d) for d in (False, True)}
    load_ctrl = rig.worker(mode, False, loads_wait=False)
    try:
        cases = [("store", d, s) for d in (False, True) for s in (False, True)]
        cases += [("load", False, s) for s in (False, True)]
        for kind, deferred, switched in cases:
            start = time.time()
            rec = {"mode": mode, "kind": kind, "deferred": deferred, "switched": switched}
            try:
                # A call into the library that never returns ends the process (the JSON
                # written after each mode survives).
                with hard_timeout(CASE_GUARD_S):
                    rec.update(one_case(rig, kind, deferred, switched, reps, workers,
                                        load_ctrl))
            except Exception as e:  # noqa: BLE001 (report the case, go on)
                rec.update(verdict="fail", error=f"{type(e).__name__}: {e}",
                           traceback=traceback.format_exc())
                rig.sync()
            rec["seconds"] = round(time.time() - start, 3)
            results.append(rec)
            emit(rec)
        every = [workers[False], workers[True], load_ctrl]
        stats = {"stores": [used_modes(w) for w in every[:2]],
                 "load_control": used_modes(load_ctrl)}
        problems = [p for p in (mode_problem(w.cuda_stats(), mode) for w in every
                                if rig.cuda) if p]
    finally:
        del workers, load_ctrl
    return results, stats, problems


def main(argv):
    args = parser(__doc__, "ordering.json", "CPU tensors, host backend: logic only",
                  "one repetition, a shorter sleep").parse_args(argv)
    setup()
    env = Env(args.cpu)
    cuda = env.cuda
    if env.missing_device():
        print("ordering FAIL: no CUDA device (use --cpu for the logic check)", flush=True)
        return 2
    started = time.time()
    rig = Rig(env)
    rig.sleep_cycles = SLEEP_CYCLES // (2 if args.quick else 1)
    reps = 1 if args.quick else 3
    doc = {"mode": env.mode, "quick": args.quick, **versions(), "device": env.device_name(),
           "sleep_cycles": rig.sleep_cycles if cuda else 0, "reps": reps,
           "pages": f"{TENSORS} bf16 tensors of {rig.page} B pages, {PER_CASE} blocks a job",
           "controls_meaningful": cuda, "cases": [], "modes": {}}
    if not cuda:
        print("ordering note: --cpu runs the host backend with no streams: only the bookkeeping "
              "is checked; the controls cannot race and are not meaningful (each emulates its "
              "race by copying before the forward pass, which shows the comparison sees it)",
              flush=True)

    def emit(rec):
        line = (f"ordering {rec['mode']:6s} {rec['kind']:5s} deferred={int(rec['deferred'])} "
                f"switched={int(rec['switched'])}: {rec['verdict'].upper()} mismatches "
                f"{rec.get('mismatches')} control {rec.get('control', {}).get('mismatches')}")
        if "error" in rec:
            line += f" ({rec['error']})"
        print(line, flush=True)

    for mode in MODES:
        try:
            results, stats, problems = run_mode(rig, mode, reps, emit)
        except Exception as e:  # noqa: BLE001 (a worker that cannot start: the mode fails)
            results, stats, problems = [], None, [f"{type(e).__name__}: {e}"]
        doc["cases"] += results
        doc["modes"][mode] = {"cuda_stats": stats, "problems": problems}
        for p in problems:
            print(f"ordering {mode}: FAIL {p}", flush=True)
        write_json(args.out, doc)
    failed = [c for c in doc["cases"] if c["verdict"] != "pass"]
    failed += [p for m in doc["modes"].values() for p in m["problems"]]
    blind = [c for c in doc["cases"] if c["verdict"] == "blind"]
    doc["status"] = "pass" if not failed and doc["cases"] else "fail"
    doc["seconds"] = round(time.time() - started, 2)
    write_json(args.out, doc)
    print(f"ordering overall: {doc['status'].upper()} ({len(doc['cases'])} cases, "
          f"{len(failed)} failed, {len(blind)} blind, {doc['seconds']} s"
          f"{', cpu: controls not meaningful' if not cuda else ''})", flush=True)
    return 0 if doc["status"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
