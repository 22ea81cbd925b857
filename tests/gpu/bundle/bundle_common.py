"""What the GPU bundle's PyTorch checks share. Not a check: nothing runs it by itself.

The checks (ordering_check.py, mini_engine.py, contention_check.py, workers_check.py,
graphs_check.py, pressure_check.py) run as `python3 DIR/NAME.py`, so their folder is on
sys.path and `import bundle_common` finds this file (scripts/gpu-bundle copies every
tests/gpu/bundle/*.py next to `run`). Here:

  Env, parser, setup      the CPU/GPU switch (--cpu: CPU tensors and the host backend), the
                          common command line (OUT.json, --cpu, --quick), torch on one thread
  make_job, wait_for,     kvoffload jobs built with the public kv.Job constructor (one group,
  wait_all                block size factor 1), and bounded polling of get_finished
  host_bytes, write_host, the byte comparisons: a host block's bytes, KV pages as bytes
  pages_of, host_equal
  hard_timeout, Deadline  the per-case guards: a call that never returns ends the process
                          (faulthandler); a loop past its time stops
  write_json              results written whole (a reader never sees half a file)
  sleep_cycles_per_us,    the GPU side: torch.cuda._sleep calibrated against the clock, and
  mode_problem            whether the jobs really ran in the copy mode asked for
"""

import argparse
import contextlib
import faulthandler
import json
import os
import time

import numpy as np
import torch

import kvoffload as kv

KiB, MiB = 1024, 1024 * 1024
EXIT_PASS, EXIT_FAIL, EXIT_NO_DEVICE = 0, 1, 2


def err_text(e):
    return f"{type(e).__name__}: {e}"


def logger(part):
    """print with the part's name first, flushed (the bundle reads stdout as it comes)."""
    def log(line):
        print(f"{part} {line}", flush=True)
    return log


# -- the command line and the CPU/GPU switch ------------------------------------------------------


def parser(doc, default_out, cpu_help, quick_help, raw=False):
    """The checks' common arguments: OUT.json (default `default_out`), --cpu and --quick.
    raw: the whole first paragraph of `doc` as the description, as written."""
    if raw:
        p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("out", nargs="?", default=default_out, help="results JSON path")
    else:
        p = argparse.ArgumentParser(description=doc.split("\n")[0])
        p.add_argument("out", nargs="?", default=default_out)
    p.add_argument("--cpu", action="store_true", help=cpu_help)
    p.add_argument("--quick", action="store_true", help=quick_help)
    return p


class Env:
    """GPU (CUDA tensors, the CUDA backend, torch streams) or CPU (CPU tensors, the host
    backend, no streams: stream() is None and stream_ctx(None) does nothing)."""

    def __init__(self, cpu):
        self.cuda = not cpu
        self.device = "cuda" if self.cuda else "cpu"
        self.backend = "cuda" if self.cuda else "host"
        self.mode = "gpu" if self.cuda else "cpu"

    def missing_device(self):
        """A GPU run without a CUDA device visible to torch."""
        return self.cuda and not torch.cuda.is_available()

    def device_name(self):
        return torch.cuda.get_device_name(0) if self.cuda else "cpu"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def stream(self):
        return torch.cuda.Stream() if self.cuda else None

    def backend_args(self, cpu_threads=1, gpu_threads=0):
        """WorkerConfig's backend and threads (host backend threads; unused by CUDA's)."""
        return {"backend": self.backend, "threads": gpu_threads if self.cuda else cpu_threads}


def setup():
    """What every check does first: torch on one thread (the machine is shared)."""
    torch.set_num_threads(1)


def versions(built_with_cuda=True):
    """The versions a results JSON records (kvoffload_built_with_cuda unless told not to)."""
    out = {"torch": torch.__version__, "kvoffload": kv.__version__}
    if built_with_cuda:
        out["kvoffload_built_with_cuda"] = kv.built_with_cuda()
    return out


def stream_ctx(stream):
    """torch.cuda.stream(stream), or nothing for None (the CPU)."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


# -- jobs ----------------------------------------------------------------------------------------


def make_job(jid, kind, gpu_ids, host_ids, request_id=None):
    """A one-group transfer job at block size factor 1 ("store" or "load"): GPU block
    gpu_ids[i] <-> host block host_ids[i], with a key per host block."""
    keys = [(int(jid).to_bytes(8, "little") + i.to_bytes(8, "little"), 0)
            for i in range(len(host_ids))]
    return kv.Job(int(jid), kind, keys, [int(g) for g in gpu_ids], [len(gpu_ids)], [0],
                  [int(h) for h in host_ids],
                  request_id=f"r{jid}" if request_id is None else request_id)


def wait_all(worker, ids, timeout, spin=0.0002):
    """Polls get_finished (never blocking in the library) until every job of `ids` was
    reported or `timeout` seconds passed. Returns {id: FinishedTransfer} of those reported
    (reports of other jobs are dropped)."""
    want, got = set(ids), {}
    end = time.time() + timeout
    while True:
        for f in worker.get_finished():
            if f.job in want:
                got[f.job] = f
        if len(got) == len(want) or time.time() > end:
            return got
        time.sleep(spin)


def wait_for(worker, jid, timeout):
    """The report of job jid; TimeoutError if it has none after `timeout` seconds."""
    f = wait_all(worker, [jid], timeout).get(jid)
    if f is None:
        raise TimeoutError(f"job {jid} not finished after {timeout} s")
    return f


# -- bytes ---------------------------------------------------------------------------------------


def host_bytes(worker, h, nbytes):
    """A copy of the first nbytes of host block h (uint8 NumPy)."""
    return np.array(worker.host_block(h)[:nbytes])


def write_host(worker, h, data):
    """data (uint8 NumPy, or a CPU uint8 tensor) into the first bytes of host block h."""
    if isinstance(data, torch.Tensor):
        data = data.reshape(-1).numpy()
    worker.host_block(h)[:data.size] = data


def host_equal(worker, h, want):
    """Whether host block h starts with the bytes `want` (uint8 NumPy), no copy kept."""
    hb = worker.host_block(h)
    ok = np.array_equal(hb[:want.size], want)
    del hb
    return ok


def pages_of(t):
    """A tensor [n, ...] (any device, any dtype) as CPU uint8 [n, page bytes]."""
    return t.reshape(t.shape[0], -1).cpu().view(torch.uint8)


# -- guards --------------------------------------------------------------------------------------


@contextlib.contextmanager
def hard_timeout(seconds):
    """A call that never returns (a hang in the library) ends the process after `seconds`,
    with every thread's traceback on stderr: what was written before survives."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


class Deadline:
    """A time bound for a loop or a part: left() seconds, over(), check(what) raises."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.end = time.time() + seconds

    def left(self):
        return max(0.0, self.end - time.time())

    def over(self):
        return time.time() > self.end

    def check(self, what):
        if self.over():
            raise TimeoutError(f"{what}: past its bound of {self.seconds} s")


def write_json(path, doc):
    """Writes doc to path whole (a temporary file renamed over it)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(tmp, path)


# -- the GPU side --------------------------------------------------------------------------------


def sleep_cycles_per_us(stream):
    """torch.cuda._sleep cycles per microsecond on `stream` (the GPU's clock, measured)."""
    with torch.cuda.stream(stream):
        torch.cuda._sleep(1_000_000)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.cuda._sleep(10_000_000)
        e.record()
    torch.cuda.synchronize()
    return 10_000_000 / (s.elapsed_time(e) * 1000)


def used_modes(worker):
    """The non-zero counts of Worker.cuda_stats() (None for the host backend)."""
    s = worker.cuda_stats()
    return None if s is None else {k: v for k, v in s.items() if v}


def mode_problem(stats, mode):
    """None if the jobs counted in `stats` (Worker.cuda_stats) ran in `mode` and no other (a
    silent fallback, batch to memcpy without the driver's batch API, shows), else why not."""
    others = [k for k in ("jobs_batch", "jobs_memcpy", "jobs_kernel", "jobs_staged")
              if k != f"jobs_{mode}" and stats.get(k)]
    if not stats.get(f"jobs_{mode}") or others:
        return f"copy mode {mode} was not what ran: cuda_stats {stats}"
    return None
