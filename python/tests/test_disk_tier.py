"""The disk tier from Python: kv.DiskTierConfig(path=..., capacity_bytes=...), write-through,
a restart that finds the blocks, promotion on a hit and byte-exact loads."""

import pickle

import numpy as np
import pytest

import kvoffload as kv
from conftest import block_hashes

F, PAGE = 2, 4096


def engine(tmp_path, gpu, layout_note=""):
    """One description (the scheduler's config, the tier's store in it); the worker derives
    its factor, pool and tier from it, and the tier's blocks are the slots it opened."""
    store = kv.DiskTierConfig(path=str(tmp_path), capacity_bytes="1MiB", model="pytest-model",
                              dtype="uint8")
    sc = kv.SchedulerConfig(groups=[kv.GroupConfig("full_attention", 16)], host_blocks=8,
                            block_size_factor=F, tiers=[kv.TierConfig(blocks=1, store=store)])
    w = kv.Worker(kv.derive_worker_config(sc, kv.WorkerConfig([kv.tensor_of(gpu)], [[(0, PAGE)]],
                                                              threads=1,
                                                              layout_note=layout_note)))
    assert w.num_host_blocks == 8  # the pool the C++ worker allocated, from the description
    sc.tiers[0].blocks = w.tier_slots()
    s = kv.Scheduler(sc)
    restored = s.restore_tier(0, w.tier_scan())
    return s, w, restored


def run(s, w, step):
    """Runs a step's jobs and reports them; returns the completed load/store jobs."""
    w.submit_step(step)
    ids = [j.id for j in step.load_jobs + step.store_jobs + step.tier_jobs]
    w.wait(ids)
    finished = w.get_finished()
    assert sorted(f.job for f in finished) == sorted(ids)
    assert all(f.ok for f in finished)
    return s.on_completed([kv.JobReport(f.job, ok=f.ok) for f in finished])


def test_written_through_then_promoted_after_a_restart(tmp_path):
    gpu = np.zeros((32, PAGE), dtype=np.uint8)
    rng = np.random.default_rng(3)
    first = [1, 2, 3, 4]
    gpu[first] = rng.integers(0, 256, size=(4, PAGE), dtype=np.uint8)
    original = gpu[first].copy()
    h = block_hashes("disk", 4)

    s, w, restored = engine(tmp_path, gpu)
    assert restored == 0
    assert w.tier_io() in ("io_uring", "threads")
    s.update_request("a", 64, h)
    assert s.lookup("a") == 0
    s.on_allocated("a", [kv.AllocatedGroup([])], 0)
    run(s, w, s.build_step([kv.ScheduledRequest("a", 0, 64, [first])]))
    step = s.build_step([])
    assert [(j.kind, j.tier, len(j.keys)) for j in step.tier_jobs] == [("write", 0, 2)]
    finished_kinds = []
    w.submit_step(step)
    w.wait([j.id for j in step.tier_jobs])
    for f in w.get_finished():
        finished_kinds.append(f.kind)
        s.on_completed([kv.JobReport(f.job, ok=f.ok)])
    assert finished_kinds == ["write"]
    assert s.tier_stats(0)["blocks_written"] == 2
    events = s.take_events()
    assert [(e.removed, e.medium, len(e.keys)) for e in events] == [(False, "host", 2),
                                                                   (False, "disk", 2)]
    del s, w

    # Restart: a new worker and scheduler on the same directory.
    gpu[:] = 0
    s, w, restored = engine(tmp_path, gpu)
    assert restored == 2
    assert sum(k is not None for k in w.tier_scan()) == 2
    w.release_tier_scan(0)  # restored: the scan's memory goes back, the slots stay readable
    assert w.tier_scan() == []
    with pytest.raises(kv.InvalidArgument, match="tier 1 is not configured"):
        w.release_tier_scan(1)
    s.update_request("b", 64, h)
    assert s.lookup("b") is None  # being promoted
    step = s.build_step([])
    assert [j.kind for j in step.tier_jobs] == ["promote"]
    job = pickle.loads(pickle.dumps(step.tier_jobs[0]))  # travels to workers like a Job
    assert (job.id, job.kind, list(job.slots)) == (step.tier_jobs[0].id, "promote",
                                                   list(step.tier_jobs[0].slots))
    run(s, w, step)
    hit = s.lookup("b")
    assert hit == 64
    second = [9, 10, 11, 12]
    s.on_allocated("b", [kv.AllocatedGroup(second)], hit)
    done = run(s, w, s.build_step([kv.ScheduledRequest("b", hit, 0, [[]])]))
    assert [d.kind for d in done] == ["load"] and done[0].ok
    assert np.array_equal(gpu[second], original)
    stats = s.tier_stats(0)
    assert stats["promotions"] == 2 and stats["hits"] == 2


def test_blocks_written_under_another_page_layout_are_not_restored(tmp_path):
    """Pages of equal bytes in another dimension order (WorkerConfig.layout_note: an attention
    backend's NHD against HND) must not be read as this one: another note finds nothing on
    the same directory; the writer's own note finds its blocks."""
    nhd, hnd = "bfloat16[16, 8, 128]/[1024, 128, 1]", "bfloat16[16, 8, 128]/[128, 2048, 1]"
    gpu = np.ones((32, PAGE), dtype=np.uint8)
    s, w, _ = engine(tmp_path, gpu, nhd)
    assert w.layout_description().endswith(" note=" + nhd)
    s.update_request("a", 64, block_hashes("note", 4))
    s.lookup("a")
    s.on_allocated("a", [kv.AllocatedGroup([])], 0)
    run(s, w, s.build_step([kv.ScheduledRequest("a", 0, 64, [[1, 2, 3, 4]])]))
    run(s, w, s.build_step([]))  # the write-through
    assert s.tier_stats(0)["blocks_written"] == 2
    del s, w
    assert engine(tmp_path, gpu, nhd)[2] == 2  # the same layout finds them
    assert engine(tmp_path, gpu, hnd)[2] == 0  # (and, bounding the disk, drops them)


def test_bad_disk_tier_configs_name_the_field(tmp_path):
    gpu = np.zeros((4, PAGE), dtype=np.uint8)
    def worker(store):
        return kv.Worker(kv.WorkerConfig([kv.tensor_of(gpu)], [[(0, PAGE)]], host_blocks=2,
                                         tiers=[store]))
    with pytest.raises(kv.InvalidArgument, match=r"tiers\[0\]\.capacity_bytes"):
        worker(kv.DiskTierConfig(path=str(tmp_path), capacity_bytes="lots"))
    with pytest.raises(kv.InvalidArgument, match="0 is not a positive size"):
        worker(kv.DiskTierConfig(path=str(tmp_path), capacity_bytes=0))
    with pytest.raises(kv.InvalidArgument, match=r"tiers\[0\]\.io"):
        worker(kv.DiskTierConfig(str(tmp_path), 1 << 20, io="mmap"))
    with pytest.raises(kv.InvalidArgument, match=r"tiers\[0\]\.io_depth: expected an int, got str"):
        worker(kv.DiskTierConfig(str(tmp_path), 1 << 20, io_depth="deep"))
    with pytest.raises(kv.InvalidArgument, match=r"tiers\[0\]\.store: a worker needs"):
        kv.derive_worker_config(
            kv.SchedulerConfig(groups=[kv.GroupConfig()], host_blocks=2,
                               tiers=[kv.TierConfig(blocks=8)]),
            kv.WorkerConfig([kv.tensor_of(gpu)], [[(0, PAGE)]]))
    with pytest.raises(kv.InvalidArgument, match=r"tiers\[0\]\.store: a shared tier's store"):
        kv.Scheduler(groups=[kv.GroupConfig()], host_blocks=2,
                     tiers=[kv.TierConfig(blocks=8, store=kv.SharedTierConfig("h:1", "m"))])
    with pytest.raises(kv.InvalidArgument, match="tiers\\[0\\].blocks"):
        kv.Scheduler(groups=[kv.GroupConfig()], host_blocks=2, tiers=[kv.TierConfig(blocks=0)])
    w = kv.Worker(kv.WorkerConfig([kv.tensor_of(gpu)], [[(0, PAGE)]], host_blocks=2))
    with pytest.raises(kv.InvalidArgument, match="tier 0 is not configured"):
        w.tier_scan(0)


def test_a_directory_the_system_refuses_is_an_io_error(tmp_path):
    """Under a regular file no directory can be made (not even by root): kv.IoError, an
    OSError, naming the path; not kv.InternalError (a bug)."""
    gpu = np.zeros((4, PAGE), dtype=np.uint8)
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    with pytest.raises(kv.IoError, match="cannot create") as info:
        kv.Worker(kv.WorkerConfig([kv.tensor_of(gpu)], [[(0, PAGE)]], host_blocks=2,
                                  tiers=[kv.DiskTierConfig(str(blocker / "tier"), 1 << 20)]))
    assert isinstance(info.value, OSError) and not isinstance(info.value, kv.InternalError)
