"""kvoffload's vLLM connector end to end, on the CPU: vLLM's real v1 Scheduler with
KvoffloadConnector in the scheduler role, the same connector in the worker role over CPU KV
tensors (the host backend), and a fake model runner that writes a per-token pattern into each
block it computes. Requests share prefixes; later ones get hits, their blocks are loaded back
and compared byte for byte with the pattern of the tokens they hold.

    python e2e_check.py [--hybrid]      (in a virtual environment with vLLM and kvoffload)

Exits non-zero on any mismatch or if nothing was loaded.
"""

import json
import os
import sys
import tempfile

import torch

from vllm.config import (CacheConfig, DeviceConfig, KVEventsConfig, KVTransferConfig,
                         ModelConfig, SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        KVCacheTensor, SlidingWindowSpec)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

BLOCK, HEADS, HEAD_DIM, NUM_BLOCKS = 16, 2, 8, 96


def make_model_dir(dtype="bfloat16"):
    """A tiny Llama config.json (no weights: the scheduler side never loads them); also
    provenance_fuzz.py's."""
    d = tempfile.mkdtemp(prefix="kvoffload-vllm-model-")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                   "num_key_value_heads": HEADS, "num_hidden_layers": 2, "vocab_size": 1000,
                   "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
                   "torch_dtype": dtype, "head_dim": HEAD_DIM}, f)
    return d


def make_setup(hybrid, factor, prefix_caching):
    specs = [FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD_DIM,
                               dtype=torch.bfloat16)]
    if hybrid:
        specs.append(SlidingWindowSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD_DIM,
                                       dtype=torch.bfloat16, sliding_window=32))
    layers = [f"layer{g}" for g in range(len(specs))]
    def tensor(spec, layer):  # vLLM 0.21 names the sharing layers; later ones a layout
        size = NUM_BLOCKS * spec.page_size_bytes
        if "shared_by" in KVCacheTensor.__dataclass_fields__:
            return KVCacheTensor(size=size, shared_by=[layer])
        return KVCacheTensor(size=size, layers=[layer], layer_stride=size,
                             block_stride=spec.page_size_bytes)

    kcc = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[tensor(s, l) for s, l in zip(specs, layers)],
        kv_cache_groups=[KVCacheGroupSpec([l], s) for s, l in zip(specs, layers)])
    vc = VllmConfig(
        model_config=ModelConfig(model=make_model_dir(), skip_tokenizer_init=True,
                                 dtype="bfloat16", seed=0, max_model_len=4096),
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256,
                                         max_model_len=4096, enable_chunked_prefill=True,
                                         is_encoder_decoder=False),
        cache_config=CacheConfig(block_size=BLOCK, cache_dtype="auto", enable_prefix_caching=prefix_caching),
        kv_transfer_config=KVTransferConfig(
            kv_connector="KvoffloadConnector", kv_connector_module_path="kvoffload.vllm",
            kv_role="kv_both",
            kv_connector_extra_config={"block_size": BLOCK * factor, "host_blocks": 24}),
        device_config=DeviceConfig("cpu"),
        kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null"))
    vc.scheduler_config.disable_hybrid_kv_cache_manager = False
    # This check drives vLLM's synchronous Scheduler; the connector refuses async scheduling
    # (not proven: docs/vllm-mapping.md, "Engine features"), vLLM's default on 0.21 and 0.33.
    vc.scheduler_config.async_scheduling = False
    vc.cache_config.num_gpu_blocks = NUM_BLOCKS
    return vc, kcc, layers


def fake_model_step(sched, out, recving, worker_meta):
    """The model ran `out`: one sampled token (7) per scheduled request, the loads of
    `recving` finished, the workers' metadata reported."""
    ids = list(out.num_scheduled_tokens)
    sched.update_from_output(out, ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=[[7] for _ in ids],
        kv_connector_output=KVConnectorOutput(finished_recving=recving or None,
                                              kv_connector_worker_meta=worker_meta)))


def page_of(token_ids):
    """The KV page the fake model writes for a block holding these tokens."""
    t = torch.tensor(token_ids, dtype=torch.float32)
    return (t[:, None, None] % 97 + torch.arange(HEADS * HEAD_DIM).reshape(HEADS, HEAD_DIM) % 7
            ).to(torch.bfloat16)


def run(hybrid, factor, prefix_caching=False):
    vc, kcc, layers = make_setup(hybrid, factor, prefix_caching)
    sched = Scheduler(vllm_config=vc, kv_cache_config=kcc,
                      structured_output_manager=StructuredOutputManager(vc), block_size=BLOCK,
                      log_stats=True)
    from kvoffload.vllm import KvoffloadConnector
    assert type(sched.connector).__name__ == "KvoffloadConnector", type(sched.connector)
    worker = KvoffloadConnector(vc, KVConnectorRole.WORKER, kcc)
    caches = {l: torch.zeros(NUM_BLOCKS, BLOCK, HEADS, HEAD_DIM, dtype=torch.bfloat16)
              for l in layers}
    worker.register_kv_caches(caches)
    # vLLM's scheduler takes the connector's KV events every step: count what it publishes.
    published = {"stored": 0, "removed": 0}
    take = sched.connector.take_events

    def counting_take_events():
        events = list(take())
        for ev in events:
            kind = "removed" if type(ev).__name__ == "BlockRemoved" else "stored"
            published[kind] += len(ev.block_hashes)
        return events

    sched.connector.take_events = counting_take_events
    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK, sha256)
    system = [[1000 + i for i in range(96)], [2000 + i for i in range(80)]]
    prompts = [system[i % 2] + [10 * i + k for k in range(20 + 7 * i)] for i in range(8)]
    requests = {}
    pending = list(range(len(prompts)))
    checked = mismatched = loaded_steps = 0
    for step in range(400):
        if pending and step % 6 == 0:  # a new request every few steps: earlier ones get stored
            i = pending.pop(0)
            r = Request(f"r{i}", prompts[i], SamplingParams(max_tokens=6), None,
                        block_hasher=hasher)
            requests[r.request_id] = r
            sched.add_request(r)
        out = sched.schedule()
        meta = out.kv_connector_metadata
        worker.bind_connector_metadata(meta)
        worker.start_load_kv(None)
        if meta.load_jobs:
            loaded_steps += 1
            worker._worker.wait([j.id for j in meta.load_jobs])
            for job in meta.load_jobs:  # every loaded block against the tokens it holds
                req = requests[job.request_id]
                at = 0
                for g, layer in enumerate(layers):
                    size, first = int(job.group_sizes[g]), int(job.block_indices[g])
                    for i in range(size):
                        b = first + i
                        want = page_of(req.all_token_ids[b * BLOCK:(b + 1) * BLOCK])
                        got = caches[layer][int(job.gpu_block_ids[at + i])]
                        checked += 1
                        if not torch.equal(got, want):
                            mismatched += 1
                    at += size
        # The fake forward pass: every scheduled token's KV, block by block.
        ids = list(out.num_scheduled_tokens)
        for rid in ids:
            req = requests[rid]
            blocks = sched.kv_cache_manager.get_block_ids(rid)
            end = req.num_computed_tokens  # schedule() has already advanced it
            start = end - out.num_scheduled_tokens[rid]
            for g, layer in enumerate(layers):
                for b in range(start // BLOCK, -(-end // BLOCK)):
                    bid = blocks[g][b]
                    if bid == 0:
                        continue
                    tokens = req.all_token_ids[b * BLOCK:(b + 1) * BLOCK]
                    if len(tokens) == BLOCK:
                        caches[layer][bid] = page_of(tokens)
        worker.wait_for_save()
        sending, recving = worker.get_finished(out.finished_req_ids)
        wmeta = worker.build_connector_worker_meta()
        worker.clear_connector_metadata()
        mro = ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[[7] for _ in ids],
            kv_connector_output=KVConnectorOutput(finished_sending=sending or None,
                                                  finished_recving=recving or None,
                                                  kv_connector_worker_meta=wmeta))
        sched.update_from_output(out, mro)
        if not pending and not sched.has_unfinished_requests():
            break
    stats = sched.connector._sched.stats()
    print(f"vllm e2e hybrid={hybrid} f={factor}: {step + 1} steps, {checked} loaded blocks "
          f"checked, {mismatched} mismatched, {loaded_steps} steps with loads, "
          f"stored {stats['blocks_stored']} host blocks, hits {stats['hits']}, KV events: "
          f"{published['stored']} stored, {published['removed']} removed (partial stores "
          f"{stats['partial_stores']}, not published)", flush=True)
    # Every whole block stored reached vLLM's event publisher as one BlockStored hash, and
    # every eviction of one as one BlockRemoved hash; a block stored without its leading
    # sub-blocks (partial_stores) is never published (a router would take it for whole).
    partial = stats["partial_stores"]
    if (published["stored"] != stats["blocks_stored"] - partial or
            not stats["evictions"] - partial <= published["removed"] <= stats["evictions"]):
        print(f"vllm e2e: events {published} for {stats['blocks_stored']} stored blocks and "
              f"{stats['evictions']} evictions")
        mismatched += 1
    return checked, mismatched


def main():
    ok = True
    for hybrid, factor in ((False, 1), (False, 2), (True, 1), (True, 3)):
        checked, mismatched = run(hybrid, factor)
        ok = ok and checked > 0 and mismatched == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
