"""The differential test: vLLM 0.21.0's own OffloadingConnector and kvoffload's scheduler, fed
the same calls by vLLM's real Scheduler, step by step.

A shadow wraps the OffloadingConnector that vLLM's Scheduler drives; every scheduler-role call
also goes to a KvoffloadConnector (scheduler role, the same groups, factor and host capacity).
After each call the answers are compared: lookups; each step's load and store jobs per request
(GPU block ids, group sizes, block indices; host block ids through a mapping that must stay
one to one); the flush sets through the job id mapping. The inputs are vLLM's own (its KV
cache manager's block ids, null blocks and all). Completions are reported to both.

    python diff_check.py       (exit 0: every scenario ran its steps with no difference)
"""

import random
import sys
import types

from e2e_check import BLOCK, fake_model_step, make_setup

import kvoffload as kv
from kvoffload.vllm import KvoffloadConnector, KvoffloadWorkerMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingWorkerMetadata,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager


class Differences(Exception):
    pass


class Shadow:
    """Forwards each scheduler-role call to vLLM's connector and to kvoffload's, compares."""

    METHODS = ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
               "update_connector_output", "request_finished", "request_finished_all_groups")

    def __init__(self, vllm_conn, ours):
        # vLLM's own methods, bound before the shadow replaces them on the instance.
        self.v = types.SimpleNamespace(**{m: getattr(vllm_conn, m) for m in self.METHODS})
        self.k = ours
        self.host_v2k, self.host_k2v = {}, {}
        self.job_v2k = {}
        self.diffs = []
        self.step = 0

    def diff(self, what):
        self.diffs.append(f"step {self.step}: {what}")

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        a = self.v.get_num_new_matched_tokens(request, num_computed_tokens)
        b = self.k.get_num_new_matched_tokens(request, num_computed_tokens)
        if tuple(a) != tuple(b):
            self.diff(f"lookup {request.request_id} ({num_computed_tokens} computed): vLLM {a}, "
                      f"kvoffload {b}")
        return a

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self.v.update_state_after_alloc(request, blocks, num_external_tokens)
        self.k.update_state_after_alloc(request, blocks, num_external_tokens)

    def map_hosts(self, rid, kind, vh, kh):
        if len(vh) != len(kh):
            self.diff(f"{kind} {rid}: vLLM {len(vh)} host blocks, kvoffload {len(kh)}")
            return
        for a, b in zip(vh, kh):
            if self.host_v2k.get(a, b) != b or self.host_k2v.get(b, a) != a:
                self.diff(f"{kind} {rid}: host block {a} (vLLM) pairs with {b} (kvoffload), "
                          f"before with {self.host_v2k.get(a)} / {self.host_k2v.get(b)}")
            self.host_v2k[a], self.host_k2v[b] = b, a

    def compare_jobs(self, kind, vjobs, kjobs):
        vby = {}
        for jid, job in vjobs.items():
            src, dst = job.transfer_spec
            gpu, host = (src, dst) if kind == "store" else (dst, src)
            vby.setdefault(job.req_id, []).append((jid, gpu, host))
        kby = {}
        for job in kjobs:
            kby.setdefault(job.request_id, []).append(job)
        for rid in sorted(set(vby) | set(kby)):
            vs, ks = vby.get(rid, []), kby.get(rid, [])
            if len(vs) != len(ks):
                self.diff(f"{kind} jobs of {rid}: vLLM {len(vs)}, kvoffload {len(ks)}")
                continue
            for (jid, gpu, host), job in zip(vs, ks):
                self.job_v2k[jid] = job.id
                vg = (list(map(int, gpu.block_ids)), list(map(int, gpu.group_sizes)),
                      list(map(int, gpu.block_indices)))
                kg = (list(map(int, job.gpu_block_ids)), list(map(int, job.group_sizes)),
                      list(map(int, job.block_indices)))
                if vg != kg:
                    self.diff(f"{kind} {rid}: GPU side vLLM {vg}, kvoffload {kg}")
                self.map_hosts(rid, kind, list(map(int, host.block_ids)),
                               list(map(int, job.host_block_ids)))

    def build_connector_meta(self, scheduler_output):
        mv = self.v.build_connector_meta(scheduler_output)
        mk = self.k.build_connector_meta(scheduler_output)
        self.compare_jobs("load", mv.load_jobs, mk.load_jobs)
        self.compare_jobs("store", mv.store_jobs, mk.store_jobs)
        vflush = sorted(self.job_v2k.get(j, -1) for j in (mv.jobs_to_flush or ()))
        if vflush != sorted(mk.flush):
            self.diff(f"flush: vLLM (as kvoffload ids) {vflush}, kvoffload {sorted(mk.flush)}")
        self.last = (mv, mk)
        return mv

    def update_connector_output(self, connector_output):
        self.v.update_connector_output(connector_output)
        meta = connector_output.kv_connector_worker_meta
        done = getattr(meta, "completed_jobs", {}) or {}
        self.k.update_connector_output(KVConnectorOutput(kv_connector_worker_meta=(
            KvoffloadWorkerMetadata({self.job_v2k[j]: (c, True) for j, c in done.items()}))))

    def request_finished(self, request, block_ids):
        self.k.request_finished(request, block_ids)
        return self.v.request_finished(request, block_ids)

    def request_finished_all_groups(self, request, block_ids):
        self.k.request_finished_all_groups(request, block_ids)
        return self.v.request_finished_all_groups(request, block_ids)


def many_prompts(n, seed=5):
    """n prompts as engines see them: 8 system prompts of 128 tokens, each with a suffix of its
    own (16 to 160 tokens)."""
    rng = random.Random(seed)
    return [[7000 + 131 * (i % 8) + k for k in range(128)] +
            [rng.randrange(1, 30000) for _ in range(rng.randrange(16, 160))] for i in range(n)]


def scenario(name, hybrid, factor, host_blocks=64, gpu_blocks=96, prompts=8, async_loads=False,
             abort=None, reset_at=None, steps=80, max_tokens=8, running=None,
             prefix_caching=False):
    """`running`: hundreds of requests at once (many_prompts, arrivals of running/8 a step),
    else `prompts` small ones, one every third step."""
    vc, kcc, _ = make_setup(hybrid, factor, prefix_caching=prefix_caching)
    if running is not None:
        vc.scheduler_config.max_num_seqs = running
        vc.scheduler_config.max_num_batched_tokens = running + 4096
    vc.cache_config.num_gpu_blocks = gpu_blocks
    kcc.num_blocks = gpu_blocks
    for t in kcc.kv_cache_tensors:
        t.size = t.size // 96 * gpu_blocks
    per_block = sum(t.size for t in kcc.kv_cache_tensors) // gpu_blocks
    kvt = vc.kv_transfer_config
    kvt.kv_connector, kvt.kv_connector_module_path = "OffloadingConnector", None
    kvt.kv_connector_extra_config = {"block_size": BLOCK * factor,
                                     "cpu_bytes_to_use": host_blocks * factor * per_block}
    sched = Scheduler(vllm_config=vc, kv_cache_config=kcc,
                      structured_output_manager=StructuredOutputManager(vc), block_size=BLOCK)
    kvt.kv_connector_extra_config = {"block_size": BLOCK * factor, "host_blocks": host_blocks}
    ours = KvoffloadConnector(vc, KVConnectorRole.SCHEDULER, kcc)
    shadow = Shadow(sched.connector, ours)
    for m in Shadow.METHODS:
        setattr(sched.connector, m, getattr(shadow, m))
    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK, sha256)
    system = [[1000 + i for i in range(96)], [2000 + i for i in range(80)]]
    waiting = (many_prompts(prompts) if running is not None else
               [system[i % 2] + [10 * i + k for k in range(20 + 7 * i)] for i in range(prompts)])
    late, late_reqs = [], []  # async loads: completions reported one step later
    loads_seen = stores_seen = preempted = 0
    for step in range(steps):
        shadow.step = step
        arrivals = (min(running // 8, running - len(sched.running) - len(sched.waiting))
                    if running is not None else int(step % 3 == 0))
        for _ in range(max(0, min(arrivals, len(waiting)))):
            i = prompts - len(waiting)
            sched.add_request(Request(f"r{i}", waiting.pop(0), SamplingParams(max_tokens=max_tokens), None,
                                      block_hasher=hasher))
        if abort is not None and step == abort[1]:
            sched.finish_requests(abort[0], RequestStatus.FINISHED_ABORTED)
        if reset_at is not None and step == reset_at:
            # The GPU prefix cache only: vLLM 0.21.0's OffloadingConnector has no reset_cache
            # (kvoffload's connector has one, for reset_connector=True; not compared here).
            sched.reset_prefix_cache()
        out = sched.schedule()
        mv, _ = shadow.last
        loads_seen += len(mv.load_jobs)
        stores_seen += len(mv.store_jobs)
        preempted += len(out.preempted_req_ids or ())
        done = OffloadingWorkerMetadata()
        recving = set(late_reqs)
        for j in late:
            done.mark_completed(j)
        late = list(mv.load_jobs) if async_loads else []
        late_reqs = [mv.load_jobs[j].req_id for j in late]
        for j in list(mv.store_jobs) + ([] if async_loads else list(mv.load_jobs)):
            done.mark_completed(j)
        if not async_loads:
            recving |= {mv.load_jobs[j].req_id for j in mv.load_jobs}
        fake_model_step(sched, out, recving, done)
        if not waiting and not sched.has_unfinished_requests() and not late:
            break
    stats = ours._sched.stats()
    print(f"diff {name}: {step + 1} steps, {loads_seen} load and {stores_seen} store jobs, "
          f"{stats['evictions']} evictions, {preempted} preemptions, "
          f"{len(shadow.diffs)} differences", flush=True)
    for d in shadow.diffs[:10]:
        print(f"  {d}")
    return step + 1, shadow.diffs


def main():
    runs = [
        ("shared-prefixes", dict(hybrid=False, factor=1)),
        ("factor-2", dict(hybrid=False, factor=2)),
        ("hybrid-f1", dict(hybrid=True, factor=1)),
        ("hybrid-f3", dict(hybrid=True, factor=3)),
        ("hybrid-f4", dict(hybrid=True, factor=4)),
        ("eviction", dict(hybrid=False, factor=1, host_blocks=12)),
        ("preemption", dict(hybrid=False, factor=1, gpu_blocks=20, max_tokens=40)),
        ("abort", dict(hybrid=True, factor=1, abort=("r2", 8))),
        ("reset-prefix-cache", dict(hybrid=False, factor=2, reset_at=10)),
        ("async-loads", dict(hybrid=True, factor=2, async_loads=True)),
        # Hundreds of requests sharing system prompts, loads of the same keys in one step:
        # kvoffload deferred such lookups without GPU prefix caching, vLLM does not.
        ("many-requests", dict(hybrid=False, factor=1, running=256, prompts=600,
                               gpu_blocks=256 * 24, host_blocks=4096, steps=60, max_tokens=40)),
        ("many-prefix-caching", dict(hybrid=False, factor=2, running=256, prompts=600,
                                     gpu_blocks=256 * 24, host_blocks=2048, steps=60,
                                     max_tokens=40, prefix_caching=True)),
        ("many-hybrid", dict(hybrid=True, factor=2, running=256, prompts=600,
                             gpu_blocks=256 * 24, host_blocks=2048, steps=60, max_tokens=40)),
    ]
    ok = True
    for name, kw in runs:
        try:
            steps, diffs = scenario(name, **kw)
        except Exception as e:  # a divergence can make one side refuse the other's inputs
            print(f"diff {name}: stopped by {type(e).__name__}: {e}")
            ok = False
            continue
        ok = ok and not diffs and steps >= 20
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
