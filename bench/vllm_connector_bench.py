"""The connector's cost on vLLM's scheduler thread: vLLM's real v1 Scheduler driven with
KvoffloadConnector, and again with vLLM's own OffloadingConnector, on the same seeded
decode-heavy workload (requests arrive sharing a few system prompts, the GPU prefix cache is
off so shared prefixes come from the offloader), workers faked: every store and load job
completes in the step it was issued.

Per step it times every scheduler-side connector call vLLM makes (lookups, allocation
updates, build_connector_meta, update_connector_output, request_finished, take_events,
get_kv_connector_stats) and reports the median and p90 of their sum, the share of each call,
the pickled size of the step's connector metadata (what goes to the workers), full Python
garbage collections, lookups answered "retry later", hits and jobs.

    python vllm_connector_bench.py [--running 64,512,2048] [--factor 1] [--hybrid]
                                   [--profile] [--json out.json]

--profile runs Python's cProfile inside the timed calls only (the measured steps, either
connector) and adds each run's top functions by own time to the JSON; it slows the calls, so
its runs' step times are not the ones to compare.

In a virtual environment with vLLM 0.21.0 and kvoffload (scripts/vllm-test makes one).
"""

import argparse
import cProfile
import gc
import json
import os
import pickle
import platform
import pstats
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "vllm"))

from e2e_check import BLOCK, fake_model_step, make_setup  # noqa: E402

from kvoffload.vllm import KvoffloadWorkerMetadata  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (  # noqa: E402
    OffloadingWorkerMetadata,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

CALLS = ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
         "update_connector_output", "request_finished", "request_finished_all_groups",
         "take_events", "get_kv_connector_stats")


class Timed:
    """Replaces the connector's scheduler-side calls on the instance with timed ones."""

    def __init__(self, conn):
        self.profiler = None  # a cProfile.Profile enabled inside the calls, when profiling
        self.depth = 0        # a wrapped call that calls another wrapped one is timed once
        self.spent = dict.fromkeys(CALLS, 0.0)
        self.deferred = 0
        self.hits = 0
        for name in CALLS:
            if hasattr(conn, name):
                setattr(conn, name, self.wrap(name, getattr(conn, name)))

    def wrap(self, name, fn):
        clock = time.perf_counter

        def timed(*args, **kwargs):
            if self.depth:
                return fn(*args, **kwargs)
            self.depth += 1
            if self.profiler:
                self.profiler.enable()
            start = clock()
            try:
                out = fn(*args, **kwargs)
            finally:
                elapsed = clock() - start
                if self.profiler:
                    self.profiler.disable()
                self.depth -= 1
            self.spent[name] += elapsed
            if name == "get_num_new_matched_tokens":
                if out[0] is None:
                    self.deferred += 1
                elif out[0] > 0:
                    self.hits += 1
            return out

        return timed


def workload(seed, n):
    """Request n: one of 8 system prompts (128 tokens) and a suffix of its own, 32 to 64
    output tokens."""
    rng = random.Random(seed * 1_000_003 + n)
    system = [7000 + 131 * (n % 8) + i for i in range(128)]
    suffix = [rng.randrange(1, 30000) for _ in range(rng.randrange(16, 160))]
    return system + suffix, rng.randrange(32, 65)


def top_functions(profiler, n=15):
    """The profile's top n functions by own time: where, calls, own and cumulative ms, and
    the share of all profiled time."""
    stats = pstats.Stats(profiler)
    total = sum(v[2] for v in stats.stats.values()) or 1.0
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:n]
    out = []
    for (file, line, func), (_, calls, own, cumulative, _) in rows:
        where = f"{os.path.basename(file)}:{line}" if line else file
        out.append({"function": func, "where": where, "calls": calls,
                    "own_ms": round(own * 1e3, 3), "cumulative_ms": round(cumulative * 1e3, 3),
                    "own_share": round(own / total, 4)})
    return out


def run(kind, running, factor, hybrid, seed, steps, host_blocks=0, profile=False):
    vc, kcc, _ = make_setup(hybrid, factor, prefix_caching=False)
    blocks = running * 24 + 1024
    vc.cache_config.num_gpu_blocks = blocks
    for t in kcc.kv_cache_tensors:
        t.size = t.size // kcc.num_blocks * blocks
    kcc.num_blocks = blocks
    vc.scheduler_config.max_num_seqs = running
    vc.scheduler_config.max_num_batched_tokens = running + 4096
    per_block = sum(t.size for t in kcc.kv_cache_tensors) // blocks
    # By default the running requests' blocks fit (about 16 each, per group); over a run more
    # are stored than that, so the oldest are evicted.
    host_blocks = host_blocks or (running * 16 // factor + 256) * len(kcc.kv_cache_groups)
    kvt = vc.kv_transfer_config
    if kind == "vllm":
        kvt.kv_connector, kvt.kv_connector_module_path = "OffloadingConnector", None
        kvt.kv_connector_extra_config = {"block_size": BLOCK * factor,
                                         "cpu_bytes_to_use": host_blocks * factor * per_block}
    else:
        kvt.kv_connector_extra_config = {"block_size": BLOCK * factor, "host_blocks": host_blocks}
    sched = Scheduler(vllm_config=vc, kv_cache_config=kcc,
                      structured_output_manager=StructuredOutputManager(vc), block_size=BLOCK,
                      log_stats=True)
    conn = sched.connector
    timed = Timed(conn)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK, sha256)
    full_gcs = [0]

    def on_gc(phase, info):
        if phase == "start" and info["generation"] == 2:
            full_gcs[0] += 1

    gc.callbacks.append(on_gc)
    made = 0
    per_step, meta_bytes, loads, stores = [], [], 0, 0
    measuring = False
    warmup_limit = 4 * running + 200
    step = 0
    try:
        while len(per_step) < steps and step < warmup_limit + steps:
            step += 1
            # Arrivals keep `running` requests in the engine, at most running/8 per step.
            room = running - len(sched.running) - len(sched.waiting)
            for _ in range(max(0, min(room, max(1, running // 8)))):
                prompt, out_tokens = workload(seed, made)
                sched.add_request(Request(f"r{made}", prompt,
                                          SamplingParams(max_tokens=out_tokens), None,
                                          block_hasher=hasher))
                made += 1
            if not measuring and len(sched.running) >= running * 9 // 10:
                measuring = True
                timed.spent = dict.fromkeys(CALLS, 0.0)
                timed.deferred = timed.hits = 0
                full_gcs[0] = 0
                if profile:
                    timed.profiler = cProfile.Profile()
            before = sum(timed.spent.values())
            out = sched.schedule()
            meta = out.kv_connector_metadata
            if kind == "vllm":
                done = OffloadingWorkerMetadata()
                jobs = list(meta.store_jobs) + list(meta.load_jobs)
                for j in jobs:
                    done.mark_completed(j)
                recving = {meta.load_jobs[j].req_id for j in meta.load_jobs}
                n_loads, n_stores = len(meta.load_jobs), len(meta.store_jobs)
            else:
                done = KvoffloadWorkerMetadata(
                    {j.id: (1, True) for j in list(meta.store_jobs) + list(meta.load_jobs)})
                recving = {j.request_id for j in meta.load_jobs}
                n_loads, n_stores = len(meta.load_jobs), len(meta.store_jobs)
            fake_model_step(sched, out, recving, done)
            if measuring:
                per_step.append(sum(timed.spent.values()) - before)
                meta_bytes.append(len(pickle.dumps(meta)))
                loads += n_loads
                stores += n_stores
    finally:
        gc.callbacks.remove(on_gc)
    if not measuring:
        raise SystemExit(f"{kind} running={running}: never reached {running * 9 // 10} running "
                         f"requests in {step} steps")
    per_step.sort()
    total = sum(timed.spent.values())
    return {
        "steps": len(per_step),
        "step_ms_median": statistics.median(per_step) * 1e3,
        "step_ms_p90": per_step[int(len(per_step) * 0.9)] * 1e3,
        "share_by_call": {k: round(v / total, 4) for k, v in timed.spent.items() if v > 0},
        "ms_per_step_by_call": {k: v * 1e3 / len(per_step) for k, v in timed.spent.items()
                                if v > 0},
        "metadata_bytes_median": statistics.median(meta_bytes),
        "full_gcs": full_gcs[0],
        "lookups_deferred": timed.deferred,
        "lookups_hit": timed.hits,
        "load_jobs": loads,
        "store_jobs": stores,
        "host_blocks": host_blocks,
        "evictions": (conn._sched.stats()["evictions"] if kind == "kvoffload" else None),
        **({"profile_top_own_time": top_functions(timed.profiler)} if timed.profiler else {}),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--running", default="64,512,2048")
    p.add_argument("--factor", type=int, default=1)
    p.add_argument("--hybrid", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--steps", type=int, default=0, help="measured steps (default by size)")
    p.add_argument("--runs", type=int, default=1, help="runs per connector, alternating")
    p.add_argument("--host-blocks", type=int, default=0, help="host cache size (default: "
                   "the running requests' blocks)")
    p.add_argument("--only", choices=("vllm", "kvoffload"),
                   help="run one connector (to profile it); no ratio")
    p.add_argument("--profile", action="store_true",
                   help="cProfile inside the connector's calls; top functions in the JSON")
    p.add_argument("--json")
    a = p.parse_args()
    import vllm
    import kvoffload
    results = []
    print(f"seed {a.seed}, factor {a.factor}, hybrid {a.hybrid}, vLLM {vllm.__version__}, "
          f"kvoffload {kvoffload.__version__}", flush=True)
    for running in [int(x) for x in a.running.split(",")]:
        steps = a.steps or max(30, min(200, 12800 // running))
        row = {"running": running, "runs": {"vllm": [], "kvoffload": []}}
        for r in range(a.runs):
            for kind in (a.only,) if a.only else ("vllm", "kvoffload"):
                started = time.perf_counter()
                res = run(kind, running, a.factor, a.hybrid, a.seed + r, steps, a.host_blocks,
                          a.profile)
                row["runs"][kind].append(res)
                print(f"running {running} {kind:9s} run {r}: step {res['step_ms_median']:.3f} ms "
                      f"median, {res['step_ms_p90']:.3f} p90, meta {res['metadata_bytes_median']:.0f} B, "
                      f"{res['full_gcs']} full GCs, deferred {res['lookups_deferred']}, hits "
                      f"{res['lookups_hit']}, {res['load_jobs']} loads, {res['store_jobs']} stores "
                      f"({time.perf_counter() - started:.0f} s)", flush=True)
        if a.only:
            continue
        med = {k: statistics.median(x["step_ms_median"] for x in v) for k, v in row["runs"].items()}
        row["ratio_vllm_to_kvoffload"] = med["vllm"] / med["kvoffload"]
        row["metadata_bytes_ratio"] = (
            statistics.median(x["metadata_bytes_median"] for x in row["runs"]["kvoffload"]) /
            statistics.median(x["metadata_bytes_median"] for x in row["runs"]["vllm"]))
        print(f"running {running}: vLLM's connector costs {row['ratio_vllm_to_kvoffload']:.1f}x "
              f"kvoffload's per step (median); metadata {row['metadata_bytes_ratio']:.2f}x of "
              f"vLLM's", flush=True)
        results.append(row)
    doc = {"bench": "vllm_connector", "seed": a.seed, "factor": a.factor, "hybrid": a.hybrid,
           "vllm": vllm.__version__, "kvoffload": kvoffload.__version__,
           "machine": {"cpu": platform.processor() or platform.machine(),
                       "cores": os.cpu_count(), "python": platform.python_version()},
           "results": results}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
