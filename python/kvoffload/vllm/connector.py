"""KvoffloadConnector: vLLM's KV connector (KVConnectorBase_V1, SupportsHMA) over the
engine-neutral layer (kvoffload.engine). ``ConnectorCore`` holds what needs no vLLM import
(reading vLLM's config, the stats); the scheduler and worker roles are mixins of their own
(scheduler_role.py, worker_role.py). ``define`` builds the classes over vLLM's base classes when
kvoffload.vllm's connector is first looked up, so ``import kvoffload.vllm`` works without vLLM."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import kvoffload as kv
from kvoffload.engine.config import max_store_bytes, weights_name
from kvoffload.engine.identity import model_identity
from kvoffload.engine.metrics import counters_now, counters_since, tier_labels
from kvoffload.engine.scheduler import scheduler_config
from kvoffload.vllm import metadata, stats
from kvoffload.vllm.config import (
    check_engine_features,
    dp_rank,
    group_of_spec,
    hash_block_size,
    stale_session_hashes,
)
from kvoffload.vllm.events import EVENT_MEDIA
from kvoffload.vllm.scheduler_role import SchedulerRole
from kvoffload.vllm.worker_role import WorkerRole


class ConnectorCore(SchedulerRole, WorkerRole):
    """The connector's state from vLLM's config, and its stats; define() sets the class
    attributes below."""

    _scheduler_role: Any = None
    _metadata_cls: Any = None
    _worker_metadata_cls: Any = None
    _stats_cls: Any = None
    _prom_cls: Any = None

    def __init__(self, vllm_config, role, kv_cache_config):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = dict(vllm_config.kv_transfer_config.kv_connector_extra_config or {})
        check_engine_features(vllm_config, kv_cache_config)
        groups = [group_of_spec(g, group.kv_cache_spec)
                  for g, group in enumerate(kv_cache_config.kv_cache_groups)]
        num_blocks = kv_cache_config.num_blocks
        total = sum(t.size for t in kv_cache_config.kv_cache_tensors)
        world = vllm_config.parallel_config.world_size
        tp_size = vllm_config.parallel_config.tensor_parallel_size
        per_block = total // num_blocks * world if num_blocks > 0 else 0
        events = vllm_config.kv_events_config
        self._events = bool(events is not None and events.enable_kv_cache_events)
        mc, cc = vllm_config.model_config, vllm_config.cache_config
        self._identity = model_identity(
            mc.model, getattr(mc, "revision", None), mc.dtype, tp_size,
            getattr(cc, "cache_dtype", "auto"), getattr(mc, "quantization", None),
            getattr(mc, "hf_overrides", None), weights=weights_name(extra))
        pc = vllm_config.parallel_config
        if extra.get("tiers"):
            # A tier's key names a block by tensor-parallel rank only: pipeline stages (and
            # context-parallel ranks) would share names for different layers' KV.
            if world != tp_size:
                raise kv.InvalidArgument(
                    f"tiers: need pipeline- and context-parallel size 1 (world size {world}, "
                    f"tensor-parallel size {tp_size})")
            # Scales computed at the first forward pass differ between engines and runs:
            # fp8 KV stored under one set would be read under another.
            if getattr(cc, "calculate_kv_scales", False):
                raise kv.InvalidArgument("tiers: calculate_kv_scales gives each engine its "
                                         "own fp8 KV scales; blocks would not be portable")
        self._config = scheduler_config(groups, hash_block_size(vllm_config, kv_cache_config),
                                        per_block, extra, num_workers=world,
                                        enable_events=self._events,
                                        identity=self._identity, tp_size=tp_size,
                                        prefix_caching=bool(cc.enable_prefix_caching),
                                        dp_rank=dp_rank(pc))
        self._tp_size = tp_size
        self._stats_seen: Dict[str, Any] = {}
        media = [t.medium for t in self._config.tiers]
        # Where a load can come from, as vLLM's kv_load_tiers names media.
        self._load_media = [EVENT_MEDIA[m] for m in ["host"] + media]
        self._tier_labels = tier_labels(media)
        self._sched: Optional[kv.Scheduler] = None
        self._worker: Optional[kv.Worker] = None
        self._disk_tiers = [t for t, c in enumerate(self._config.tiers) if c.medium == "disk"]
        self._max_store_bytes = max_store_bytes(extra)
        # A disk tier's scheduler waits for every rank's scan; under torchrun's external
        # launcher each engine hears only its own worker.
        if (self._disk_tiers and tp_size > 1 and
                getattr(pc, "distributed_executor_backend", None) == "external_launcher"):
            raise kv.InvalidArgument("tiers: a disk tier with tensor parallelism needs an "
                                     "executor that gathers every rank's output (not "
                                     "external_launcher)")
        if role == self._scheduler_role:
            self._world = world
            import vllm

            self._stale_session_hashes = stale_session_hashes(
                getattr(vllm, "__version__", ""))
            self._start_scheduler()
            self._cleared = False  # reset_cache since the last take_events
            self._clear_tiers = False  # the same, for the workers' disk tiers
            # Disk tiers: lookups wait for every rank's scan (_take_scans).
            self._scans: Dict[int, Dict[int, List[Any]]] = {}
            self._awaiting_scans = bool(self._disk_tiers)
            self._restore = True  # False after a reset while awaiting them
            self._scan_waits = 0
            self.restored_blocks: Dict[int, int] = {}  # per disk tier, at start
        else:
            self._scans_to_send = None
            self._load_requests: Dict[int, str] = {}
            self._completed: Dict[int, Tuple[int, bool]] = {}
            self._load_errors: set = set()
            self._load_jobs_by_id: Dict[int, Any] = {}

    # ---- vLLM's connector stats (its log line and /metrics) -------------------------------

    def get_kv_connector_stats(self):
        """The counters gained since the last call: the scheduler's and its tiers' in the
        scheduler role, the copies' in a worker."""
        if self._stats_cls is None:
            return None
        now = counters_now(self._sched, self._tier_labels, self._worker)
        if now is None:
            return None
        # Always an object, even an empty one: vLLM 0.21 merges the scheduler's stats into
        # the workers' only when the workers sent some.
        return self._stats_cls(data=counters_since(now, self._stats_seen))

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        if cls._stats_cls is None:
            return None
        return cls._stats_cls(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        if cls._prom_cls is None:
            return None
        return cls._prom_cls(vllm_config, metric_types, labelnames, per_engine_labelvalues)


def define(module: Any) -> None:
    """Defines the connector's classes over vLLM's base classes, as globals of ``module``
    (kvoffload.vllm) under their public names, so that pickle finds them: vLLM pickles the
    metadata between its engine-core process and its workers."""
    if "KvoffloadConnector" in vars(module):
        return
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import (
            KVConnectorBase_V1,
            KVConnectorMetadata,
            KVConnectorRole,
            KVConnectorWorkerMetadata,
            SupportsHMA,
        )
    except ImportError as e:
        raise ImportError("kvoffload.vllm.KvoffloadConnector needs vLLM (pip install vllm); "
                          "the rest of kvoffload does not") from e
    meta_cls, worker_meta_cls = metadata.define(KVConnectorMetadata, KVConnectorWorkerMetadata)
    stats_cls, prom_cls = stats.define()

    class KvoffloadConnector(ConnectorCore, KVConnectorBase_V1, SupportsHMA):
        _scheduler_role = KVConnectorRole.SCHEDULER
        _metadata_cls = meta_cls
        _worker_metadata_cls = worker_meta_cls
        _stats_cls = stats_cls
        _prom_cls = prom_cls

    for cls in (meta_cls, worker_meta_cls, KvoffloadConnector, stats_cls, prom_cls):
        if cls is not None:
            cls.__module__ = module.__name__
            cls.__qualname__ = cls.__name__
            setattr(module, cls.__name__, cls)
    # By name too: vLLM's MultiConnector looks its members' stats classes up by name
    # (KVConnectorFactory.get_connector_class_by_name), which fails for a connector known only
    # by module path.
    try:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

        if "KvoffloadConnector" not in getattr(KVConnectorFactory, "_registry", {}):
            KVConnectorFactory.register_connector("KvoffloadConnector", module.__name__,
                                                  "KvoffloadConnector")
    except (ImportError, ValueError, AttributeError):
        pass  # an older vLLM, or registered meanwhile
