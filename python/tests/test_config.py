"""The configs as the binding reads them: one description (the SchedulerConfig) from which a
worker's config is derived with the library's checks, and every bad field an InvalidArgument
that names it, never a crash or a bare TypeError."""

import numpy as np
import pytest

import kvoffload as kv

PAGE = 4096


def worker_config(**kw):
    gpu = worker_config.gpu = np.zeros((4, PAGE), dtype=np.uint8)
    return kv.WorkerConfig([kv.tensor_of(gpu)], [[(0, PAGE)]], **kw)


def scheduler_config(**kw):
    return kv.SchedulerConfig(groups=[kv.GroupConfig("full_attention", 16)], host_blocks=4, **kw)


def test_derived_worker_takes_factor_pool_and_tiers_from_the_description(tmp_path):
    store = kv.DiskTierConfig(path=str(tmp_path), capacity_bytes="1MiB", model="m", tp_size=2)
    sc = scheduler_config(block_size_factor=2, tiers=[kv.TierConfig(blocks=1, store=store)])
    wc = kv.derive_worker_config(sc, worker_config(threads=1, tp_rank=1))
    assert (wc.block_size_factor, wc.host_blocks) == (2, 4)
    assert wc.tp_rank == 1 and store.tp_rank == 0  # the description is not changed
    conflicting = kv.DiskTierConfig(path=str(tmp_path), capacity_bytes="1MiB", tp_rank=2,
                                    tp_size=4)
    with pytest.raises(kv.InvalidArgument, match=r"tiers\[0\]\.tp_rank is 2, but the worker's tp_rank is 1"):
        kv.Worker(worker_config(host_blocks=4, tp_rank=1, tiers=[conflicting]))
    w = kv.Worker(wc)
    assert w.num_host_blocks == 4
    sc.tiers[0].blocks = w.tier_slots()
    w.check_matches(sc)
    sc.block_size_factor = 1
    with pytest.raises(kv.InvalidArgument, match="block_size_factor is 2, but the scheduler's is 1"):
        w.check_matches(sc)


def test_derivation_runs_the_librarys_checks():
    sc = scheduler_config()
    two_groups = worker_config()
    two_groups.groups = [[(0, PAGE)], [(0, PAGE)]]
    with pytest.raises(kv.InvalidArgument, match=r"tensors for 2 group\(s\), but the scheduler"):
        kv.derive_worker_config(sc, two_groups)
    with pytest.raises(kv.InvalidArgument, match="host_blocks must be at least 1"):
        kv.derive_worker_config(scheduler_config().__class__(groups=sc.groups), worker_config())


@pytest.mark.parametrize("change, message", [
    (dict(host_blocks=True), r"WorkerConfig\.host_blocks: expected an int, got a bool"),
    (dict(host_blocks=2**70), r"WorkerConfig\.host_blocks: 1180591620717411303424 is out of range"),
    (dict(threads="2"), r"WorkerConfig\.threads: expected an int, got str"),
    (dict(defer_stores=1.5), r"WorkerConfig\.defer_stores: expected a bool, got float"),
    (dict(tiers=None), r"WorkerConfig\.tiers: expected a list, got NoneType"),
    (dict(tiers=[{"path": "/tmp"}]), r"tiers\[0\]: expected a kvoffload config with a field"),
    (dict(groups=[[("a", 1)]]), r"groups\[0\] tensor: expected an int, got str"),
    (dict(groups=[[(0,)]]), r"groups\[0\]: expected \(tensor, page bytes\) pairs, got 1 items"),
])
def test_bad_worker_fields_are_named(change, message):
    wc = worker_config(host_blocks=4)
    for k, v in change.items():
        setattr(wc, k, v)
    with pytest.raises(kv.InvalidArgument, match=message):
        kv.Worker(wc)


def test_numpy_scalars_and_large_byte_counts(tmp_path):
    # numpy's bool_ is a bool; a capacity up to 2^64 - 1 is an int (too large to open here).
    w = kv.Worker(worker_config(host_blocks=np.int64(2), defer_stores=np.bool_(True)))
    assert w.num_host_blocks == 2
    store = kv.DiskTierConfig(path=str(tmp_path), capacity_bytes=2**64)
    with pytest.raises(kv.InvalidArgument, match=r"capacity_bytes: 18446744073709551616 is not a"):
        kv.Worker(worker_config(host_blocks=2, tiers=[store]))
    store.capacity_bytes = np.uint64(2**20)  # a numpy int is an int
    kv.Worker(worker_config(host_blocks=2, tiers=[store]))
    store.capacity_bytes = [1]
    with pytest.raises(kv.InvalidArgument, match=r"capacity_bytes: expected bytes"):
        kv.Worker(worker_config(host_blocks=2, tiers=[store]))


def test_bad_scheduler_fields_are_named():
    with pytest.raises(kv.InvalidArgument, match=r"SchedulerConfig\.groups: expected a list"):
        kv.Scheduler(scheduler_config().__class__(groups=None, host_blocks=4))
    with pytest.raises(kv.InvalidArgument, match=r"groups\[0\]\.gpu_block_size: expected an int"):
        kv.Scheduler(groups=[kv.GroupConfig("full_attention", "16")], host_blocks=4)
    with pytest.raises(kv.InvalidArgument, match=r"tiers\[0\]\.store: expected a kvoffload config"):
        kv.Scheduler(scheduler_config(tiers=[kv.TierConfig(blocks=4, store=("disk", "/tmp"))]))
