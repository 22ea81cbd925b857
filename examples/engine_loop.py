"""A serving engine's loop around kvoffload, in Python (the same story as engine_loop.cpp).

Six requests share two system prompts. Each step the "engine" decodes its running requests,
admits waiting ones (lookup: how much of the prompt is in host memory?), allocates GPU blocks,
lets the scheduler plan loads and stores, runs them on the worker (the "GPU" KV cache is a
NumPy array here; with PyTorch, pass kv.tensor_of(your_cuda_tensor) and backend="cuda"),
"computes" new tokens by writing each block's expected bytes, reports finished transfers and
finishes requests. Loaded blocks are compared with what they should hold.

    python examples/engine_loop.py [--quiet]
"""

import hashlib
import sys
import time

import numpy as np

import kvoffload as kv

BLOCK = 16  # tokens per GPU block and per block hash
FACTOR = 2  # GPU blocks per host block
GPU_BLOCKS = 128
PAGE = 512
DECODE = 20


def block_hash(tokens, b):
    """Chained over the tokens: equal prefixes give equal hashes."""
    return hashlib.blake2b(repr(tokens[: (b + 1) * BLOCK]).encode(), digest_size=16).digest()


def expected_page(h):
    return (np.frombuffer(h * (PAGE // len(h)), dtype=np.uint8) + np.arange(PAGE)).astype(np.uint8)


class Engine:
    def __init__(self, quiet=False):
        self.quiet = quiet
        self.gpu = np.zeros((GPU_BLOCKS, PAGE), dtype=np.uint8)
        config = kv.SchedulerConfig(groups=[kv.GroupConfig("full_attention", 16)],
                                    host_blocks=64, block_size_factor=FACTOR,
                                    gpu_blocks=GPU_BLOCKS)
        self.scheduler = kv.Scheduler(config)
        # The factor and the pool's size come from the scheduler's config: given once.
        self.worker = kv.Worker(kv.derive_worker_config(config, kv.WorkerConfig(
            tensors=[kv.tensor_of(self.gpu)], groups=[[(0, PAGE)]], threads=1)))
        self.free = list(range(GPU_BLOCKS - 1, 0, -1))  # block 0 is the null block
        self.waiting, self.running = [], {}
        self.steps = self.verified = self.mismatches = 0

    def add(self, rid, system_prompt, own_tokens):
        tokens = [("sys", system_prompt, t) for t in range(64)] + [(rid, t) for t in range(own_tokens)]
        self.waiting.append(dict(id=rid, tokens=tokens, prompt=len(tokens), computed=0,
                                 blocks=[], loads=[]))

    def step(self):
        log, scheduled = [], []
        for rid, r in self.running.items():  # decode: one token each
            pos = len(r["tokens"])
            r["tokens"].append((rid, "gen", pos))
            new = []
            if pos % BLOCK == 0:
                r["blocks"].append(self.free.pop())
                new = [r["blocks"][-1]]
            done_block = (pos + 1) % BLOCK == 0
            self.scheduler.extend_request(
                rid, pos + 1, [block_hash(r["tokens"], (pos + 1) // BLOCK - 1)] if done_block else [])
            scheduled.append(kv.ScheduledRequest(rid, r["computed"], 1, [new]))
        self.admit(scheduled, log)
        if not scheduled and not self.waiting:
            return False

        plan = self.scheduler.build_step(scheduled)
        if plan.flush:
            self.worker.wait(plan.flush)  # stores still reading blocks that were reused
        for job in plan.load_jobs:
            self.worker.submit(job)
            self.running[job.request_id]["loads"].append(job.id)
            log.append(f"load job {job.id} ({job.request_id}, {len(job.gpu_block_ids)} blocks)")
        self.compute(scheduled)
        for job in plan.store_jobs:
            self.worker.submit(job)
            log.append(f"store job {job.id} ({job.request_id}, {len(job.keys)} host blocks)")
        self.scheduler.on_completed(
            [kv.JobReport(f.job, ok=f.ok) for f in self.worker.get_finished()])
        for rid in [rid for rid, r in self.running.items() if r["computed"] >= r["prompt"] + DECODE]:
            r = self.running.pop(rid)
            self.scheduler.on_finished(rid)
            self.free.extend(r["blocks"])
            log.append(f"finish {rid}")
        if not self.quiet:
            print(f"step {self.steps:2d}: " + (", ".join(log) or "decode"))
        self.steps += 1
        return True

    def admit(self, scheduled, log):
        admitted = 0
        for r in list(self.waiting):
            if len(self.running) >= 4 or admitted >= 2:
                break
            hashes = [block_hash(r["tokens"], b) for b in range(r["prompt"] // BLOCK)]
            self.scheduler.update_request(r["id"], r["prompt"], hashes)
            hit = self.scheduler.lookup(r["id"], 0)
            if hit is None:  # its prefix is being stored or loaded: ask again next step
                log.append(f"{r['id']} deferred")
                continue
            self.waiting.remove(r)
            r["blocks"] = [self.free.pop() for _ in range(0, r["prompt"], BLOCK)]
            self.scheduler.on_allocated(r["id"], [kv.AllocatedGroup(r["blocks"])], hit)
            r["computed"] = hit  # those tokens arrive by the load job
            scheduled.append(kv.ScheduledRequest(r["id"], hit, r["prompt"] - hit, [r["blocks"]]))
            log.append(f"admit {r['id']} (prompt {r['prompt']}, {hit} from host)")
            self.running[r["id"]] = r
            admitted += 1

    def compute(self, scheduled):
        time.sleep(0.001)  # the forward pass; the offload copies run meanwhile
        for e in scheduled:
            r = self.running[e.request_id]
            if r["loads"]:
                self.worker.wait(r["loads"])
                for b in range(e.num_computed_tokens // BLOCK):
                    self.verified += 1
                    want = expected_page(block_hash(r["tokens"], b))
                    if not np.array_equal(self.gpu[r["blocks"][b]], want):
                        print(f"{r['id']} block {b} differs after its load", file=sys.stderr)
                        self.mismatches += 1
                r["loads"] = []
            r["computed"] = e.num_computed_tokens + e.num_scheduled_tokens
            for b in range(e.num_computed_tokens // BLOCK, r["computed"] // BLOCK):
                self.gpu[r["blocks"][b]] = expected_page(block_hash(r["tokens"], b))


def main(argv=()):
    engine = Engine(quiet="--quiet" in argv)
    for i in range(6):
        engine.add(f"req-{i}", i % 2, 20 + 3 * i)  # two shared system prompts
    while engine.step():
        if engine.steps > 1000:
            raise RuntimeError("no progress")
    print(f"engine_loop.py: {engine.steps} steps, {engine.verified} loaded blocks checked, "
          f"{engine.mismatches} mismatches")
    return 0 if engine.mismatches == 0 and engine.verified > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
