"""Provenance fuzzer: vLLM's real v1 Scheduler and KVCacheManager with KvoffloadConnector in
both roles, over CPU "KV caches" whose pages hold provenance tags instead of KV.

The fake model runner writes, for every GPU block a step computes, a tag naming what the block
holds: for an attention group (full or sliding window) the hash of the token prefix up to the
block's end (a block not yet complete gets a "partial" tag); for a mamba group (vLLM's align
mode) the hash of the prefix up to the token whose state the block holds, in the step's last
block and in every block whose end the step passes (the state at a block's end, as prefill
checkpoints keep it). It applies vLLM's kv_cache_block_copies before the forward pass. The
worker side copies tags exactly as it copies bytes, and every block a load brings back is
checked against the tag the request's own tokens give for that position: a block another
request computed, a partial block or a state at another token is a mismatch.

Each case is a random configuration with a printed seed: block_size_factor 1-4, a full-attention
group with a sliding-window and/or a mamba group, GPU prefix caching on or off, tiny GPU caches
(preemption, reuse of freed blocks), small host pools (stores retried for room), token budgets
from 32 to 512 (chunked prefill), prompts from a tree of shared segments and probes cut from
earlier prompts, aborts, vLLM's prefix cache reset between waves, and now and then
reset_prefix_cache(reset_running_requests=True), which preempts every running request between
steps (vLLM reports those preemptions with the next step).

    python provenance_fuzz.py [--cases N] [--seed S] [--steps N] [--seconds T] [--no-mamba]

Besides the loads, the fake forward pass checks everything it reads before it writes: every
earlier block of a full-attention group, the window's blocks, the mamba state at the step's first
token, whether computed, served by vLLM's prefix cache or loaded by kvoffload (a load that leaves
out a block the engine counts as loaded is caught there).

Exits non-zero on the first case with a mismatch or an exception raised into a step, or if no
loaded block (or, with mamba cases, no mamba block) was checked; prints the case's seed and
configuration. KVOFFLOAD_FUZZ_SEED=S replays.
"""

import argparse
import hashlib
import os
import random
import sys
import time
import traceback

import torch

from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                         SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        KVCacheTensor, MambaSpec, SlidingWindowSpec)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from e2e_check import HEAD_DIM, HEADS, make_model_dir

BLOCK = 16
PAGE_ELEMS = BLOCK * HEADS * HEAD_DIM  # float32: 1 KiB a page in every group


def tag(kind, group, tokens):
    """A page's provenance: what it was computed for (its group and token prefix)."""
    h = hashlib.blake2b(f"{kind}/{group}/".encode() + bytes(str(tokens), "ascii"),
                        digest_size=8).digest()
    return int.from_bytes(h, "little", signed=True)


class Case:
    def __init__(self, seed, model, steps, mamba=True):
        self.rng = rng = random.Random(seed)
        self.seed, self.steps = seed, steps
        self.f = rng.randint(1, 4)
        self.kinds = ["full"]
        if rng.random() < 0.7:
            self.kinds.append(("window", rng.choice([16, 24, 40, 64])))
        if rng.random() < 0.6 and mamba:
            self.kinds.append("mamba")
        rng.shuffle(self.kinds)
        self.mamba = "mamba" in self.kinds
        self.prefix_caching = self.mamba or rng.random() < 0.6  # align mode needs it
        self.num_blocks = rng.choice([48, 64, 96, 160])
        self.host_blocks = rng.choice([8, 16, 32, 64, 128])
        self.budget = rng.choice([32, 64, 128, 256, 512])
        self.model = model

    def describe(self):
        kinds = [k if isinstance(k, str) else f"window{k[1]}" for k in self.kinds]
        return (f"seed {self.seed}: groups {kinds}, f={self.f}, prefix caching "
                f"{self.prefix_caching}, {self.num_blocks} GPU blocks, {self.host_blocks} host "
                f"blocks, {self.budget} tokens a step")

    def build(self):
        specs, layers = [], []
        for g, k in enumerate(self.kinds):
            if k == "full":
                specs.append(FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS,
                                               head_size=HEAD_DIM, dtype=torch.float32))
            elif k == "mamba":
                specs.append(MambaSpec(block_size=BLOCK, shapes=((PAGE_ELEMS,),),
                                       dtypes=(torch.float32,), mamba_cache_mode="align"))
            else:
                specs.append(SlidingWindowSpec(block_size=BLOCK, num_kv_heads=HEADS,
                                               head_size=HEAD_DIM, dtype=torch.float32,
                                               sliding_window=k[1]))
            layers.append(f"layer{g}")

        def tensor(spec, layer):
            size = self.num_blocks * spec.page_size_bytes
            if "shared_by" in KVCacheTensor.__dataclass_fields__:
                return KVCacheTensor(size=size, shared_by=[layer])
            return KVCacheTensor(size=size, layers=[layer], layer_stride=size,
                                 block_stride=spec.page_size_bytes)

        kcc = KVCacheConfig(
            num_blocks=self.num_blocks,
            kv_cache_tensors=[tensor(s, l) for s, l in zip(specs, layers)],
            kv_cache_groups=[KVCacheGroupSpec([l], s) for s, l in zip(specs, layers)])
        cache = CacheConfig(block_size=BLOCK, cache_dtype="auto",
                            enable_prefix_caching=self.prefix_caching)
        if self.mamba:
            cache.mamba_cache_mode = "align"
        vc = VllmConfig(
            model_config=ModelConfig(model=self.model, skip_tokenizer_init=True,
                                     dtype="float32", seed=0, max_model_len=2048),
            scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=self.budget,
                                             max_model_len=2048, enable_chunked_prefill=True,
                                             is_encoder_decoder=False),
            cache_config=cache,
            kv_transfer_config=KVTransferConfig(
                kv_connector="KvoffloadConnector", kv_connector_module_path="kvoffload.vllm",
                kv_role="kv_both",
                kv_connector_extra_config={"block_size": BLOCK * self.f,
                                           "host_blocks": self.host_blocks}),
            device_config=DeviceConfig("cpu"))
        vc.scheduler_config.disable_hybrid_kv_cache_manager = False
        vc.scheduler_config.async_scheduling = False  # the synchronous Scheduler, as engines
        vc.cache_config.num_gpu_blocks = self.num_blocks
        return vc, kcc, layers

    def prompts(self, n):
        """Prompts over a tree of shared segments (shared prefixes of many lengths), and probes:
        an earlier prompt cut anywhere, then new tokens (a hit ending inside its window)."""
        rng = self.rng
        longest = self.num_blocks * BLOCK // 3  # several must fit in the GPU cache at once
        segments = [[rng.randrange(3, 1000) for _ in range(rng.randint(8, 120))]
                    for _ in range(10)]
        tree = {0: []}
        for node in range(1, 10):
            tree[node] = tree[rng.randrange(0, node)] + segments[node]
        out = []
        for i in range(n):
            if i and rng.random() < 0.4:
                src = out[rng.randrange(0, i)]
                base = src[:rng.randint(1, len(src))]
            else:
                base = tree[rng.randrange(0, 10)]
            p = base + [rng.randrange(3, 1000) for _ in range(rng.randint(1, 60))]
            out.append(p[-longest:] if len(p) > longest else p)
        return out

    def reads(self, g, start, toks):
        """(block index, expected tag) of what computing from token `start` on reads in group
        g: full attention every earlier block, a sliding window the blocks of its last
        window - 1 tokens, mamba the state at `start` (in the block holding that token)."""
        if start == 0:
            return []
        kind = self.kinds[g]

        def held(b, mamba):  # the tag block b holds once `start` tokens are computed
            k = "mamba" if mamba else "attn"
            if (b + 1) * BLOCK <= start:
                return tag(k, g, toks[:(b + 1) * BLOCK])
            return tag("partial-" + k, g, toks[:start])
        last = -(-start // BLOCK) - 1
        if kind == "mamba":
            return [(last, held(last, True))]
        first = 0 if kind == "full" else max(0, start - kind[1] + 1) // BLOCK
        return [(b, held(b, False)) for b in range(first, last + 1)]

    def run(self):
        vc, kcc, layers = self.build()
        sched = Scheduler(vllm_config=vc, kv_cache_config=kcc,
                          structured_output_manager=StructuredOutputManager(vc),
                          block_size=BLOCK, log_stats=True)
        from kvoffload.vllm import KvoffloadConnector
        worker = KvoffloadConnector(vc, KVConnectorRole.WORKER, kcc)
        caches = {l: torch.zeros(self.num_blocks, PAGE_ELEMS, dtype=torch.float32)
                  for l in layers}
        worker.register_kv_caches(caches)
        page = {l: caches[l].view(torch.int64) for l in layers}
        preempted = []
        preempt = sched._preempt_request

        def counting(*args, **kwargs):
            preempted.append(1)
            return preempt(*args, **kwargs)
        sched._preempt_request = counting
        per_kind = {"full": 0, "window": 0, "mamba": 0}
        init_none_hash(sha256)
        hasher = get_request_block_hasher(BLOCK, sha256)
        rng = self.rng
        prompts = self.prompts(40)
        requests, arrivals = {}, 0
        checked = mismatched = loads = aborts = resets = reads = 0
        first = None
        wave = rng.randint(3, 8)  # requests a wave; between waves vLLM's prefix cache may go
        for step in range(self.steps):
            if not sched.has_unfinished_requests() and arrivals % wave == 0 and arrivals:
                # Between waves: what the next wave shares must come from kvoffload.
                if rng.random() < 0.7 and sched.reset_prefix_cache(
                        reset_connector=rng.random() < 0.1):
                    resets += 1
            if arrivals < len(prompts) and (rng.random() < 0.5 or not sched.has_unfinished_requests()) \
                    and (arrivals % wave != 0 or not sched.has_unfinished_requests() or not arrivals):
                r = Request(f"q{arrivals}", prompts[arrivals],
                            SamplingParams(max_tokens=rng.randint(1, 24), ignore_eos=True),
                            None, block_hasher=hasher)
                arrivals += 1
                requests[r.request_id] = r
                sched.add_request(r)
            if requests and rng.random() < 0.03:  # a client goes away
                rid = rng.choice(sorted(requests))
                if not requests[rid].is_finished():
                    sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
                    aborts += 1
            # Preempts every running request between steps. vLLM raises when blocks stay held
            # (a request waiting for a load): the engine would stop there, so the case ends.
            if rng.random() < 0.01 and not any(
                    q.status == RequestStatus.WAITING_FOR_REMOTE_KVS
                    for q in sched.requests.values()):
                try:
                    if sched.reset_prefix_cache(reset_running_requests=True,
                                                reset_connector=rng.random() < 0.2):
                        resets += 1
                except RuntimeError as e:
                    if "Failed to reset KV cache" not in str(e):
                        raise
                    break
            out = sched.schedule()
            meta = out.kv_connector_metadata
            if out.preempted_req_ids:
                worker.handle_preemptions(meta)
            worker.bind_connector_metadata(meta)
            worker.start_load_kv(None)
            if meta.load_jobs:
                worker._worker.wait([j.id for j in meta.load_jobs])
                for job in meta.load_jobs:
                    req = requests[job.request_id]
                    at = 0
                    for g, layer in enumerate(layers):
                        size, first_block = int(job.group_sizes[g]), int(job.block_indices[g])
                        kind = "mamba" if self.kinds[g] == "mamba" else "attn"
                        for i in range(size):
                            b = first_block + i
                            want = tag(kind, g, req.all_token_ids[:(b + 1) * BLOCK])
                            bid = int(job.gpu_block_ids[at + i])
                            checked += 1
                            per_kind[self.kinds[g] if isinstance(self.kinds[g], str)
                                     else "window"] += 1
                            if not bool((page[layer][bid] == want).all()):
                                mismatched += 1
                                first = first or (f"step {step}: load job {job.id} of "
                                                  f"{job.request_id}, group {g} ({self.kinds[g]}), "
                                                  f"block {b} (GPU block {bid}) does not hold "
                                                  f"what the request's tokens give")
                        at += size
                    loads += 1
            for c in getattr(out, "kv_cache_block_copies", None) or ():
                for layer in layers:
                    caches[layer][c.dst_block_id] = caches[layer][c.src_block_id]
            # The fake forward pass: first what each scheduled token range reads (everything the
            # engine holds for its earlier tokens, whether computed, cached or loaded), then tags
            # for what it computes.
            for rid, n in out.num_scheduled_tokens.items():
                req = requests[rid]
                blocks = sched.kv_cache_manager.get_block_ids(rid)
                end = req.num_computed_tokens  # schedule() already advanced it
                start = end - n
                toks = req.all_token_ids
                for g, layer in enumerate(layers):
                    for b, want in self.reads(g, start, toks):
                        bid = blocks[g][b] if b < len(blocks[g]) else 0
                        reads += 1
                        if bid == 0 or not bool((page[layer][bid] == want).all()):
                            mismatched += 1
                            first = first or (f"step {step}: {rid} computing tokens {start}-{end} "
                                              f"reads group {g} ({self.kinds[g]}) block {b} "
                                              f"(GPU block {bid}), which does not hold what its "
                                              f"tokens give")
                for g, layer in enumerate(layers):
                    mamba = self.kinds[g] == "mamba"
                    kind = "mamba" if mamba else "attn"
                    for b in range(start // BLOCK, -(-end // BLOCK)):
                        if b >= len(blocks[g]) or blocks[g][b] == 0:
                            continue
                        whole = (b + 1) * BLOCK <= end
                        last = b == -(-end // BLOCK) - 1
                        if whole:
                            page[layer][blocks[g][b]] = tag(kind, g, toks[:(b + 1) * BLOCK])
                        elif last:  # an incomplete block: its state (mamba) or partial KV
                            page[layer][blocks[g][b]] = tag("partial-" + kind, g, toks[:end])
            worker.wait_for_save()
            sending, recving = worker.get_finished(out.finished_req_ids)
            wmeta = worker.build_connector_worker_meta()
            worker.clear_connector_metadata()
            ids = list(out.num_scheduled_tokens)
            sched.update_from_output(out, ModelRunnerOutput(
                req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=[[rng.randrange(3, 1000)] for _ in ids],
                kv_connector_output=KVConnectorOutput(
                    finished_sending=sending or None, finished_recving=recving or None,
                    kv_connector_worker_meta=wmeta)))
            if arrivals == len(prompts) and not sched.has_unfinished_requests():
                break
        stats = sched.connector._sched.stats()
        return {"checked": checked, "mismatched": mismatched, "loads": loads, "aborts": aborts,
                "reads": reads,
                "resets": resets, "steps": step + 1, "first": first,
                "stored": stats["blocks_stored"], "reused": stats.get("reused_sub_blocks", 0),
                "partial": stats["partial_stores"], "preemptions": len(preempted),
                "per_kind": per_kind, "unsafe": stats.get("unsafe_skips", 0)}


def main():
    ap = argparse.ArgumentParser()
    # The defaults are CI's slice (scripts/vllm-test); scripts/vllm-test fuzz runs longer.
    ap.add_argument("--cases", type=int, default=150)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=90,
                    help="stop after the case running at this time (0: no limit)")
    ap.add_argument("--no-mamba", action="store_true", help="attention groups only")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else int(os.environ.get("KVOFFLOAD_FUZZ_SEED", 0)) or \
        random.SystemRandom().randrange(1, 2**31)
    print(f"provenance fuzz: seed {seed} (replay: --seed {seed})", flush=True)
    model = make_model_dir("float32")
    seeds = random.Random(seed)
    t0 = time.time()
    totals = {"checked": 0, "loads": 0, "reused": 0, "partial": 0, "mamba": 0, "window": 0,
              "preemptions": 0, "aborts": 0, "reads": 0}
    kinds = {"full": 0, "window": 0, "mamba": 0}
    for i in range(a.cases):
        case = Case(seeds.randrange(1, 2**31), model, a.steps, mamba=not a.no_mamba)
        try:
            r = case.run()
        except Exception:  # an exception into a step: what killed vLLM's engine core
            print(f"provenance fuzz: FAILED: case {i}, {case.describe()}: exception in a step",
                  flush=True)
            traceback.print_exc()
            return 1
        if r["mismatched"]:
            print(f"provenance fuzz: FAILED: case {i}, {case.describe()}: {r['mismatched']} "
                  f"blocks wrong ({r['checked']} loaded, {r['reads']} read checked); first: "
                  f"{r['first']}", flush=True)
            return 1
        for k in ("checked", "loads", "reused", "partial", "preemptions", "aborts", "reads"):
            totals[k] += r[k]
        for k, v in r["per_kind"].items():
            kinds[k] += v
        totals["mamba"] += case.mamba
        totals["window"] += any(not isinstance(k, str) for k in case.kinds)
        print(f"  case {i}: {case.describe()}: {r['steps']} steps, {r['loads']} loads, "
              f"{r['checked']} blocks checked, {r['stored']} stored ({r['partial']} partly, "
              f"{r['reused']} sub-blocks handed out again, {r['unsafe']} unsafe), "
              f"{r['aborts']} aborts, {r['resets']} resets, {r['preemptions']} preemptions",
              flush=True)
        if a.seconds and time.time() - t0 > a.seconds:
            break
    if totals["checked"] == 0 or (totals["mamba"] and kinds["mamba"] == 0):
        print(f"provenance fuzz: FAILED: loaded blocks checked {kinds}: the run proves nothing",
              flush=True)
        return 1
    print(f"provenance fuzz: {i + 1} cases, {totals['loads']} loads, {totals['checked']} loaded "
          f"blocks checked ({kinds}) and {totals['reads']} blocks read by the forward passes, 0 "
          f"wrong; {totals['partial']} partly written stores, "
          f"{totals['reused']} sub-blocks handed out again before their store, "
          f"{totals['preemptions']} preemptions, {totals['aborts']} aborts; {totals['mamba']} "
          f"cases with mamba, {totals['window']} with a window ({time.time() - t0:.0f} s)",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
