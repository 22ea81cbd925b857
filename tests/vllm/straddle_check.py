"""The bug kvoffload's scheduler fixes, reproduced on vLLM 0.21.0's real code, and kvoffload's
answer to the same inputs.

Hybrid model (full attention + a 32-token sliding window), GPU blocks of 16 tokens, offloaded
blocks of 48 (factor 3). r0 (64 tokens) is offloaded; a filler request evicts its host blocks
while they stay in vLLM's GPU prefix cache; r1 = r0's prompt + 100 tokens then gets a 64-token
local hit, and its window group's blocks start with null blocks ([0, 0, b, ...]). Storing r1's
first offloaded block straddles them: vLLM 0.21.0's OffloadingConnector counts 3 GPU blocks
where 1 is real, and GPULoadStoreSpec asserts sum(group_sizes) == len(block_ids) in the
scheduler process. KvoffloadConnector, fed the same calls by the same Scheduler, emits the one
real block with its sub-block index.

That store leaves the window block's sub-blocks 0 and 1 unwritten (valid_from 2). The contract
as vLLM would have it with the counting fixed then serves the block: a new request with r0's
prompt would get 48 tokens and load sub-blocks 1-2 of it, sub-block 1 holding whatever the host
block held before. kvoffload's written-sub-block rule (docs/semantics.md 6.8) answers 0 there:
the intended difference, checked on the same scheduler state.

    python straddle_check.py        (exit 0: vLLM asserted and kvoffload's jobs were right)
"""

import sys
import traceback

from e2e_check import BLOCK, make_setup

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingWorkerMetadata,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager


def drive(connector):
    """Runs the scenario; returns the store jobs as (gpu ids, group sizes, block indices), the
    scheduler and the block hasher."""
    host_blocks = 8  # r0 takes 2 (one per group); the filler needs all 8, evicting them
    vc, kcc, _ = make_setup(hybrid=True, factor=3, prefix_caching=True)
    kvt = vc.kv_transfer_config
    if connector == "vllm":
        per_block = sum(t.size for t in kcc.kv_cache_tensors) // kcc.num_blocks
        kvt.kv_connector = "OffloadingConnector"
        kvt.kv_connector_module_path = None
        kvt.kv_connector_extra_config = {"block_size": 3 * BLOCK,
                                         "cpu_bytes_to_use": host_blocks * 3 * per_block}
    else:
        kvt.kv_connector_extra_config = {"block_size": 3 * BLOCK, "host_blocks": host_blocks}
    sched = Scheduler(vllm_config=vc, kv_cache_config=kcc,
                      structured_output_manager=StructuredOutputManager(vc), block_size=BLOCK)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK, sha256)
    prompt = list(range(1, 65))
    arrivals = {0: ("r0", prompt), 3: ("filler", list(range(500, 700))),
                8: ("r1", prompt + list(range(900, 1000)))}
    stores = []
    for step in range(40):
        if step in arrivals:
            rid, tokens = arrivals[step]
            sched.add_request(Request(rid, tokens, SamplingParams(max_tokens=1), None,
                                      block_hasher=hasher))
        out = sched.schedule()  # vLLM 0.21.0 asserts in here
        meta = out.kv_connector_metadata
        if connector == "vllm":
            jobs = list(meta.load_jobs) + list(meta.store_jobs)
            done = OffloadingWorkerMetadata()
            for j in jobs:
                done.mark_completed(j)
        else:
            from kvoffload.vllm import KvoffloadWorkerMetadata
            for j in meta.store_jobs:
                stores.append((j.request_id, [int(x) for x in j.gpu_block_ids],
                               [int(x) for x in j.group_sizes],
                               [int(x) for x in j.block_indices]))
            done = KvoffloadWorkerMetadata(
                {j.id: (1, True) for j in list(meta.load_jobs) + list(meta.store_jobs)})
        ids = list(out.num_scheduled_tokens)
        sched.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[[7] for _ in ids],
            kv_connector_output=KVConnectorOutput(kv_connector_worker_meta=done)))
        if step > 8 and not sched.has_unfinished_requests():
            break
    return stores, sched, hasher


def partly_written_is_a_miss(sched, hasher):
    """A lookup that would read r1's partly written window block from sub-block 1 on."""
    conn = sched.connector
    core = conn._sched
    probe = Request("probe", list(range(1, 65)), SamplingParams(max_tokens=1), None,
                    block_hasher=hasher)
    before = core.stats()
    core.update_request("probe", probe.num_tokens, [bytes(h) for h in probe.block_hashes])
    hit = core.lookup("probe", 0)
    after = core.stats()
    print(f"straddle: a new request with r0's prompt: kvoffload answers {hit} tokens (vLLM's "
          f"rule would serve 48, reading an unwritten sub-block); partial_stores "
          f"{after['partial_stores']}, partial_misses {before['partial_misses']} -> "
          f"{after['partial_misses']}")
    return (hit == 0 and after["partial_stores"] >= 1
            and after["partial_misses"] > before["partial_misses"])


def main():
    ok = True
    try:
        drive("vllm")
        print("straddle: vLLM 0.21.0's OffloadingConnector did NOT assert (expected it to)")
        ok = False
    except AssertionError:
        where = traceback.extract_tb(sys.exc_info()[2])[-1]
        print(f"straddle: vLLM 0.21.0 asserted at {where.filename.split('site-packages/')[-1]}:"
              f"{where.lineno} ({where.line})")
    stores, sched, hasher = drive("kvoffload")
    straddled = False
    for rid, ids, sizes, indices in stores:
        if sum(sizes) != len(ids):
            print(f"straddle: kvoffload store for {rid}: sum(group_sizes) {sum(sizes)} != "
                  f"{len(ids)} block ids")
            ok = False
        if rid == "r1" and any(i % 3 != 0 for i in indices):
            straddled = True
            print(f"straddle: kvoffload stores r1 with group sizes {sizes}, block indices "
                  f"{indices}, {len(ids)} GPU block ids (no null block among them: "
                  f"{0 not in ids})")
            ok = ok and 0 not in ids
    if not straddled:
        print("straddle: kvoffload emitted no store starting inside an offloaded block "
              "(the scenario did not happen)")
        ok = False
    if not partly_written_is_a_miss(sched, hasher):
        print("straddle: the partly written window block was not refused")
        ok = False
    print(f"straddle: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
