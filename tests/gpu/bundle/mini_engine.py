"""The GPU bundle's mini engine: a small transformer served with kvoffload, as an engine uses it.

What it proves. Offloading changes no output bit. A 4-layer transformer in PyTorch (hidden
1024, 8 query and 2 KV heads of 128, deterministic weights from a seeded generator) runs
requests over vLLM-shaped paged KV (per layer one tensor [2, num_blocks, 16, kv_heads,
head_dim], bf16 or fp32) with a scheduler of its own: chunked prefill on a fixed grid of
64-token chunks, then decode (teacher-forced: every token is fixed in advance, so no step
waits for the GPU), prompts that share prefixes and repeat, and a GPU cache small enough that
blocks are freed and handed out again (first-freed first). Offloading goes through
kvoffload.Scheduler and kvoffload.Worker the way the vLLM connector (kvoffload/vllm/) drives
them: lookup at admission (a hit allocates the hit's blocks, on_allocated, the load goes out
with build_step's step and the request waits until get_finished reports it, as vLLM's
WAITING_FOR_REMOTE_KVS), each step Worker.start_step (the last step's stores start), wait on
the flush set, submit the loads, the forward pass on the compute stream, then the stores
(defer_stores=True: they start at the next step's start_step and race its forward pass), and
get_finished -> Scheduler.on_completed. Every newly allocated block is first filled with a
poison value on the compute stream (after the step's flush set, before its loads), so a block
read before its load landed, or stored before its forward pass wrote it, shows. The model and
the workload are in mini_engine_model.py.

The logits at every sampled position (the last prompt token and each decode token) of a run
with offloading must equal those of the same workload without offloading, bit for bit
(torch.equal), in fp32 and in bf16. The model is built so that this is exact: every token is
computed at the same row of a fixed-shape 64-row forward (position mod 64), attention reads a
fixed 512-position window gathered from the paged cache with the positions it may not use
zeroed and masked, so a token's bits do not depend on which chunk computed it or whether its
prefix was loaded. Cases: plain (one full-attention group, f = 2) and hybrid (a full-attention
group for layers 0 and 2, a 48-token sliding-window group for layers 1 and 3, f = 4; a load
allocates the window's leading blocks as null blocks, as vLLM does), each in fp32 and bf16.

Timing (on a GPU): the same workload without offloading and with offloading whose hits are
not used (the same computation, every store racing the next forward pass), alternated, each
run from its first step to a synchronize at its end. The forward pass adds a GPU sleep per
layer (LAYER_SLEEP_US) so that a step is GPU-bound, as a real model's is; then any host
synchronization or compute-stream stall that offloading added shows in the wall time. The
ratio (median offload / median baseline) must be <= 1.02.

HOW IT CAN FAIL. Controls run with every case and must make the logits differ (the script
asserts they do, or the case fails as "blind"):
  skip-load   the engine never submits the load (reports it done to the scheduler): the
              request reads its poisoned blocks
  late-load   the engine schedules the loading request without waiting for the load and
              submits the load after that forward pass: the load waits for the forward pass
              (loads_wait_for_compute), which read poison
  store-early the engine submits (and starts, and waits for) a step's stores before the
              forward pass that writes their KV: the host cache gets poison, later loads
              bring it back
  store-race  (GPU only, reported, not asserted) the worker has no compute stream: stores race
              the forward pass that writes their KV, later loads bring back stale bytes
--mutate NAME runs the offloading runs themselves with that mutation: the comparison then
fails and so does the script (exit 1), which shows the check can fail.

    python3 mini_engine.py [--quick] OUT.json      on a GPU (exit 0 only if all cases pass);
                                                   --quick: 9 requests, no plain-bf16 case,
                                                   2 timing repetitions
    python3 mini_engine.py --cpu OUT.json          CPU tensors, the host backend, a smaller
                                                   model: the same engine, logits equality and
                                                   the controls (no streams, no sleeps; the
                                                   timing is reported, not judged)
    python3 mini_engine.py --mutate skip-load ...  expected to fail

Output: OUT.json ({"cases": {name: {...}}, "timing": {...}, "status"}) and lines starting with
"mini-engine " on stdout.
"""

import collections
import dataclasses
import statistics
import sys
import time
import traceback

import torch

import kvoffload as kv
from bundle_common import (Env, hard_timeout, parser, setup, sleep_cycles_per_us, stream_ctx,
                           versions, write_json)
from mini_engine_model import (BLOCK, CPU, GPU, GPU_QUICK, Model, chain_hashes, host_blocks_for,
                               workload)

LAYER_SLEEP_US = 600  # GPU: emulated layer time, so that steps are GPU-bound
TIMING_TARGET = 1.02
RUN_TIMEOUT_S = 45  # one engine run; faulthandler ends the process past it (the part: 55 s)
MAX_STEPS = 2000


@dataclasses.dataclass
class Request:
    rid: str
    tokens: list
    prompt_len: int
    dev_tokens: object = None
    state: str = "waiting"  # waiting, loading, ready, running, done
    computed: int = 0
    hit: int = 0
    blocks: list = None
    first: bool = True  # its next scheduling is its first (all its blocks are new)
    reserved: int = 0
    allocated: int = 0
    hashes: list = None
    load_job: object = None

    @property
    def total(self):
        return len(self.tokens)


class Engine:
    """One run of the workload. offload: through kvoffload; use_hits: lookups' hits are loaded
    (False: looked up, never loaded, so the computation equals the baseline's); mutation: one
    of the controls."""

    def __init__(self, model, reqs, offload, use_hits=True, mutation=None, stream=None):
        self.m, self.geo = model, model.geo
        self.cuda = model.device == "cuda"
        self.offload, self.use_hits, self.mutation = offload, use_hits, mutation
        self.stream = stream
        self.reqs = [Request(rid, list(toks), plen) for rid, toks, plen in reqs]
        C = self.geo.chunk
        for r in self.reqs:
            pad = r.tokens + [0] * (C + (-len(r.tokens)) % C)
            r.dev_tokens = torch.tensor(pad, device=model.device)
            r.hashes = chain_hashes(r.tokens, r.prompt_len // BLOCK)
        G = model.groups
        # One pool of block ids for both groups, as vLLM's; 0 is the null block.
        self.free = collections.deque(range(1, self.geo.gpu_blocks * G))
        self.logits = {}
        self.counts = collections.Counter()
        self.in_flight = set()
        self.held_loads = []
        self.to_poison = []
        if offload:
            f = 4 if model.hybrid else 2
            self.host_blocks = host_blocks_for(reqs, f, G)
            kinds = [kv.GroupConfig("full_attention", BLOCK)]
            if model.hybrid:
                kinds.append(kv.GroupConfig("sliding_window", BLOCK,
                                            sliding_window=self.geo.window))
            self.sched_config = kv.SchedulerConfig(
                groups=kinds, block_size_factor=f, host_blocks=self.host_blocks,
                gpu_blocks=self.geo.gpu_blocks * G)
            self.sched = kv.Scheduler(self.sched_config)
            tensors, groups = [], [[] for _ in range(G)]
            for layer, t in enumerate(model.kv):
                for part in (t[0], t[1]):  # K and V stacked first, as the vLLM connector splits
                    tensors.append(kv.tensor_of(part))
                    groups[model.group_of(layer)].append((len(tensors) - 1,
                                                          tensors[-1].page_bytes))
            no_stream = mutation == "store-race" or not self.cuda
            self.worker = kv.Worker(kv.derive_worker_config(self.sched_config, kv.WorkerConfig(
                tensors=tensors, groups=groups, backend="cuda" if self.cuda else "host",
                threads=1, defer_stores=True,
                compute_stream=None if no_stream else stream)))

    # -- allocation --------------------------------------------------------------------------
    def need_blocks(self, r):
        return self.m.groups * -(-r.total // BLOCK)

    def outstanding(self):
        return sum(r.reserved - r.allocated for r in self.reqs
                   if r.state in ("loading", "ready", "running"))

    def alloc(self, r, g, n):
        ids = [self.free.popleft() for _ in range(n)]
        r.allocated += n
        if ids:
            self.counts["blocks_allocated"] += n
            self.to_poison.append((g, ids))
        return ids

    def poison(self):
        """Fills the step's newly allocated blocks with POISON on the compute stream. Only
        after the step's flush set: a store of the block's previous owner may still read it
        (the engine writes a handed-out block only after the flush, like a forward pass)."""
        for g, ids in self.to_poison:
            self.m.poison(self.dev(ids), g)
        self.to_poison = []

    def dev(self, ids):
        t = torch.tensor(ids, dtype=torch.int64)
        if self.cuda:  # pinned and non-blocking: a pageable copy would synchronize the host
            return t.pin_memory().to("cuda", non_blocking=True)
        return t

    # -- one step -----------------------------------------------------------------------------
    def admit(self):
        running = [r for r in self.reqs if r.state in ("loading", "ready", "running")]
        room = self.geo.max_running - len(running)
        for r in self.reqs:
            if room <= 0:
                break
            if r.state != "waiting":
                continue
            need = self.need_blocks(r)
            if len(self.free) - self.outstanding() < need:
                break  # first come, first served: wait for blocks
            hit = 0
            if self.offload:
                self.sched.update_request(r.rid, r.prompt_len, r.hashes)
                hit = self.sched.lookup(r.rid, 0)
                if hit is None:
                    self.counts["lookup_retry"] += 1
                    if self.use_hits:
                        continue  # its prefix is in flight: ask again next step
                    hit = 0
                if not self.use_hits:
                    hit = 0
            r.reserved, room = need, room - 1
            r.blocks = [[] for _ in range(self.m.groups)]
            if hit:
                self.counts["hit_tokens"] += hit
                for g in range(self.m.groups):
                    n = -(-hit // BLOCK)
                    nulls = max(0, hit - self.geo.window + 1) // BLOCK if g == 1 else 0
                    r.blocks[g] = [0] * nulls + self.alloc(r, g, n - nulls)
                self.sched.on_allocated(r.rid, [kv.AllocatedGroup(b, num_computed_blocks=b.count(0))
                                                for b in r.blocks], hit)
                r.hit, r.state = hit, "loading"
                # vLLM recomputes the last prompt token of a whole-prompt hit (its logits)
                r.computed = min(hit, r.prompt_len - 1)
            else:
                if self.offload:
                    self.sched.on_allocated(r.rid, [kv.AllocatedGroup([])
                                                    for _ in range(self.m.groups)], 0)
                r.state, r.computed = "running", 0

    def schedule(self):
        """The step's work: (request, a, b, new block ids per group)."""
        work, prefills = [], 0
        for r in self.reqs:
            if r.state not in ("running", "ready"):
                continue
            a = r.computed
            if a < r.prompt_len:
                if prefills >= self.geo.prefill_per_step:
                    continue
                prefills += 1
                ws = a - a % self.geo.chunk
                b = min(r.prompt_len, ws + self.geo.chunk)
            else:
                b = a + 1
            new = []
            for g in range(self.m.groups):
                ids = self.alloc(r, g, -(-b // BLOCK) - len(r.blocks[g]))
                new.append((list(r.blocks[g]) + ids) if r.first else ids)
                r.blocks[g].extend(ids)
            r.first = False
            r.state = "running"
            work.append((r, a, b, new))
        return work

    def slots(self, r, a, b):
        """Per group: write slots of positions [a, b), gather slots of [0, maxctx) (0 where
        not read), and the first position attention reads."""
        out, los, flat = [], [], []
        for g in range(self.m.groups):
            lo = max(0, a - self.geo.window + 1) if g == 1 else 0
            bl = r.blocks[g]
            write = [bl[p // BLOCK] * BLOCK + p % BLOCK for p in range(a, b)]
            gather = [bl[p // BLOCK] * BLOCK + p % BLOCK if lo <= p < b else 0
                      for p in range(self.geo.maxctx)]
            assert all(bl[p // BLOCK] for p in range(lo, b)), "a null block in the window"
            flat += write + gather
            los.append(lo)
        dev = self.dev(flat)
        at = 0
        for g in range(self.m.groups):
            n = b - a
            out.append((dev[at:at + n], dev[at + n:at + n + self.geo.maxctx]))
            at += n + self.geo.maxctx
        return out, los

    def forward(self, work):
        for r, a, b, _ in work:
            ws = a - a % self.geo.chunk
            slots, los = self.slots(r, a, b)
            logits = self.m.forward(r.dev_tokens, ws, a, b, slots, los)
            for p in range(max(a, r.prompt_len - 1), b):
                self.logits[(r.rid, p)] = logits[p - ws].clone()
            r.computed = b
            self.counts["forwards"] += 1

    def report(self, finished):
        for f in finished:
            self.in_flight.discard(f.job)
            if not f.ok:
                self.counts["failed_jobs"] += 1
                raise RuntimeError(f"job {f.job} ({f.kind}) failed: {f.error}")
        done = self.sched.on_completed([kv.JobReport(f.job, ok=f.ok) for f in finished])
        for c in done:
            if c.kind == "load":
                r = next(x for x in self.reqs if x.rid == c.request_id)
                if r.state == "loading":
                    r.state = "ready"

    def step(self):
        self.admit()
        # Decode steps bring new tokens: the request's count and any completed block's hash.
        for r in self.reqs:
            if self.offload and r.state == "running" and r.computed >= r.prompt_len:
                n = r.computed + 1
                new = []
                if n % BLOCK == 0:
                    new = chain_hashes(r.tokens, n // BLOCK)[len(r.hashes):]
                    r.hashes += new
                self.sched.extend_request(r.rid, n, new)
        work = self.schedule()
        if not self.offload:
            self.poison()
            self.forward(work)
        else:
            entries = [kv.ScheduledRequest(r.rid, a, b - a, new) for r, a, b, new in work]
            step = self.sched.build_step(entries)
            w = self.worker
            w.start_step()  # the previous step's stores start, after its forward pass
            if step.flush:
                self.counts["flushes"] += 1
                w.wait(step.flush)
            self.poison()  # before the loads: they wait for it (loads_wait_for_compute)
            late, self.held_loads = self.held_loads, []
            for job in step.load_jobs:
                self.counts["load_jobs"] += 1
                r = next(x for x in self.reqs if x.rid == job.request_id)
                if self.mutation == "skip-load":
                    self.sched.on_completed([kv.JobReport(job.id, ok=True)])  # a lie
                    r.state = "ready"
                elif self.mutation == "late-load":
                    self.held_loads.append(job)
                    r.state = "ready"
                else:
                    w.submit(job)
                    self.in_flight.add(job.id)
            stores = step.store_jobs
            if self.mutation == "store-early":  # copied before the forward pass writes them
                for job in stores:
                    self.counts["store_jobs"] += 1
                    w.submit(job)
                w.start_step()
                w.wait([job.id for job in stores])
                self.in_flight.update(job.id for job in stores)
                stores = []
            self.forward(work)
            for job in late:  # late-load: after the forward pass that needed it
                w.submit(job)
                self.in_flight.add(job.id)
            for job in stores:
                self.counts["store_jobs"] += 1
                w.submit(job)  # deferred to the next step's start_step
                self.in_flight.add(job.id)
            self.report(w.get_finished())
            if not work and self.in_flight:
                # Nothing to compute: every request waits for a load, or for stores of its
                # prefix (lookup: retry later). Wait for them rather than spin.
                self.counts["idle_waits"] += 1
                w.start_step()
                w.wait(sorted(self.in_flight))
                self.report(w.get_finished())
        for r in self.reqs:
            if r.state == "running" and r.computed >= r.total:
                r.state = "done"
                if self.offload:
                    self.sched.on_finished(r.rid)
                for g in range(self.m.groups):  # first freed, first handed out again
                    self.free.extend(b for b in r.blocks[g] if b)
                r.reserved = r.allocated = 0
        return any(r.state != "done" for r in self.reqs)

    def run(self):
        if self.cuda:  # the cache's reset and the token tensors (default stream) are done
            torch.cuda.synchronize()
        start = time.perf_counter()
        steps = 0
        with stream_ctx(self.stream):
            while self.step():
                steps += 1
                if steps > MAX_STEPS:
                    raise RuntimeError(f"no progress after {MAX_STEPS} steps: "
                                       f"{[(r.rid, r.state, r.computed) for r in self.reqs]}")
            self.loop_seconds = time.perf_counter() - start  # the host's share
            if self.offload:
                w = self.worker
                w.start_step()
                w.wait(sorted(self.in_flight))
                self.report(w.get_finished())
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds = time.perf_counter() - start
        self.steps = steps + 1
        if self.offload:
            self.stats = self.sched.stats()
            self.cuda_stats = self.worker.cuda_stats()
            del self.worker
        return self


def compare(base, other):
    keys = sorted(base.logits)
    if sorted(other.logits) != keys:
        return {"compared": 0, "differing": -1, "error": "different logit positions"}
    diff = [k for k in keys if not torch.equal(base.logits[k], other.logits[k])]
    worst = 0.0
    for k in diff:
        d = (base.logits[k].float() - other.logits[k].float()).abs().max().item()
        worst = max(worst, d if d == d else float("inf"))
    return {"compared": len(keys), "differing": len(diff), "max_abs_diff": worst,
            "first_differing": [list(k) for k in diff[:3]]}


def engine_run(model, reqs, offload, stream, **kw):
    """One run from a cleared cache; a run that never returns ends the process."""
    with hard_timeout(RUN_TIMEOUT_S):
        model.reset_cache()
        return Engine(model, reqs, offload, stream=stream, **kw).run()


def run_case(name, geo, dtype, hybrid, device, sleep, stream, mutate, cuda):
    model = Model(geo, dtype, device, hybrid, sleep)
    reqs = workload(geo)

    def go(offload, **kw):
        return engine_run(model, reqs, offload, stream, **kw)

    base = go(False)
    off = go(True, mutation=mutate)
    rec = {"dtype": str(dtype).replace("torch.", ""), "hybrid": hybrid,
           "block_size_factor": 4 if hybrid else 2,
           "groups": "full + sliding window %d" % geo.window if hybrid else "full",
           "requests": len(reqs), "steps": off.steps, "mutation": mutate,
           "baseline_s": round(base.seconds, 3), "offload_s": round(off.seconds, 3),
           "host_blocks": off.host_blocks,
           "counts": dict(off.counts), "scheduler": {k: off.stats[k] for k in (
               "hits", "misses", "evictions", "blocks_stored", "blocks_loaded", "load_jobs",
               "store_jobs", "failed_loads", "failed_stores", "deferrals")},
           "cuda_stats": off.cuda_stats}
    rec.update(compare(base, off))
    rec["logits_equal"] = rec["differing"] == 0 and rec["compared"] > 0
    # The run must have exercised what it claims to: loads, stores, reuse of GPU blocks.
    freed_reuse = off.counts["blocks_allocated"] > geo.gpu_blocks * model.groups - 1
    rec["gpu_blocks_reused"] = freed_reuse
    problems = []
    if not rec["logits_equal"]:
        problems.append(f"{rec['differing']} of {rec['compared']} logits differ")
    if not off.counts["load_jobs"]:
        problems.append("no load happened")
    if not off.counts["store_jobs"]:
        problems.append("no store happened")
    if not freed_reuse:
        problems.append("no GPU block was handed out twice")
    controls = {}
    ctrl_names = ["skip-load", "late-load", "store-early"] + (["store-race"] if cuda else [])
    if mutate is None:
        for c in ctrl_names:
            try:
                cr = compare(base, go(True, mutation=c))
                cr["differs"] = cr["differing"] != 0
                cr["asserted"] = c != "store-race"
            except Exception as e:  # noqa: BLE001
                cr = {"differs": None, "asserted": c != "store-race",
                      "error": f"{type(e).__name__}: {e}"}
            controls[c] = cr
            if cr["asserted"] and not cr["differs"]:
                problems.append(f"control {c} did not change the logits (blind)")
    rec["controls"] = controls
    rec["problems"] = problems
    rec["verdict"] = "pass" if not problems else "fail"
    return rec


def timing(geo, dtype, device, sleep, stream, reps):
    model = Model(geo, dtype, device, False, sleep)
    reqs = workload(geo)
    out = {"dtype": str(dtype).replace("torch.", ""), "layer_sleep_us": LAYER_SLEEP_US,
           "baseline_s": [], "offload_stores_s": [], "baseline_host_loop_s": [],
           "offload_host_loop_s": [], "reps": reps}

    def go(offload):
        return engine_run(model, reqs, offload, stream, use_hits=False)

    go(False)  # warm-up: cuBLAS, the caching allocators
    go(True)
    for _ in range(reps):
        b = go(False)
        o = go(True)
        out["baseline_s"].append(round(b.seconds, 4))
        out["offload_stores_s"].append(round(o.seconds, 4))
        out["baseline_host_loop_s"].append(round(b.loop_seconds, 4))
        out["offload_host_loop_s"].append(round(o.loop_seconds, 4))
        out["steps"] = b.steps
        out["store_jobs"] = o.counts["store_jobs"]
        out["logits_equal"] = compare(b, o)["differing"] == 0
    mb, mo = statistics.median(out["baseline_s"]), statistics.median(out["offload_stores_s"])
    out["step_ms_baseline"] = round(1000 * mb / out["steps"], 3)
    out["step_ms_offload"] = round(1000 * mo / out["steps"], 3)
    out["ratio"] = round(mo / mb, 4)
    # GPU-bound: the host queued the whole run well before the GPU finished it (else the ratio
    # measures the host's Python, not offloading's effect on the GPU).
    out["host_share"] = round(statistics.median(out["offload_host_loop_s"]) / mo, 3)
    out["target"] = TIMING_TARGET
    return out


def calibrate_sleep(stream):
    """Cycles of torch.cuda._sleep per LAYER_SLEEP_US (the GPU's clock, measured)."""
    per_us = sleep_cycles_per_us(stream)
    return int(per_us * LAYER_SLEEP_US), per_us


def main(argv):
    ap = parser(__doc__, "mini_engine.json", "CPU tensors, host backend",
                "fewer requests and cases")
    ap.add_argument("--mutate", choices=["skip-load", "late-load", "store-early", "store-race"],
                    help="run the offloading runs with this bug: expected to FAIL")
    args = ap.parse_args(argv)
    setup()
    env = Env(args.cpu)
    cuda = env.cuda
    if env.missing_device():
        print("mini-engine FAIL: no CUDA device (use --cpu)", flush=True)
        return 2
    if args.mutate == "store-race" and not cuda:
        print("mini-engine: store-race needs a GPU (no streams on the CPU)", flush=True)
        return 2
    started = time.time()
    device = env.device
    geo = CPU if not cuda else (GPU_QUICK if args.quick else GPU)
    stream = env.stream()
    sleep, per_us = calibrate_sleep(stream) if cuda else (0, None)
    doc = {"mode": env.mode, "quick": args.quick, "mutate": args.mutate,
           **versions(built_with_cuda=False),
           "device": env.device_name(),
           "geometry": dataclasses.asdict(geo), "sleep_cycles_per_us": per_us,
           "cases": {}, "timing": None}
    if not cuda:
        print("mini-engine note: --cpu: host backend, no streams or sleeps; logits equality "
              "and the controls are checked, the timing is reported only", flush=True)
    cases = [("plain-fp32", torch.float32, False), ("plain-bf16", torch.bfloat16, False),
             ("hybrid-fp32", torch.float32, True), ("hybrid-bf16", torch.bfloat16, True)]
    if args.quick:
        cases = [c for c in cases if c[0] != "plain-bf16"]

    for name, dtype, hybrid in cases:
        t0 = time.time()
        try:
            rec = run_case(name, geo, dtype, hybrid, device, sleep, stream, args.mutate, cuda)
        except Exception as e:  # noqa: BLE001
            rec = {"verdict": "fail", "error": f"{type(e).__name__}: {e}",
                   "traceback": traceback.format_exc()}
        rec["seconds"] = round(time.time() - t0, 2)
        doc["cases"][name] = rec
        ctrl = ", ".join(f"{c} {'differs' if v.get('differs') else 'SAME'}"
                         for c, v in rec.get("controls", {}).items())
        print(f"mini-engine {name}: {rec['verdict'].upper()} logits "
              f"{rec.get('compared', 0) - max(rec.get('differing', 0), 0)}/"
              f"{rec.get('compared', 0)} equal, loads {rec.get('counts', {}).get('load_jobs')}"
              f", stores {rec.get('counts', {}).get('store_jobs')}, hit tokens "
              f"{rec.get('counts', {}).get('hit_tokens')}; controls: {ctrl or '-'}; "
              f"{rec['seconds']} s" + (f" ({rec['error']})" if "error" in rec else "")
              + (f" [{'; '.join(rec['problems'])}]" if rec.get("problems") else ""),
              flush=True)
        write_json(args.out, doc)
    if args.mutate is None:
        t0 = time.time()
        try:
            tm = timing(geo, torch.bfloat16 if cuda else torch.float32, device, sleep, stream,
                        2 if args.quick else 3)
            if cuda:
                tm["verdict"] = "pass" if tm["ratio"] <= TIMING_TARGET else "fail"
            else:
                tm["verdict"] = "info"
                tm["note"] = "cpu: not GPU-bound, reported only"
            if not tm["logits_equal"]:
                tm["verdict"] = "fail"
        except Exception as e:  # noqa: BLE001
            tm = {"verdict": "fail", "error": f"{type(e).__name__}: {e}",
                  "traceback": traceback.format_exc()}
        tm["seconds"] = round(time.time() - t0, 2)
        doc["timing"] = tm
        print(f"mini-engine timing: {tm['verdict'].upper()} offload (stores racing) / no "
              f"offload = {tm.get('ratio')} (target <= {TIMING_TARGET}), step "
              f"{tm.get('step_ms_offload')} vs {tm.get('step_ms_baseline')} ms, host share "
              f"{tm.get('host_share')} (near 1: host-bound); "
              f"{tm['seconds']} s" + (f" ({tm['error']})" if "error" in tm else ""),
              flush=True)
    bad = [n for n, c in doc["cases"].items() if c["verdict"] != "pass"]
    if doc["timing"] is not None and doc["timing"]["verdict"] == "fail":
        bad.append("timing")
    doc["status"] = "pass" if not bad else "fail"
    doc["seconds"] = round(time.time() - started, 2)
    write_json(args.out, doc)
    print(f"mini-engine overall: {doc['status'].upper()}"
          + (f" ({', '.join(bad)})" if bad else "") + f" {doc['seconds']} s"
          + (f" [mutation {args.mutate}: a FAIL is expected]" if args.mutate else ""),
          flush=True)
    return 0 if doc["status"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
