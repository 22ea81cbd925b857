"""The connector's worker role: vLLM's worker-side calls mapped onto kv.Worker (the CUDA backend
when the KV caches are CUDA tensors, with the engine's current torch stream, taken again
before each step's jobs are submitted, as the compute stream; the host backend when they are
CPU tensors). A mixin of KvoffloadConnector (kvoffload/vllm/connector.py)."""

from __future__ import annotations

import kvoffload as kv
from kvoffload.engine.worker import TensorTable, make_worker
from kvoffload.vllm.config import tp_rank


class WorkerRole:
    def register_kv_caches(self, kv_caches):
        num_blocks = self._kv_cache_config.num_blocks
        table, groups = TensorTable(), []
        for group in self._kv_cache_config.kv_cache_groups:
            members = []
            for layer in group.layer_names:
                t = kv_caches[layer]
                if t.shape[0] == num_blocks:
                    parts = [t]
                elif t.dim() > 1 and t.shape[0] == 2 and t.shape[1] == num_blocks:
                    parts = [t[0], t[1]]  # K and V stacked first (FlashAttention layout)
                else:
                    raise kv.InvalidArgument(
                        f"layer {layer}: KV cache of shape {tuple(t.shape)} has no block "
                        f"dimension of {num_blocks} first (or after a K/V dimension)")
                members.extend(table.member(p) for p in parts)
            groups.append(members)
        first = next(iter(kv_caches.values()))
        # The factor and the pool's size from the scheduler's config: given once.
        self._worker, self._stream = make_worker(
            self._config, table, groups, first, max_store_bytes=self._max_store_bytes,
            tp_rank=tp_rank(self._tp_size) if self._config.tiers else 0)
        # CUDA: the stream the forward pass runs on is the current one when a step's jobs
        # are submitted, not the one of this call (_follow_stream).
        self._kv_device = first.device if self._stream is not None else None
        if self._kv_device is not None:
            import torch

            self._current_stream = torch.cuda.current_stream
        if self._disk_tiers:  # for the scheduler's restore (_take_scans), sent once
            self._scans_to_send = {tp_rank(self._tp_size): {
                t: self._worker.tier_scan(t) for t in self._disk_tiers}}
            for t in self._disk_tiers:  # the lists above are all that is needed
                self._worker.release_tier_scan(t)

    def _follow_stream(self):
        """Before a step's jobs are submitted: the engine's current stream becomes the
        worker's compute stream, so the jobs wait for the forward pass whichever stream it
        runs on (micro-batching, dual-batch overlap). One integer compare when unchanged."""
        if self._kv_device is None:
            return  # the host backend: CPU tensors, no stream
        handle = self._current_stream(self._kv_device).cuda_stream
        if handle != self._stream:
            self._worker.set_compute_stream(int(handle))
            self._stream = handle

    def handle_preemptions(self, kv_connector_metadata):
        self._worker.start_step()
        if kv_connector_metadata.flush:
            self._worker.wait(kv_connector_metadata.flush)

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata()
        # The previous step's stores start now, still waiting for the stream current at
        # their wait_for_save (the one that pass wrote their KV on).
        self._worker.start_step()
        if meta.flush:
            self._worker.wait(meta.flush)
        if getattr(meta, "clear_tiers", False):
            self._worker.clear_tiers()  # never waits: old tier jobs' writes are erased
        if meta.load_jobs:
            self._follow_stream()
        for job in meta.load_jobs:
            self._load_requests[job.id] = job.request_id
            self._load_jobs_by_id[job.id] = job
            self._worker.submit(job)
        # Promotions into host blocks and writes out of them: on the tiers' own threads,
        # reported through get_finished like the copies.
        for job in meta.tier_jobs:
            self._worker.submit_tier(job)

    def wait_for_layer_load(self, layer_name):
        pass  # loads are asynchronous: vLLM holds the request until get_finished says so

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def wait_for_save(self):
        store_jobs = self._get_connector_metadata().store_jobs
        if store_jobs:
            self._follow_stream()  # this step's forward pass wrote their KV on it
        for job in store_jobs:
            self._worker.submit(job)  # deferred to the next step's start

    def get_finished(self, finished_req_ids):
        recving = set()
        for f in self._worker.get_finished():
            self._completed[f.job] = (1, f.ok)
            rid = self._load_requests.pop(f.job, None)
            job = self._load_jobs_by_id.pop(f.job, None)
            if rid is not None:
                recving.add(rid)
                if not f.ok and job is not None:
                    self._load_errors.update(int(b) for b in job.gpu_block_ids)
        return set(), recving

    def get_block_ids_with_load_errors(self):
        errors, self._load_errors = self._load_errors, set()
        return errors

    def build_connector_worker_meta(self):
        pressure = self._worker is not None and self._worker.store_pressure()
        if not self._completed and self._scans_to_send is None and not pressure:
            return None
        meta = self._worker_metadata_cls(self._completed, self._scans_to_send, pressure)
        self._completed, self._scans_to_send = {}, None
        return meta

    def shutdown(self):
        self._worker = None
