"""kvoffload's counters as vLLM's connector stats (its log line) and Prometheus counters
(vllm:kvoffload_<name>, tier ones labelled with the tier's medium). Defined over vLLM's base
classes when the connector is first looked up; (None, None) for a vLLM without them."""

from __future__ import annotations

from typing import Any, Dict, Tuple

from kvoffload.engine.metrics import METRICS, metric_of


def define() -> Tuple[Any, Any]:
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
            KVConnectorPromMetrics,
            KVConnectorStats,
        )
    except ImportError:  # a vLLM without connector stats: the connector reports none
        return None, None

    class KvoffloadConnectorStats(KVConnectorStats):
        """Counters gained since the last report, name -> number (METRICS; tier counters
        as "tier.<medium>.<name>"), summed over workers and steps."""

        def reset(self):
            self.data = {}

        def aggregate(self, other):
            for k, v in (getattr(other, "data", None) or {}).items():
                self.data[k] = self.data.get(k, 0) + v
            return self

        def reduce(self):
            return {k: round(v, 6) if isinstance(v, float) else v
                    for k, v in self.data.items() if v}

        def is_empty(self):
            return not any(self.data.values())

    class KvoffloadPromMetrics(KVConnectorPromMetrics):
        """METRICS as Prometheus counters vllm:kvoffload_<name> (tier ones labelled with
        the tier's medium), per engine."""

        def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
            super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
            self._counters = {
                name: self._counter_cls(
                    name=f"vllm:kvoffload_{name}", documentation=doc,
                    labelnames=list(labelnames) + (["tier"] if name.startswith("tier_")
                                                   else []))
                for name, doc in METRICS.items()}
            self._bound: Dict[Tuple[int, str], Any] = {}

        def observe(self, transfer_stats_data, engine_idx=0):
            for key, value in (transfer_stats_data or {}).items():
                if not value or value < 0:
                    continue
                bound = self._bound.get((engine_idx, key))
                if bound is None:
                    name, tier = metric_of(key)
                    if name not in self._counters:
                        continue
                    values = list(self.per_engine_labelvalues[engine_idx])
                    bound = self._counters[name].labels(*(values + ([tier] if tier else [])))
                    self._bound[(engine_idx, key)] = bound
                bound.inc(value)

    return KvoffloadConnectorStats, KvoffloadPromMetrics
