"""The sticky-fault part of workers_check.py (issue 49, part 8), apart: not a check by itself.

workers_check.py runs it in a subprocess of its own (workers_check.py --fault-child OUT.json,
which calls fault_child here): a kernel-mode store whose KV tensor is host memory the GPU cannot
read (pageable memory, never registered; where the GPU can read that, HMM or ATS, a PROT_NONE
mapping) must fail, and so must every job after it, on that Worker and on a good one (a CUDA
illegal-address fault poisons the context): none is ever reported ok. The jobs before the fault
must be ok. A Worker that refuses the bad tensor when it is built (kvoffload checks that KV
tensors are memory of its device) leaves no fault to test: the part is then skipped, said so.
"""

import ctypes
import gc
import json
import mmap
import os
import subprocess
import sys
import threading
import time

import numpy as np
import torch

import kvoffload as kv
from bundle_common import KiB, make_job, write_json


FAULT_PAGE = 32 * KiB


def prot_none_region(nbytes):
    """An address range that is reserved (never reused by malloc) but readable by nobody."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000)
    addr = libc.mmap(None, nbytes, 0, flags, -1, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap(PROT_NONE) failed")
    return addr


def fault_child(out_path, cpu):
    """Runs in its own process: the jobs before the fault, the fault, the jobs after it.
    Writes what it saw to out_path after every stage (a hang leaves the stage it reached)."""
    res = {"stage": "start", "events": []}

    def save(stage):
        res["stage"] = stage
        write_json(out_path, res)

    device = "cpu" if cpu else "cuda"
    blocks, page = 65, FAULT_PAGE
    k = torch.randint(0, 256, (blocks, page), dtype=torch.uint8, device=device)
    v = torch.randint(0, 256, (blocks, page), dtype=torch.uint8, device=device)
    backend = dict(backend="host", threads=1) if cpu else dict(backend="cuda", copy_mode="kernel")
    good = kv.Worker(kv.WorkerConfig(tensors=[kv.tensor_of(k), kv.tensor_of(v)],
                                     groups=[[(0, page), (1, page)]], host_blocks=16, **backend))
    if not cpu:
        torch.cuda.synchronize()
    next_id = [1]

    def run_job(worker, kind, gpu_ids, host_ids):
        """Submits, waits, polls (bounded): what was reported for this job."""
        jid = next_id[0]
        next_id[0] += 1
        ev = {"job": jid, "kind": kind, "worker": "good" if worker is good else "bad"}
        try:
            worker.submit(make_job(jid, kind, gpu_ids, host_ids))
        except Exception as e:  # noqa: BLE001 (a refused submission is a failed job)
            ev.update(reported=False, ok=False, raised=f"{type(e).__name__}: {e}")
            res["events"].append(ev)
            return ev
        reports = []
        end = time.time() + 10
        while time.time() < end:
            try:
                worker.wait([jid])
                reports += [f for f in worker.get_finished() if f.job == jid]
            except Exception as e:  # noqa: BLE001
                ev["raised"] = f"{type(e).__name__}: {e}"
                break
            if reports:
                break
            time.sleep(0.01)
        ev["reports"] = len(reports)
        ev["reported"] = bool(reports)
        ev["ok"] = any(f.ok for f in reports)
        ev["error"] = reports[0].error if reports else None
        res["events"].append(ev)
        return ev

    # Before: a store and a load on the good Worker, both ok, the bytes right.
    before = [run_job(good, "store", list(range(1, 9)), list(range(8))),
              run_job(good, "load", list(range(9, 17)), list(range(8)))]
    same = bool(torch.equal(k[9:17], k[1:9]) and torch.equal(v[9:17], v[1:9]))
    res["before"] = {"ok": all(e["ok"] for e in before), "bytes_right": same}
    save("before")
    if cpu:
        res["fault"] = {"skipped": "no GPU (--cpu): the host backend has no device context to "
                                   "poison (a bad address would kill the process with SIGSEGV)"}
        save("done")
        return
    fault = {"variants": []}
    res["fault"] = fault
    keep = []  # the bad memory lives as long as the process
    for variant in ("pageable", "prot_none"):
        if variant == "pageable":
            t = torch.full((16, page), 0x5A, dtype=torch.uint8)  # CPU memory, never registered
            keep.append(t)
            base = t.data_ptr()
        else:
            base = prot_none_region(16 * page)
        row = {"variant": variant, "base": hex(base)}
        fault["variants"].append(row)
        try:
            bad = kv.Worker(kv.WorkerConfig(
                tensors=[kv.KvTensor(base=base, num_blocks=16, page_bytes=page,
                                     block_stride_bytes=page)],
                groups=[[(0, page)]], host_blocks=8, backend="cuda", copy_mode="kernel"))
        except Exception as e:  # noqa: BLE001 (kvoffload refused the tensor: no job to run)
            row["refused"] = f"Worker: {type(e).__name__}: {e}"
            save(f"fault-{variant}")
            continue
        keep.append(bad)
        save(f"fault-{variant}-submitting")
        ev = run_job(bad, "store", [1, 2, 3, 4], [0, 1, 2, 3])
        row.update(job=ev["job"], ok=ev["ok"], reported=ev["reported"], error=ev.get("error"),
                   raised=ev.get("raised"), cuda_stats=bad.cuda_stats())
        if ev["ok"] and variant == "pageable":
            # The GPU read pageable memory (HMM or ATS): legal here, so no fault. Were the
            # bytes those of the tensor?
            row["gpu_reads_pageable_memory"] = True
            row["bytes_right"] = bool(all(
                np.array_equal(bad.host_block(h)[:page], np.full(page, 0x5A, np.uint8))
                for h in range(4)))
        save(f"fault-{variant}")
        if ev["ok"]:
            continue
        # Failed. A device fault poisons the context (torch's next synchronization raises too);
        # a job kvoffload refused or failed by itself does not.
        try:
            torch.cuda.synchronize()
            row["context"] = "healthy: torch.cuda.synchronize() returned"
        except Exception as e:  # noqa: BLE001
            row["context"] = f"poisoned: {type(e).__name__}: {str(e).splitlines()[0]}"
        save(f"fault-{variant}-probed")
        if row["context"].startswith("poisoned"):
            fault["faulting_variant"] = variant
            fault["faulting_job"] = ev["job"]
            break
    if "faulting_variant" not in fault:
        save("no-fault")
        return
    # After: every job fails, on the good Worker and on a Worker made after the fault.
    after = []
    for i in range(6):
        kind = "store" if i % 2 == 0 else "load"
        gpu = list(range(17 + 8 * (i // 2), 25 + 8 * (i // 2)))
        after.append(run_job(good, kind, gpu, list(range(8, 16))))
        save(f"after-{i}")
    try:
        late = kv.Worker(kv.WorkerConfig(tensors=[kv.tensor_of(k), kv.tensor_of(v)],
                                         groups=[[(0, page), (1, page)]], host_blocks=16,
                                         backend="cuda", copy_mode="kernel"))
        keep.append(late)
        fault["worker_after_fault"] = "constructed"
        after.append(run_job(late, "store", list(range(1, 9)), list(range(8))))
    except Exception as e:  # noqa: BLE001
        fault["worker_after_fault"] = f"raised {type(e).__name__}: {e}"
    fault["after"] = {"jobs": len(after), "ok": sum(1 for e in after if e["ok"]),
                      "reported_failed": sum(1 for e in after if e["reported"] and not e["ok"]),
                      "raised_at_submit": sum(1 for e in after if "raised" in e)}
    try:
        torch.cuda.synchronize()
        fault["torch_after_fault"] = "torch.cuda.synchronize() returned (no sticky error?)"
    except Exception as e:  # noqa: BLE001
        fault["torch_after_fault"] = f"raised {type(e).__name__}: {str(e).splitlines()[0]}"
    save("after")
    # Teardown (bounded): destroying Workers on a poisoned context must not hang.
    started = time.time()

    def teardown():
        keep.clear()
        nonlocal good
        good = None
        gc.collect()

    th = threading.Thread(target=teardown, daemon=True)
    th.start()
    th.join(5)
    res["teardown"] = ("returned in %.2f s" % (time.time() - started) if not th.is_alive()
                       else "still running after 5 s (left behind)")
    save("done")


def sticky_fault(cfg, deadline, enabled, script):
    """Runs `script` --fault-child in a subprocess (bounded by deadline) and judges what it
    wrote: the part's result, its "errors" the verdict."""
    out = {}
    if not enabled:
        out["skipped"] = "--no-fault"
        out["errors"] = []
        return out
    path = os.path.join(cfg["tmp"], "fault.json")
    cmd = [sys.executable, script, "--fault-child", path]
    if not cfg["cuda"]:
        cmd.append("--cpu")
    timeout = max(5, deadline - time.time())
    started = time.time()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout, errors="replace")
        out["returncode"] = p.returncode
        tail = p.stdout
    except subprocess.TimeoutExpired as e:
        out["returncode"] = "timeout"
        tail = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode(errors="replace")
    out["seconds"] = round(time.time() - started, 2)
    out["output_tail"] = tail.strip().splitlines()[-15:]
    child = None
    if os.path.exists(path):
        with open(path) as f:
            child = json.load(f)
    out["child"] = child
    out["errors"] = judge_fault(out, child, cfg["cuda"])
    return out


def judge_fault(out, child, cuda):
    """The sticky-fault verdict from what the child wrote: a list of errors (out gets
    "skipped" or "warning" where they apply)."""
    errors = []
    if child is None:
        errors.append(f"the child wrote nothing (exit {out['returncode']})")
    elif not child.get("before", {}).get("ok") or not child["before"].get("bytes_right"):
        errors.append(f"the jobs before the fault were not ok: {child.get('before')}")
    elif not cuda:
        out["skipped"] = child.get("fault", {}).get("skipped", "no GPU")
        if child.get("stage") != "done":
            errors.append(f"the child stopped at stage {child.get('stage')}")
    else:
        fault = child.get("fault", {})
        if child.get("stage") == "no-fault":
            variants = fault.get("variants", [])
            if any(v.get("refused") or (v.get("ok") is False and
                                        str(v.get("context", "")).startswith("healthy"))
                   for v in variants):
                # kvoffload turned the bad tensor away (at construction, or failed the job
                # without touching the device): better than a fault, and nothing to test.
                out["skipped"] = ("no sticky fault to test: kvoffload refused the bad KV tensor "
                                  f"cleanly ({variants})")
            else:
                errors.append("no fault: the GPU read both the pageable and the PROT_NONE "
                              f"memory ({variants})")
        elif "faulting_variant" not in fault:
            errors.append(f"the child stopped at stage {child.get('stage')} (exit "
                          f"{out['returncode']}): the faulting job was never reported")
        else:
            row = next(v for v in fault["variants"] if v["variant"] == fault["faulting_variant"])
            if not row.get("reported") and not row.get("raised"):
                errors.append(f"the faulting job {row['job']} was never reported (failed)")
            after = fault.get("after")
            if after is None:
                errors.append(f"the child stopped at stage {child.get('stage')} (exit "
                              f"{out['returncode']}) before the jobs after the fault finished")
            else:
                ev_after = [e for e in child["events"] if e["job"] > fault["faulting_job"]]
                ok_after = [e["job"] for e in ev_after if e["ok"]]
                if ok_after:
                    errors.append(f"jobs reported ok after the fault: {ok_after}")
                silent = [e["job"] for e in ev_after if not e["reported"] and "raised" not in e]
                if silent:
                    errors.append(f"jobs after the fault never reported: {silent}")
                if not ev_after:
                    errors.append("no job ran after the fault")
            if child.get("stage") != "done":
                out["warning"] = (f"the child did not finish its teardown (stage "
                                  f"{child.get('stage')}, exit {out['returncode']})")
            elif "still running" in str(child.get("teardown")):
                out["warning"] = f"teardown after the fault: {child['teardown']}"
    return errors


def fault_line(r):
    """The part's summary line (after "sticky-fault: STATUS in N s")."""
    if "skipped" in r:
        return f"skipped: {r['skipped']}"
    f = r["child"]["fault"]
    a = f["after"]
    last = f["variants"][-1]
    why = last.get("error") or last.get("raised")
    text = (f"the {f['faulting_variant']} store failed ({why}); "
            f"{a['jobs']} later jobs: {a['ok']} ok, {a['reported_failed']} reported failed, "
            f"{a['raised_at_submit']} refused at submit; torch after: "
            f"{f.get('torch_after_fault')}")
    if r.get("warning"):
        text += f"; WARNING {r['warning']}"
    return text
