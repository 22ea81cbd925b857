"""The GPU bundle's PyTorch check: kvoffload's CUDA backend on real CUDA tensors.

An engine loop over a Llama-3-8B-like KV cache (32 layers, K and V as separate tensors, 16-token
blocks of bf16, 8 KV heads of 128): each prompt's KV is written on a torch stream behind a
long GPU sleep (so the writes land late), the store jobs of those blocks are submitted right
away with that stream as the compute stream (the host never synchronizes), and a second
request with the same prompt loads them into other blocks, compared with torch.equal. Parts:

  default-stream  the compute stream is torch's default stream (handle 0)
  side-stream     a torch.cuda.Stream
  many-streams    three streams in turn, switched with Worker.set_compute_stream
  hybrid          two groups (full attention and a 32-token sliding window), f = 4
  batch-store     side-stream with the copy mode forced to batch (WorkerConfig copy_mode):
                  the automatic mode stages these 32 KiB pages, so only this part shows that a
                  batched store reads the KV in stream order, after the forward pass
  control         no compute stream: the stores are expected to race the writes (reported,
                  never failed: it shows the check can see the race this library prevents)

    python3 torch_check.py OUT.json
    python3 torch_check.py --cpu OUT.json   the same engine loop on CPU tensors and the host
                                            backend (no streams): checks this script's logic
"""

import dataclasses
import hashlib
import json
import sys
import time
import traceback

import torch

import kvoffload as kv

LAYERS, HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16
PROMPT_TOKENS = 256  # 16 blocks
PROMPTS = 4
# Two requests per prompt, each with a full block list in each of up to two groups.
GPU_BLOCKS = 1 + PROMPTS * 2 * 2 * (PROMPT_TOKENS // BLOCK) + 8
SLEEP_CYCLES = 40_000_000  # about 20 ms: the writes land well after the stores are submitted


def hashes(prompt):
    return [hashlib.sha256(f"{prompt}/{i}".encode()).digest()[:16]
            for i in range(PROMPT_TOKENS // BLOCK)]


DEVICE = "cuda"


class Cache:
    """Per group, per layer K and V tensors [GPU_BLOCKS, 16, 8, 128] bf16."""

    def __init__(self, groups):
        self.tensors, self.group_tensors = [], []
        for g in range(groups):
            ids = []
            for _ in range(2 * LAYERS // groups):
                self.tensors.append(torch.zeros(GPU_BLOCKS, BLOCK, HEADS, HEAD_DIM,
                                                dtype=torch.bfloat16, device=DEVICE))
                ids.append(len(self.tensors) - 1)
            self.group_tensors.append(ids)
        self.base = (torch.arange(BLOCK * HEADS * HEAD_DIM, device=DEVICE) % 89).reshape(
            BLOCK, HEADS, HEAD_DIM).to(torch.bfloat16)
        self.page = self.tensors[0][0].numel() * self.tensors[0].element_size()
        if DEVICE == "cuda":
            torch.cuda.synchronize()

    def value(self, prompt, g, k, j):
        """The page of tensor k of group g for request block j of `prompt` (exact in bf16)."""
        return self.base + float((prompt * 131 + g * 17 + k * 7 + j * 3) % 101)

    def write(self, prompt, g, blocks):
        """On the current stream: the forward pass writing this prompt's blocks of group g."""
        idx = torch.tensor(blocks, device=DEVICE)
        for k, t in enumerate(self.group_tensors[g]):
            vals = torch.stack([self.value(prompt, g, k, j) for j in range(len(blocks))])
            self.tensors[t].index_copy_(0, idx, vals)


def batch_mode():
    """WorkerConfig arguments forcing the CUDA backend's batch copy mode."""
    if "copy_mode" not in {f.name for f in dataclasses.fields(kv.WorkerConfig)}:
        raise RuntimeError("kvoffload.WorkerConfig has no copy_mode field: batch mode cannot "
                           "be forced")
    return {"copy_mode": "batch"}


def run_part(name, groups, factor, window, stream_for, compute_stream_set=True, extra=None):
    extra = extra() if extra else {}
    cache = Cache(groups)
    kinds = [kv.GroupConfig("full_attention", BLOCK)]
    if groups == 2:
        kinds.append(kv.GroupConfig("sliding_window", BLOCK, sliding_window=window))
    host_blocks = 4 * PROMPTS * groups * (PROMPT_TOKENS // BLOCK) // factor
    sched = kv.Scheduler(kv.SchedulerConfig(groups=kinds, block_size_factor=factor,
                                            host_blocks=host_blocks))
    first_stream = stream_for(0)
    cuda = DEVICE == "cuda"
    worker = kv.Worker(kv.WorkerConfig(
        tensors=[kv.tensor_of(t) for t in cache.tensors],
        groups=[[(t, cache.page) for t in ids] for ids in cache.group_tensors],
        host_blocks=host_blocks, block_size_factor=factor, backend="cuda" if cuda else "host",
        compute_stream=first_stream if compute_stream_set and cuda else None, **extra))
    free = list(range(GPU_BLOCKS - 1, 0, -1))
    n = PROMPT_TOKENS // BLOCK
    checked = mismatched = 0
    for p in range(PROMPTS):
        stream = stream_for(p)
        if compute_stream_set and cuda:
            worker.set_compute_stream(stream)
        # The first request computes the prompt; its stores start at once.
        rid = f"s{p}"
        sched.update_request(rid, PROMPT_TOKENS, hashes(f"{name}/{p}"))
        assert sched.lookup(rid, 0) == 0
        sched.on_allocated(rid, [kv.AllocatedGroup([]) for _ in range(groups)], 0)
        blocks = [[free.pop() for _ in range(n)] for _ in range(groups)]
        if cuda:
            with torch.cuda.stream(stream):
                torch.cuda._sleep(SLEEP_CYCLES)
                for g in range(groups):
                    cache.write(p, g, blocks[g])
        else:
            for g in range(groups):
                cache.write(p, g, blocks[g])
        step = sched.build_step([kv.ScheduledRequest(rid, 0, PROMPT_TOKENS, blocks)])
        worker.submit_step(step)  # no synchronization with the writes above
        worker.wait([j.id for j in step.store_jobs])
        done = worker.get_finished()
        assert all(f.ok for f in done), [f.error for f in done if not f.ok]
        sched.on_completed([kv.JobReport(f.job, ok=f.ok) for f in done])
        sched.on_finished(rid)
        # A second request with the same prompt loads it into other blocks.
        rid = f"l{p}"
        sched.update_request(rid, PROMPT_TOKENS, hashes(f"{name}/{p}"))
        hit = sched.lookup(rid, 0)
        assert hit and hit > 0, f"no hit for prompt {p}: {hit}"
        # Blocks for the whole prompt, as an engine allocates them (the window group's hit
        # blocks outside the window are the null block 0, counted as computed).
        hb = hit // BLOCK
        lists = [[free.pop() for _ in range(n)]]
        alloc = [kv.AllocatedGroup(lists[0])]
        if groups == 2:
            real = min(hb, window // BLOCK)
            lists.append([0] * (hb - real) + [free.pop() for _ in range(n - (hb - real))])
            alloc.append(kv.AllocatedGroup(lists[1], num_computed_blocks=hb - real))
        sched.on_allocated(rid, alloc, hit)
        step = sched.build_step([kv.ScheduledRequest(rid, hit, PROMPT_TOKENS - hit, lists)])
        assert step.load_jobs, "the hit planned no load"
        worker.submit_step(step)
        worker.wait([j.id for j in step.load_jobs])
        done = worker.get_finished()
        assert all(f.ok for f in done), [f.error for f in done if not f.ok]
        sched.on_completed([kv.JobReport(f.job, ok=f.ok) for f in done])
        if cuda:
            torch.cuda.synchronize()
        for job in step.load_jobs:
            at = 0
            for g in range(groups):
                size, first = int(job.group_sizes[g]), int(job.block_indices[g])
                for i in range(size):
                    gid = int(job.gpu_block_ids[at + i])
                    for k, t in enumerate(cache.group_tensors[g]):
                        checked += 1
                        if not torch.equal(cache.tensors[t][gid], cache.value(p, g, k, first + i)):
                            mismatched += 1
                at += size
        sched.on_finished(rid)
    stats = worker.cuda_stats() if cuda else None
    del worker
    out = {"pages_checked": checked, "mismatched": mismatched, "cuda_stats": stats}
    if extra.get("copy_mode") == "batch" and cuda:
        # The part is about batch stores: a silent fallback to another mode would prove nothing.
        assert stats and stats["jobs_batch"] > 0 and stats["jobs_staged"] == 0, stats
    return out


def main():
    global DEVICE
    args = sys.argv[1:]
    if args and args[0] == "--cpu":
        DEVICE = "cpu"
        args = args[1:]
    out_path = args[0] if args else "torch.json"
    cuda = DEVICE == "cuda"
    try:  # issue 31: the engine benchmark runs on a GPU only where the image has vLLM
        import importlib.metadata
        vllm_found = importlib.metadata.version("vllm")
    except Exception as e:  # noqa: BLE001 (not installed: say so)
        vllm_found = f"not installed ({type(e).__name__})"
    results = {"torch": torch.__version__, "vllm": vllm_found,
               "device": torch.cuda.get_device_name(0) if cuda else "cpu",
               "kvoffload_built_with_cuda": kv.built_with_cuda(), "parts": {}}
    side = [torch.cuda.Stream() for _ in range(3)] if cuda else [None] * 3
    parts = [
        ("default-stream", 1, 1, 0, lambda p: torch.cuda.default_stream() if cuda else None,
         True),
        ("side-stream", 1, 1, 0, lambda p: side[0], True),
        ("many-streams", 1, 1, 0, lambda p: side[p % 3], True),
        ("hybrid", 2, 4, 32, lambda p: side[1], True),
        ("batch-store", 1, 1, 0, lambda p: side[0], True, batch_mode),
        ("control", 1, 1, 0, lambda p: side[2], False),
    ]
    if not cuda:  # streams mean nothing here, and the control has no race to show
        parts = [p for p in parts if p[0] in ("side-stream", "hybrid")]
    ok = True
    for name, groups, factor, window, stream_for, with_stream, *extra in parts:
        start = time.time()
        try:
            r = run_part(name, groups, factor, window, stream_for, with_stream, *extra)
            if name == "control":
                r["race_observed"] = r["mismatched"] > 0
                r["status"] = "info"
            else:
                r["status"] = "pass" if r["mismatched"] == 0 and r["pages_checked"] > 0 else "fail"
        except Exception as e:  # report and go on with the other parts
            r = {"status": "fail", "error": f"{type(e).__name__}: {e}",
                 "traceback": traceback.format_exc()}
        r["seconds"] = round(time.time() - start, 2)
        results["parts"][name] = r
        ok = ok and r["status"] != "fail"
        print(f"torch {name}: {r['status']} {json.dumps({k: v for k, v in r.items() if k != 'traceback'})}",
              flush=True)
    with open(out_path, "w") as f:
        json.dump(results, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
