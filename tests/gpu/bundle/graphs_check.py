"""The GPU bundle's CUDA-graph check: kvoffload's jobs with a forward pass captured as a graph.

What it proves. Engines capture their forward pass as a CUDA graph and replay it. (1) A store
of the KV pages a replayed graph writes, submitted at once with the replaying stream as the
Worker's compute stream, copies the graph's bytes: the job waits for the graph launch like any
other work on that stream. (2) A job submitted while the compute stream is capturing a graph
(inside torch.cuda.graph, before it ends) is refused: reported failed by get_finished with an
error containing "capturing a CUDA graph", nothing copied, and the capture is not broken (it
ends, the graph replays and writes the right bytes, a second graph can be captured); a deferred
store (defer_stores=True) submitted during the capture is refused when start_step starts it
("was capturing a CUDA graph"); after the capture the same Job objects succeed. (3) A load that
needs no compute wait (loads_wait_for_compute=False) submitted during a capture runs (its bytes
land) and does not break the capture either.

How it runs. Four bf16 KV tensors (32 KiB pages, 64 blocks). The "forward pass": a few torch ops
on a static input (x * 2 - x + 1, exact in bf16) written into 16 blocks with index_copy_, then a
counter bumped; captured with torch.cuda.graph on a side stream (capture_error_mode from
--capture-mode, default torch's "global"), replayed on the compute stream S behind
torch.cuda._sleep (about 20 ms; --quick 10 ms) after the static input was refilled with new
values, so the writes land long after the host submits. Per copy mode (WorkerConfig copy_mode
"kernel" and "batch"; Worker.cuda_stats must show that mode and no other):

  replay-store     3 repetitions (--quick 1): replay, then at once a store (Worker with compute
                   stream S) and a deferred store (defer_stores, start_step at once) of the 16
                   blocks; host blocks compared page by page with the graph's values, then
                   reloaded into other blocks and compared with torch.equal. 0 mismatches.
  capture-refusal  (2) above: the capture's submissions (a store, a load that waits for compute,
                   a deferred store) refused with that error, host and GPU destinations untouched
                   (sentinel bytes), the capture ended, the replay's counter bumped once and its
                   pages right; then the same jobs ok with the replay's bytes; then a new capture.
  capture-load     (3) above.

HOW IT CAN FAIL. A mismatching page, a job failed (or ok where it must be refused), an error
without "capturing a CUDA graph", a destination written by a refused job, a capture that raises
or a graph that replays wrong, a copy mode that did not run, an exception, a job not reported
within 10 s, or the check past its time bound (the process ends past a case's guard: every loop
is bounded). The CONTROL of replay-store: the same replay with the Worker's compute stream unset
(set_compute_stream(None)) and the store submitted at once must copy stale bytes (mismatches >
0); a control that sees none makes the case "blind", a fail: the check could not have seen the
bug it is for.

    python3 graphs_check.py [--quick] OUT.json   on a GPU: exit 0 pass, 1 fail, 2 no CUDA device;
                                                 bounded by 30 s (--quick 15 s) on an H100
    python3 graphs_check.py --cpu OUT.json       CPU tensors and the host backend: the forward
                                                 pass runs eagerly (no graphs: capture cannot run
                                                 on a CPU, so the capture cases check only that
                                                 the same jobs succeed and the comparisons); the
                                                 control is emulated (the copy first, the forward
                                                 pass after), not meaningful
    options: --capture-mode global|thread_local|relaxed

Output: OUT.json ({"cases": [{copy_mode, case, verdict, ...}], "status", ...}) and one line per
case starting with "graphs " on stdout.
"""

import sys
import time
import traceback

import torch

import kvoffload as kv
from bundle_common import (Deadline, Env, err_text, hard_timeout, host_bytes, logger, make_job,
                           mode_problem, pages_of, parser, setup, sleep_cycles_per_us,
                           stream_ctx, used_modes, versions, wait_all, wait_for, write_host,
                           write_json)

PART = "graphs"
log = logger(PART)
MODES = ("kernel", "batch")
TENSORS = 4  # 2 layers, K and V apart
BLOCK, HEADS, HEAD_DIM = 16, 8, 128  # bf16: 32 KiB pages
ELEMS = BLOCK * HEADS * HEAD_DIM
PAGE = ELEMS * 2
NUM_BLOCKS, HOST_BLOCKS, N = 64, 64, 16
G_SRC = list(range(1, 1 + N))  # the graph writes these (block 0: the engine's null block)
G_DST = list(range(1 + N, 1 + 2 * N))  # reloads land here
G_NOWAIT = list(range(1 + 2 * N, 1 + 3 * N))  # the load during a capture lands here
H_IMM, H_DEF, H_CTRL, H_LOAD = (list(range(i * N, (i + 1) * N)) for i in range(4))
SENTINEL = 0xEE  # host bytes a refused store must leave alone
GPU_SENTINEL = 7.0  # GPU values a refused load must leave alone
REFUSED = "capturing a CUDA graph"
REFUSED_DEFERRED = "was capturing a CUDA graph"
JOB_TIMEOUT_S = 10
CASE_GUARD_S = 40  # one case: past it the process ends (faulthandler), the JSON so far stays
BUDGET_S, QUICK_BUDGET_S = 22, 12  # the bundle's part: 30 s (quick 20 s), with the start


class Rig:
    """The KV tensors, the static input and the forward pass, the streams, the workers."""

    def __init__(self, env, sleep_ms, capture_mode):
        self.env, self.cuda, self.device = env, env.cuda, env.device
        self.capture_mode = capture_mode
        self.tensors = [torch.zeros(NUM_BLOCKS, BLOCK, HEADS, HEAD_DIM, dtype=torch.bfloat16,
                                    device=self.device) for _ in range(TENSORS)]
        self.flat = [t.view(NUM_BLOCKS, ELEMS) for t in self.tensors]
        self.compute, self.side = env.stream(), env.stream()
        self.idx = torch.tensor(G_SRC, device=self.device)
        self.inp = torch.zeros(TENSORS, N, ELEMS, dtype=torch.bfloat16, device=self.device)
        self.count = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.base = torch.arange(ELEMS, device=self.device, dtype=torch.int64) * 5
        self.inputs = {}
        self.next_job = 1
        self.sleep_ms = sleep_ms
        self.sleep_cycles = int(sleep_cycles_per_us(self.compute) * sleep_ms * 1000) if env.cuda \
            else 0
        env.sync()

    # -- the forward pass --------------------------------------------------------------------

    def values(self, seed):
        """[TENSORS, N, ELEMS] int64 in [-120, 119]; seeds 1 to 33 apart differ everywhere."""
        k = torch.arange(TENSORS, device=self.device).view(TENSORS, 1, 1)
        i = torch.arange(N, device=self.device).view(1, N, 1)
        return (self.base.view(1, 1, ELEMS) + seed * 7 + k * 13 + i * 31) % 240 - 120

    def prepare(self, *seeds):
        """The static inputs of these seeds, made now (and synchronized), used later."""
        for s in seeds:
            if s not in self.inputs:
                self.inputs[s] = self.values(s).to(torch.bfloat16)
        self.env.sync()

    def expected(self, seed):
        """What the forward pass writes for `seed`: [TENSORS, N, ELEMS] bf16 on the CPU."""
        return (self.values(seed) + 1).to(torch.bfloat16).cpu()

    def forward(self):
        """The captured part: a few ops per tensor, the KV writes (a graph's static input and
        indices)."""
        for k in range(TENSORS):
            h = self.inp[k] * 2
            h = h - self.inp[k]
            h = h + 1
            self.flat[k].index_copy_(0, self.idx, h)

    def tail(self):
        """Captured after the submissions: the capture must still be recording."""
        self.count.add_(1)

    def capture(self, during=None):
        """A graph of forward(), during(), tail() on the side stream."""
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=self.side, capture_error_mode=self.capture_mode):
            self.forward()
            if during is not None:
                during()
            self.tail()
        return g

    def warm_up(self):
        """The ops once eagerly on the side stream before any capture (as torch asks)."""
        with stream_ctx(self.side):
            self.forward()
            self.tail()
        self.env.sync()

    def replay(self, seed, graph, sleep=True):
        """On the compute stream, nothing synchronized: a GPU sleep, the new input, the
        graph (on the CPU: the same ops, eagerly)."""
        with stream_ctx(self.compute):
            if self.cuda and sleep:
                torch.cuda._sleep(self.sleep_cycles)
            self.inp.copy_(self.inputs[seed])
            if graph is not None:
                graph.replay()
            else:
                self.forward()
                self.tail()

    # -- workers, jobs, bytes ----------------------------------------------------------------

    def worker(self, mode, deferred=False, loads_wait=True):
        return kv.Worker(kv.WorkerConfig(
            tensors=[kv.tensor_of(t) for t in self.tensors],
            groups=[[(k, PAGE) for k in range(TENSORS)]], host_blocks=HOST_BLOCKS,
            copy_mode=mode if self.cuda else "auto", defer_stores=deferred,
            loads_wait_for_compute=loads_wait, compute_stream=self.compute,
            **self.env.backend_args()))

    def use_stream(self, stream, *workers):
        """Worker.set_compute_stream (the host backend has no streams: nothing on the CPU)."""
        if self.cuda:
            for w in workers:
                w.set_compute_stream(stream)

    def job(self, kind, gpu, host):
        jid = self.next_job
        self.next_job += 1
        return make_job(jid, kind, gpu, host, request_id=f"graphs-{jid}")

    def host_mismatches(self, worker, hosts, seed):
        """Pages of host blocks `hosts` that differ from the forward pass's for `seed`."""
        want = self.expected(seed).view(torch.uint8).view(TENSORS, N, PAGE)
        bad = 0
        for i, h in enumerate(hosts):
            got = torch.from_numpy(host_bytes(worker, h, TENSORS * PAGE)).view(TENSORS, PAGE)
            bad += sum(not torch.equal(got[k], want[k, i]) for k in range(TENSORS))
        return bad

    def gpu_mismatches(self, blocks, seed):
        """Pages of GPU blocks `blocks` that differ from the forward pass's for `seed`."""
        want = self.expected(seed)
        idx = torch.tensor(blocks, device=self.device)
        return sum(int((~(pages_of(self.flat[k].index_select(0, idx)) ==
                          pages_of(want[k])).all(dim=1)).sum()) for k in range(TENSORS))

    def fill_gpu(self, blocks, value):
        idx = torch.tensor(blocks, device=self.device)
        for t in self.flat:
            t.index_fill_(0, idx, value)

    def gpu_untouched(self, blocks, value):
        idx = torch.tensor(blocks, device=self.device)
        return all(bool((t.index_select(0, idx) == value).all()) for t in self.flat)

    def host_untouched(self, worker, hosts):
        return all(bool((host_bytes(worker, h, TENSORS * PAGE) == SENTINEL).all()) for h in hosts)


def expect_ok(worker, job, what):
    f = wait_for(worker, job.id, JOB_TIMEOUT_S)
    if not f.ok:
        raise RuntimeError(f"{what} (job {job.id}) failed: {f.error}")
    return f


def refusal(f, words):
    """A report of a job submitted during a capture: {reported, ok, error, refused}."""
    if f is None:
        return {"reported": False, "ok": None, "error": None, "refused": False}
    return {"reported": True, "ok": f.ok, "error": f.error,
            "refused": (not f.ok) and words in (f.error or "")}


# -- the cases -------------------------------------------------------------------------------------


def replay_store(rig, mode, graph, reps):
    """Stores (immediate and deferred) of a replay's pages, their reload; the control."""
    w, wd = rig.worker(mode), rig.worker(mode, deferred=True)
    rec = {"per_rep": [], "control_per_rep": []}
    seeds = [(3 + 2 * r, 4 + 2 * r) for r in range(reps)]
    rig.prepare(*[s for pair in seeds for s in pair])
    for real, ctrl in seeds:
        rig.use_stream(rig.compute, w, wd)
        rig.replay(real, graph)
        store, deferred = rig.job("store", G_SRC, H_IMM), rig.job("store", G_SRC, H_DEF)
        w.submit(store)
        wd.submit(deferred)
        wd.start_step()
        expect_ok(w, store, "store after the replay")
        expect_ok(wd, deferred, "deferred store after the replay")
        rig.env.sync()
        load = rig.job("load", G_DST, H_IMM)
        w.submit(load)
        expect_ok(w, load, "reload")
        rig.env.sync()
        rep = {"store": rig.host_mismatches(w, H_IMM, real),
               "deferred_store": rig.host_mismatches(wd, H_DEF, real),
               "reload": rig.gpu_mismatches(G_DST, real),
               "graph_wrote": rig.gpu_mismatches(G_SRC, real)}
        rec["per_rep"].append(rep)
        # The control: no compute stream, the store at once after the replay (on the CPU the
        # copy first and the forward pass after: the race emulated).
        rig.use_stream(None, w)
        cstore = rig.job("store", G_SRC, H_CTRL)
        if rig.cuda:
            rig.replay(ctrl, graph)
            w.submit(cstore)
            expect_ok(w, cstore, "control store")
        else:
            w.submit(cstore)
            expect_ok(w, cstore, "control store")
            rig.replay(ctrl, graph)
        rig.env.sync()
        rec["control_per_rep"].append(rig.host_mismatches(w, H_CTRL, ctrl))
        rig.use_stream(rig.compute, w)
    rec["pages_per_rep"] = N * TENSORS
    rec["mismatches"] = sum(r["store"] + r["deferred_store"] + r["reload"] for r in rec["per_rep"])
    rec["graph_wrong_pages"] = sum(r["graph_wrote"] for r in rec["per_rep"])
    rec["control"] = {"how": "no compute stream" if rig.cuda else
                      "emulated: the copy first, the forward pass after",
                      "mismatches": sum(rec["control_per_rep"]),
                      "race_observed": sum(rec["control_per_rep"]) > 0}
    problems = []
    if rec["mismatches"]:
        problems.append(f"{rec['mismatches']} pages wrong")
    if rec["graph_wrong_pages"]:
        problems.append(f"the replay wrote {rec['graph_wrong_pages']} pages wrong (the check "
                        "itself is broken)")
    if rig.cuda:
        problems += [p for p in (mode_problem(x.cuda_stats(), mode) for x in (w, wd)) if p]
        rec["cuda_stats"] = [used_modes(w), used_modes(wd)]
    rec["problems"] = problems
    rec["verdict"] = ("fail" if problems else "blind" if not rec["control"]["race_observed"]
                      else "pass")
    return rec


def capture_refusal(rig, mode):
    """Jobs submitted during a capture are refused and break nothing; afterwards they run."""
    w, wd = rig.worker(mode), rig.worker(mode, deferred=True)
    rec, problems = {}, []
    for h in H_IMM + H_DEF:
        write_host(w if h in H_IMM else wd, h,
                   torch.full((TENSORS * PAGE,), SENTINEL, dtype=torch.uint8))
    rig.fill_gpu(G_DST, GPU_SENTINEL)
    seed_after, seed_again = 21, 23
    rig.prepare(seed_after, seed_again)
    store, load = rig.job("store", G_SRC, H_IMM), rig.job("load", G_DST, H_IMM)
    deferred = rig.job("store", G_SRC, H_DEF)
    graph = None
    if rig.cuda:
        rig.use_stream(rig.side, w, wd)  # the engine's current stream while it captures
        raised = {}

        def during():
            for name, worker, job in (("store", w, store), ("load", w, load),
                                      ("deferred_store", wd, deferred)):
                try:
                    worker.submit(job)
                except Exception as e:  # noqa: BLE001 (a refusal must be a report, not this)
                    raised[name] = err_text(e)

        try:
            graph = rig.capture(during)
            rec["capture"] = "ok"
        except Exception as e:  # noqa: BLE001
            rec["capture"] = err_text(e)
            problems.append(f"the capture broke: {rec['capture']}")
        got = wait_all(w, [store.id, load.id], JOB_TIMEOUT_S)
        wd.start_step()  # the deferred store starts now: refused
        got.update(wait_all(wd, [deferred.id], JOB_TIMEOUT_S))
        rig.env.sync()
        during_capture = {"store": refusal(got.get(store.id), REFUSED),
                          "load": refusal(got.get(load.id), REFUSED),
                          "deferred_store": refusal(got.get(deferred.id), REFUSED_DEFERRED)}
        for name, r in during_capture.items():
            if name in raised:
                r["raised"] = raised[name]
                problems.append(f"{name} submitted during the capture raised: {raised[name]}")
            elif not r["refused"]:
                problems.append(f"{name} submitted during the capture was not refused with "
                                f"'{REFUSED}': {r}")
        rec["during_capture"] = during_capture
        rec["destinations_untouched"] = {"host": rig.host_untouched(w, H_IMM) and
                                         rig.host_untouched(wd, H_DEF),
                                         "gpu": rig.gpu_untouched(G_DST, GPU_SENTINEL)}
        if not all(rec["destinations_untouched"].values()):
            problems.append(f"a refused job wrote: {rec['destinations_untouched']}")
        rig.use_stream(rig.compute, w, wd)
    else:
        rec["capture"] = "skipped: no CUDA graphs on the CPU (the same jobs run, once)"
    # After the capture: a replay, then the same Job objects, ok, with the replay's bytes.
    before = int(rig.count.item())
    rig.replay(seed_after, graph)
    w.submit(store)
    wd.submit(deferred)
    wd.start_step()
    expect_ok(w, store, "the store after the capture")
    expect_ok(wd, deferred, "the deferred store after the capture")
    w.submit(load)
    expect_ok(w, load, "the load after the capture")
    rig.env.sync()
    rec["after_capture"] = {"store": rig.host_mismatches(w, H_IMM, seed_after),
                            "deferred_store": rig.host_mismatches(wd, H_DEF, seed_after),
                            "load": rig.gpu_mismatches(G_DST, seed_after),
                            "graph_wrote": rig.gpu_mismatches(G_SRC, seed_after),
                            "counter_bumps": int(rig.count.item()) - before}
    a = rec["after_capture"]
    if a["store"] or a["deferred_store"] or a["load"] or a["graph_wrote"]:
        problems.append(f"wrong pages after the capture: {a}")
    if a["counter_bumps"] != 1:
        problems.append(f"the replay ran the graph's tail {a['counter_bumps']} times, not once")
    if rig.cuda:
        try:
            again = rig.capture()
            rig.replay(seed_again, again, sleep=False)
            rig.env.sync()
            rec["recapture_wrong_pages"] = rig.gpu_mismatches(G_SRC, seed_again)
            if rec["recapture_wrong_pages"]:
                problems.append(f"a new capture replayed {rec['recapture_wrong_pages']} pages "
                                "wrong")
        except Exception as e:  # noqa: BLE001
            rec["recapture"] = err_text(e)
            problems.append(f"no new capture after the refusals: {rec['recapture']}")
        problems += [p for p in (mode_problem(x.cuda_stats(), mode) for x in (w, wd)) if p]
        rec["cuda_stats"] = [used_modes(w), used_modes(wd)]
    rec["problems"] = problems
    rec["verdict"] = "fail" if problems else "pass"
    return rec


def capture_load(rig, mode):
    """A load that needs no compute wait, submitted during a capture, runs."""
    wn = rig.worker(mode, loads_wait=False)
    rec, problems = {}, []
    seed, seed_replay = 27, 29
    rig.prepare(seed_replay)
    want = rig.expected(seed).view(torch.uint8).view(TENSORS, N, PAGE)
    for i, h in enumerate(H_LOAD):
        write_host(wn, h, want[:, i].contiguous())
    rig.fill_gpu(G_NOWAIT, GPU_SENTINEL)
    rig.env.sync()
    load = rig.job("load", G_NOWAIT, H_LOAD)
    graph = None
    if rig.cuda:
        rig.use_stream(rig.side, wn)
        raised = []

        def during():
            try:
                wn.submit(load)
            except Exception as e:  # noqa: BLE001
                raised.append(err_text(e))

        try:
            graph = rig.capture(during)
            rec["capture"] = "ok"
        except Exception as e:  # noqa: BLE001
            rec["capture"] = err_text(e)
            problems.append(f"the capture broke: {rec['capture']}")
        if raised:
            problems.append(f"the load submitted during the capture raised: {raised[0]}")
        rig.use_stream(rig.compute, wn)
    else:
        rec["capture"] = "skipped: no CUDA graphs on the CPU (the load runs outside one)"
        wn.submit(load)
    f = wait_all(wn, [load.id], JOB_TIMEOUT_S).get(load.id)
    rec["load"] = {"reported": f is not None, "ok": f.ok if f else None,
                   "error": f.error if f else None}
    rig.env.sync()
    if f is None or not f.ok:
        problems.append(f"the load was not ok: {rec['load']}")
    else:
        rec["load_wrong_pages"] = rig.gpu_mismatches(G_NOWAIT, seed)
        if rec["load_wrong_pages"]:
            problems.append(f"the load wrote {rec['load_wrong_pages']} pages wrong")
    if graph is not None:
        rig.replay(seed_replay, graph, sleep=False)
        rig.env.sync()
        rec["replay_wrong_pages"] = rig.gpu_mismatches(G_SRC, seed_replay)
        if rec["replay_wrong_pages"]:
            problems.append(f"the graph replayed {rec['replay_wrong_pages']} pages wrong")
    if rig.cuda:
        p = mode_problem(wn.cuda_stats(), mode)
        if p and f is not None and f.ok:
            problems.append(p)
        rec["cuda_stats"] = used_modes(wn)
    rec["problems"] = problems
    rec["verdict"] = "fail" if problems else "pass"
    return rec


def summary(rec):
    text = f"{rec['copy_mode']:6s} {rec['case']}: {rec['verdict'].upper()}"
    if rec["case"] == "replay-store" and "mismatches" in rec:
        text += (f" mismatches {rec['mismatches']} of {rec['pages_per_rep'] * 3 * rec['reps']} "
                 f"pages (store, deferred store, reload), control "
                 f"{rec['control']['mismatches']}")
    elif rec["case"] == "capture-refusal" and "after_capture" in rec:
        dc = rec.get("during_capture")
        text += (" refused during the capture: " + (", ".join(
            f"{k} {'yes' if v['refused'] else 'NO'}" for k, v in dc.items()) if dc else
            "not run (cpu)") + f"; capture {rec['capture']}; after it the same jobs ok")
    elif rec["case"] == "capture-load" and "load" in rec:
        text += f" load during the capture ok={rec['load']['ok']}; capture {rec['capture']}"
    if rec.get("problems"):
        text += f" [{'; '.join(rec['problems'][:3])}]"
    if "error" in rec:
        text += f" ({rec['error']})"
    return text


def main(argv):
    p = parser(__doc__, "graphs.json", "CPU tensors, host backend: the bookkeeping only",
               "one repetition, a shorter sleep")
    p.add_argument("--capture-mode", default="global",
                   choices=["global", "thread_local", "relaxed"],
                   help="torch.cuda.graph's capture_error_mode (default: torch's)")
    args = p.parse_args(argv)
    setup()
    env = Env(args.cpu)
    if env.missing_device():
        log("FAIL: no CUDA device (use --cpu for the logic check)")
        return 2
    started = time.time()
    budget = Deadline(QUICK_BUDGET_S if args.quick else BUDGET_S)
    reps = 1 if args.quick else 3
    rig = Rig(env, 10 if args.quick else 20, args.capture_mode)
    doc = {"part": PART, "mode": env.mode, "quick": args.quick, **versions(),
           "device": env.device_name(), "capture_error_mode": args.capture_mode,
           "sleep_ms": rig.sleep_ms if env.cuda else 0, "sleep_cycles": rig.sleep_cycles,
           "reps": reps, "budget_s": budget.seconds, "controls_meaningful": env.cuda,
           "pages": f"{TENSORS} bf16 tensors of {PAGE} B pages, {N} blocks a job",
           "cases": []}
    if not env.cuda:
        log("note: --cpu: no CUDA graphs and no streams on a CPU, so nothing is captured: the "
            "forward pass runs eagerly, the jobs and comparisons are checked, the refusals "
            "during a capture are skipped, and the control is emulated (not meaningful)")
    rig.warm_up()
    graphs = {}
    for mode in MODES if env.cuda else ("host",):
        cases = [("replay-store", lambda m: replay_store(rig, m, graphs.get("clean"), reps)),
                 ("capture-refusal", lambda m: capture_refusal(rig, m)),
                 ("capture-load", lambda m: capture_load(rig, m))]
        for name, fn in cases:
            t0 = time.time()
            rec = {"copy_mode": mode, "case": name, "reps": reps}
            try:
                budget.check(f"{mode} {name}")
                with hard_timeout(CASE_GUARD_S):
                    if env.cuda and "clean" not in graphs:
                        graphs["clean"] = rig.capture()  # the replay-store cases' graph
                    rec.update(fn(mode))
            except Exception as e:  # noqa: BLE001 (report the case, go on)
                rec.update(verdict="fail", error=err_text(e), traceback=traceback.format_exc())
                try:
                    env.sync()
                except Exception:  # noqa: BLE001 (a broken context: the next cases say so)
                    pass
            rec["seconds"] = round(time.time() - t0, 3)
            doc["cases"].append(rec)
            log(summary(rec))
            write_json(args.out, doc)
    failed = [c for c in doc["cases"] if c["verdict"] != "pass"]
    blind = [c for c in doc["cases"] if c["verdict"] == "blind"]
    doc["status"] = "pass" if not failed and doc["cases"] else "fail"
    doc["seconds"] = round(time.time() - started, 2)
    write_json(args.out, doc)
    log(f"overall: {doc['status'].upper()} ({len(doc['cases'])} cases, {len(failed)} failed, "
        f"{len(blind)} blind, {doc['seconds']} s"
        f"{', cpu: no graphs, controls not meaningful' if not env.cuda else ''})")
    return 0 if doc["status"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
