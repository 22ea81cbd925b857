"""The connector's scheduler role: vLLM's scheduler-side calls mapped onto kv.Scheduler through
the C++ VllmBridge (per-request loops over vLLM's objects run in C++,
python/src/vllm_binding.cpp), the disk tiers' restore from the workers' scans, events, stats
and reset_cache. A mixin of KvoffloadConnector (kvoffload/vllm/connector.py)."""

from __future__ import annotations

import logging
import uuid
from typing import Any, Dict, List

import kvoffload as kv
from kvoffload import _kvoffload
from kvoffload.vllm.config import (continues_param, load_tiers_allow_all, skips_cache_reads,
                                   token_param)
from kvoffload.vllm.events import vllm_event_objects

logger = logging.getLogger("vllm.kvoffload")  # under vLLM's logger: its format and level


class SchedulerRole:
    def _start_scheduler(self):
        self._sched = kv.Scheduler(self._config)
        # Per-request loops over vLLM's objects run in C++ (python/src/vllm_binding.cpp).
        self._bridge = _kvoffload.VllmBridge(
            self._sched._s, [g.gpu_block_size for g in self._config.groups],
            self._stale_session_hashes)

    def _take_scans(self, meta):
        """The workers' disk scans, as their first step's outputs bring them; once every
        rank's is in, the scheduler starts over with each disk tier's slots (the fewest
        any rank has) and its index restored (a key only where every rank has it). Until
        then lookups wait, so nothing was stored or looked up in the scheduler replaced."""
        self._scans.update(getattr(meta, "scans", None) or {})
        if len(self._scans) < self._world:
            self._scan_waits += 1
            if self._scan_waits == 100:  # vLLM brings every rank's output each step
                logger.warning("kvoffload: 100 steps without the disk scans of ranks %s "
                               "(have %s): lookups wait for them", sorted(
                                   set(range(self._world)) - set(self._scans)),
                               sorted(self._scans))
            return
        restored: Dict[int, List[Any]] = {}
        for t in self._disk_tiers:
            slots = min(len(rank[t]) for rank in self._scans.values())
            if slots <= 0:
                raise kv.InvalidArgument(f"tiers[{t}]: the disk tier holds no slot "
                                         "(capacity_bytes below one host block)")
            ranks = [rank[t][:slots] for _, rank in sorted(self._scans.items())]
            restored[t] = kv.merge_rank_scans(ranks) if self._restore else []
            self._config.tiers[t].blocks = slots
        self._start_scheduler()
        for t, scan in restored.items():
            self.restored_blocks[t] = self._sched.restore_tier(t, scan)
            logger.info("kvoffload: disk tier %d: %d slots, %d blocks restored from %d "
                        "rank(s)' files", t, self._config.tiers[t].blocks,
                        self.restored_blocks[t], len(self._scans))
        self._scans, self._awaiting_scans = {}, False

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """vLLM's per-request kv_transfer_params, read as its own offloading connector
        reads them (a non-negative int, else ignored): max_load_tokens limits the hit
        inside the lookup (it ends at a host block, every group checked there),
        max_offload_tokens what is stored, kvoffload_continues (a bool: the client or
        router knows whether the conversation goes on) policy reuse's hint. kv_load_tiers
        (vLLM 0.33) is honoured whole or not at all: a filter that leaves out any medium this connector loads from (host
        memory, a disk or a shared tier) loads nothing."""
        if self._awaiting_scans:
            return None, False  # retry later: the disk tiers' index is not in yet
        params = getattr(request, "kv_transfer_params", None)
        load_limit = token_param(params, "max_load_tokens")
        if skips_cache_reads(request):
            load_limit = 0  # looked up (its stores need it), never loaded
        if (isinstance(params, dict) and params.get("kv_load_tiers") is not None and
                not load_tiers_allow_all(params["kv_load_tiers"], self._load_media)):
            load_limit = 0  # its filter leaves out a tier a hit could come from
        hit = self._bridge.lookup(request, num_computed_tokens, load_limit,
                                  token_param(params, "max_offload_tokens"),
                                  continues_param(params))
        if hit is None:
            return None, False
        return hit, hit > 0

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self._bridge.allocated(request.request_id, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        loads, stores, flush, tier_jobs = self._bridge.build_step(scheduler_output)
        clear, self._clear_tiers = self._clear_tiers, False
        return self._metadata_cls(loads, stores, flush, tier_jobs, clear)

    def update_connector_output(self, connector_output):
        meta = connector_output.kv_connector_worker_meta
        if self._awaiting_scans:
            self._take_scans(meta)
        completed = getattr(meta, "completed", None)
        if completed:
            self._sched._s.on_completed([(job, count, ok) for job, (count, ok)
                                         in sorted(completed.items())])
        # A worker under store back-pressure says so every step until it clears.
        if self._sched is not None:
            self._sched._s.set_store_pressure(bool(getattr(meta, "pressure", False)))

    def _finish(self, request):
        self._bridge.finished(request.request_id)
        return False, None  # stores of its blocks are fenced by the scheduler's flush sets

    def request_finished(self, request, block_ids):
        return self._finish(request)

    def request_finished_all_groups(self, request, block_ids):
        return self._finish(request)

    def take_events(self):
        """Blocks stored and removed in host memory and every tier, as vLLM's KV events
        (EVENT_MEDIA: a KV-aware router sees disk and shared residency too); only when
        vLLM's kv_events_config enables them."""
        if self._sched is None or not self._events:
            return []
        from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

        out = vllm_event_objects(self._bridge.events(), BlockStored, BlockRemoved)
        if self._cleared:
            # reset_cache dropped every block of every tier (a new epoch): a router must
            # forget what this engine published, before the events since.
            self._cleared = False
            out.insert(0, AllBlocksCleared())
        return out

    def reset_cache(self):
        if self._sched is not None:
            if self._config.tiers:
                # A new epoch in every tier: what was stored before is never found again
                # (here or, for the shared tier, by engines that reset with us).
                # Random, never a counter: every engine's first reset, and every restart's,
                # would share "#reset1", and their blocks (of other weights, after an
                # in-place update) would be found under it.
                weights = f"{self._identity}#reset-{uuid.uuid4().hex}"
                self._sched.reset_cache(weights)
                # The workers empty their disk tiers, so a restart does not bring the old
                # blocks back under the identity derived from the config.
                self._clear_tiers = bool(self._disk_tiers)
                if self._awaiting_scans:  # the scheduler started over later: the new epoch
                    self._config.weights, self._restore = weights, False
            else:
                self._sched.reset_cache()
            self._bridge.invalidate()  # every request's stores start over
            # Events queued before the reset are dropped: AllBlocksCleared, first in the
            # next batch, says all of it, and nothing of the old cache may follow it.
            self._bridge.events()
            self._cleared = self._events
        return True

