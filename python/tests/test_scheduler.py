import numpy as np
import pytest

import kvoffload as kv
from conftest import block_hashes


FULL = [kv.GroupConfig("full_attention", 16)]


def two_group_scheduler(**kw):
    cfg = kv.SchedulerConfig(
        groups=[kv.GroupConfig("full_attention", 16),
                kv.GroupConfig("sliding_window", 16, sliding_window=32)],
        block_size_factor=2, host_blocks=64, **kw)
    return kv.Scheduler(cfg)


def test_store_then_hit_then_load():
    s = two_group_scheduler()
    h = block_hashes("p", 8)  # 128 tokens
    s.update_request("a", 128, h)
    assert s.lookup("a", 0) == 0
    s.on_allocated("a", [kv.AllocatedGroup([]), kv.AllocatedGroup([])], 0)
    step = s.build_step([kv.ScheduledRequest("a", 0, 128, [list(range(1, 9)), list(range(11, 19))])])
    assert step.load_jobs == [] and len(step.store_jobs) == 1
    job = step.store_jobs[0]
    assert job.kind == "store" and job.request_id == "a"
    # 4 host blocks of 2 GPU blocks per group; the window group stores only what it keeps.
    assert isinstance(job.gpu_block_ids, np.ndarray) and job.gpu_block_ids.dtype == np.int32
    assert int(job.group_sizes.sum()) == len(job.gpu_block_ids)
    assert list(job.gpu_block_ids[:8]) == list(range(1, 9))
    assert len(job.host_block_ids) == len(job.keys)
    assert job.keys[0] == (h[1], 0)  # the hash of the last hash block the host block covers
    assert not job.gpu_block_ids.flags.writeable
    done = s.on_completed([kv.JobReport(job.id)])
    assert done == [kv.CompletedJob(job.id, "store", "a", True)]
    events = s.take_events()
    assert len(events) == 1 and not events[0].removed and events[0].keys == job.keys
    s.on_finished("a")
    assert s.num_requests == 0

    s.update_request("b", 128, h)
    hit = s.lookup("b", 0)
    assert hit is not None and hit > 0
    # The window group gets null blocks (0) outside its 32-token window, counted as computed.
    s.on_allocated("b", [kv.AllocatedGroup(list(range(21, 29))),
                         kv.AllocatedGroup([0] * 6 + [37, 38], num_computed_blocks=6)], hit)
    step = s.build_step([kv.ScheduledRequest("b", hit, 128 - hit, [[], []])])
    assert len(step.load_jobs) == 1 and step.load_jobs[0].kind == "load"
    load = step.load_jobs[0]
    assert list(load.gpu_block_ids) == list(range(21, 29)) + [37, 38]
    assert list(load.group_sizes) == [8, 2]
    stats = s.stats()
    assert stats["load_jobs"] == 1 and stats["blocks_stored"] == len(job.keys)
    # The complete snapshot, under the C API's field names, in its order.
    assert list(stats) == [
        "blocks_total", "blocks_used", "blocks_free", "blocks_writing", "blocks_being_read",
        "hits", "misses", "deferrals", "evictions", "stores_skipped", "stores_without_room",
        "blocks_stored", "blocks_loaded", "bytes_stored", "bytes_loaded", "lookups",
        "hit_tokens", "load_jobs", "store_jobs", "failed_loads", "failed_stores",
        "partial_stores", "partial_misses", "pressure_skips", "reused_sub_blocks",
        "unsafe_skips", "unfinal_state_skips"]
    assert stats["lookups"] == 2 and stats["store_jobs"] == 1 and stats["hit_tokens"] == hit


def test_job_views_outlive_the_step():
    s = kv.Scheduler(groups=FULL, host_blocks=8)
    s.update_request("a", 32, block_hashes("v", 2))
    s.lookup("a")
    s.on_allocated("a", [kv.AllocatedGroup([])], 0)
    ids = s.build_step([kv.ScheduledRequest("a", 0, 32, [[5, 6]])]).store_jobs[0].gpu_block_ids
    # The view keeps its job alive after the Step and the Job objects are gone.
    import gc
    gc.collect()
    assert list(ids) == [5, 6]


def test_lookup_defers_while_a_store_is_in_flight():
    s = kv.Scheduler(groups=FULL, host_blocks=8)
    h = block_hashes("d", 2)
    s.update_request("a", 32, h)
    s.lookup("a")
    s.on_allocated("a", [kv.AllocatedGroup([])], 0)
    job = s.build_step([kv.ScheduledRequest("a", 0, 32, [[1, 2]])]).store_jobs[0]
    s.update_request("b", 32, h)
    assert s.lookup("b") is None  # being stored: ask again later
    s.on_completed([kv.JobReport(job.id)])
    assert s.lookup("b") == 32


def test_config_overrides_and_policies():
    s = kv.Scheduler(kv.SchedulerConfig(groups=FULL, host_blocks=4), policy="arc")
    assert s.config.policy == "arc" and s.config.host_blocks == 4
    assert s.stats()["blocks_total"] == 4


def _store(s, rid, hashes, gpu_ids, when, continues=None):
    s.set_time(when)
    s.update_request(rid, 16 * len(hashes), hashes)
    if continues is not None:
        s.hint_continues(rid, continues)
    assert s.lookup(rid, 0) == 0
    s.on_allocated(rid, [kv.AllocatedGroup([])], 0)
    step = s.build_step([kv.ScheduledRequest(rid, 0, 16 * len(hashes), [gpu_ids])])
    s.on_completed([kv.JobReport(j.id) for j in step.store_jobs])
    s.on_finished(rid)


@pytest.mark.parametrize("policy", ["reuse", "lru"])
def test_policy_reuse_keeps_what_the_engine_says_continues(policy):
    # Four host blocks: "a" (hinted to go on) and then "b" (hinted to end) fill them; "c"
    # needs two. Policy reuse gives up b's blocks; LRU, the control, a's (the older ones).
    s = kv.Scheduler(kv.SchedulerConfig(groups=FULL, host_blocks=4), policy=policy)
    a, b, c = block_hashes("a", 2), block_hashes("b", 2), block_hashes("c", 2)
    _store(s, "a", a, [1, 2], 0.0, continues=True)
    _store(s, "b", b, [3, 4], 1.0, continues=False)
    _store(s, "c", c, [5, 6], 2.0)
    s.update_request("a2", 32, a)
    s.update_request("b2", 32, b)
    kept = {"a": s.lookup("a2", 0), "b": s.lookup("b2", 0)}
    assert kept == ({"a": 32, "b": 0} if policy == "reuse" else {"a": 0, "b": 32})
    with pytest.raises(kv.InvalidArgument, match="set_time"):
        s.set_time(float("nan"))
    with pytest.raises(kv.InvalidArgument, match="nobody"):
        s.hint_continues("nobody", True)


def test_jobs_pickle_for_other_processes():
    """vLLM pickles connector metadata from its scheduler process to its workers."""
    import pickle
    s = two_group_scheduler()
    h = block_hashes("pk", 8)
    s.update_request("a", 128, h)
    s.lookup("a", 0)
    s.on_allocated("a", [kv.AllocatedGroup([]), kv.AllocatedGroup([])], 0)
    job = s.build_step([kv.ScheduledRequest("a", 0, 128, [list(range(1, 9)),
                                                           list(range(11, 19))])]).store_jobs[0]
    copy = pickle.loads(pickle.dumps(job))
    assert (copy.id, copy.kind, copy.request_id, copy.keys) == (job.id, job.kind, "a", job.keys)
    for field in ("gpu_block_ids", "group_sizes", "block_indices", "host_block_ids"):
        assert list(getattr(copy, field)) == list(getattr(job, field)), field
    bad = list(job.__getstate__())
    bad[1] = "move"
    with pytest.raises(kv.InvalidArgument, match="kind"):
        kv.Job.__new__(kv.Job).__setstate__(tuple(bad))


def test_a_store_leaves_out_a_block_handed_out_again():
    """docs/semantics.md 6.9: a store retried for room never reads a block the engine gave out
    again since, whether a step's new ids, on_allocated or handed_out() said so."""
    cfg = kv.SchedulerConfig(
        groups=[kv.GroupConfig("full_attention", 16),
                kv.GroupConfig("sliding_window", 16, sliding_window=16)],
        block_size_factor=1, host_blocks=4)
    s = kv.Scheduler(cfg)
    none = [kv.AllocatedGroup([]), kv.AllocatedGroup([])]
    s.update_request("a", 64, block_hashes("a", 4))
    s.lookup("a", 0)
    s.on_allocated("a", none, 0)
    a = s.build_step([kv.ScheduledRequest("a", 0, 32, [[1, 2], [101, 102]])]).store_jobs
    assert len(a) == 1 and len(a[0].keys) == 4  # the whole host cache, still being written
    s.update_request("b", 64, block_hashes("b", 4))
    s.lookup("b", 0)
    s.on_allocated("b", none, 0)
    assert s.build_step([kv.ScheduledRequest("b", 0, 32, [[201, 202], [301, 302]])]).store_jobs == []
    s.handed_out([301])  # a copy-on-write destination, say
    s.on_completed([kv.JobReport(a[0].id)])
    retry = s.build_step([kv.ScheduledRequest("b", 33, 1, [[], []])]).store_jobs
    assert len(retry) == 1 and list(retry[0].gpu_block_ids) == [201, 202, 302]
    assert s.stats()["reused_sub_blocks"] == 1
