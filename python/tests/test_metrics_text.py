"""Scheduler.metrics_text / Worker.metrics_text: the Prometheus text format, read back by a
strict parser and compared with stats()."""

import re

import numpy as np
import pytest

import kvoffload as kv
from conftest import block_hashes

SAMPLE = re.compile(r'^([a-zA-Z_][a-zA-Z0-9_]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')


def parse(text):
    """{(name, frozenset(labels)): value}; asserts the format as it goes."""
    assert text.endswith("\n")
    types, current, out = {}, None, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge") and name not in types
            assert (kind == "counter") == name.endswith("_total")
            types[name], current = kind, name
            continue
        m = SAMPLE.match(line)
        assert m, line
        name, labels, value = m.groups()
        assert name == current, line
        pairs = LABEL.findall(labels or "")
        assert ",".join(f'{k}="{v}"' for k, v in pairs) == (labels or ""), line
        key = (name, frozenset((k, v.replace('\\"', '"').replace("\\n", "\n")
                                .replace("\\\\", "\\")) for k, v in pairs))
        assert key not in out
        out[key] = float(value)
    return out


def test_scheduler_metrics_match_its_stats():
    s = kv.Scheduler(kv.SchedulerConfig(groups=[kv.GroupConfig("full_attention", 16)],
                                        host_blocks=8, block_bytes=1024))
    h = block_hashes("metrics", 4)
    s.update_request("a", 64, h)
    assert s.lookup("a", 0) == 0
    s.on_allocated("a", [kv.AllocatedGroup([])], 0)
    step = s.build_step([kv.ScheduledRequest("a", 0, 64, [[1, 2, 3, 4]])])
    s.on_completed([kv.JobReport(j.id) for j in step.store_jobs])
    s.update_request("b", 64, h)
    assert s.lookup("b", 0) == 64
    got = parse(s.metrics_text({"engine": 'e"1"'}))
    stats = s.stats()
    lab = frozenset({("engine", 'e"1"')})
    gauges = {"blocks_total": "kvoffload_blocks_capacity", "blocks_used": None,
              "blocks_free": None, "blocks_writing": None, "blocks_being_read": None}
    for field, value in stats.items():
        if field in gauges:
            name = gauges[field] or f"kvoffload_{field}"
        else:
            name = f"kvoffload_{field}_total"
        assert got[(name, lab)] == value, field
    assert got[("kvoffload_bytes_stored_total", lab)] == 4 * 1024
    assert len(got) == len(stats)
    with pytest.raises(kv.InvalidArgument, match="metrics label"):
        s.metrics_text({"tier": "x"})


def test_worker_metrics_count_its_copies():
    gpu = np.full((8, 256), 5, dtype=np.uint8)
    w = kv.Worker(kv.WorkerConfig([kv.tensor_of(gpu)], [[(0, 256)]], host_blocks=4, threads=1))
    s = kv.Scheduler(kv.SchedulerConfig(groups=[kv.GroupConfig("full_attention", 16)],
                                        host_blocks=4))
    s.update_request("a", 48, block_hashes("w", 3))
    s.lookup("a", 0)
    s.on_allocated("a", [kv.AllocatedGroup([])], 0)
    step = s.build_step([kv.ScheduledRequest("a", 0, 48, [[1, 2, 3]])])
    w.submit_step(step)
    w.wait([j.id for j in step.store_jobs])
    w.get_finished()
    got = parse(w.metrics_text())
    assert got[("kvoffload_worker_store_jobs_total", frozenset())] == w.stats()["store_jobs"] == 1
    assert got[("kvoffload_worker_bytes_stored_total", frozenset())] == 3 * 256
    assert got[("kvoffload_worker_store_seconds_total", frozenset())] > 0
