import pytest

import kvoffload as kv
from conftest import block_hashes


def test_exception_hierarchy():
    assert issubclass(kv.InvalidArgument, kv.Error) and issubclass(kv.InvalidArgument, ValueError)
    assert issubclass(kv.OutOfMemory, MemoryError) and issubclass(kv.CudaError, kv.Error)
    assert issubclass(kv.Unsupported, kv.Error) and issubclass(kv.InternalError, kv.Error)
    assert issubclass(kv.IoError, kv.Error) and issubclass(kv.IoError, OSError)


# error.hpp's table, written out: C status value -> Python class. Each row's C++ exception is
# raised inside the library and must arrive as its class, message intact.
ERROR_TABLE = [
    (1, kv.InvalidArgument),
    (2, kv.OutOfMemory),
    (3, kv.CudaError),
    (4, kv.Unsupported),
    (5, kv.InternalError),
    (6, kv.IoError),
]


@pytest.mark.parametrize("status,cls", ERROR_TABLE)
def test_error_table_row(status, cls):
    from kvoffload import _kvoffload
    with pytest.raises(cls, match="row message") as info:
        _kvoffload._raise_for_test(status, "row message")
    # Exactly that class: no other row's class is a base of it.
    for _, other in ERROR_TABLE:
        if other is not cls:
            assert not isinstance(info.value, other)


def test_cuda_backend_without_cuda_is_unsupported():
    import numpy as np
    if kv.cuda_device_count() > 0:
        pytest.skip("a CUDA device is visible: the backend is supported here")
    t = kv.tensor_of(np.zeros((8, 64), dtype=np.uint8))
    with pytest.raises(kv.Unsupported, match="CUDA"):
        kv.Worker(kv.WorkerConfig([t], [[(0, 64)]], host_blocks=4, backend="cuda"))


FULL = [kv.GroupConfig("full_attention", 16)]


@pytest.mark.parametrize("kw,field", [
    (dict(groups=FULL), "host_blocks"),  # no default capacity
    (dict(host_blocks=8), "groups"),     # no default model
    (dict(groups=FULL, host_blocks=8, policy="fifo"), "fifo"),
    (dict(groups=FULL, host_blocks=8, block_size_factor=0), "block_size_factor"),
    (dict(groups=[kv.GroupConfig("sliding_window", 16, 0)], host_blocks=8), "sliding_window"),
    (dict(groups=[kv.GroupConfig("linear", 16)], host_blocks=8), "groups[0].kind"),
])
def test_bad_config_names_the_field(kw, field):
    with pytest.raises(kv.InvalidArgument, match=field.replace("[", r"\[").replace("]", r"\]")):
        kv.Scheduler(**kw)


def test_bad_calls_raise_and_change_nothing():
    s = kv.Scheduler(groups=FULL, host_blocks=8)
    with pytest.raises(kv.InvalidArgument, match="nobody"):
        s.lookup("nobody")
    with pytest.raises(kv.InvalidArgument, match="block hash 1 has 40 bytes"):
        s.update_request("a", 32, [b"x", b"y" * 40])
    with pytest.raises(kv.InvalidArgument, match="block hash 0 has 0 bytes"):
        s.update_request("a", 32, [b""])
    s.update_request("a", 32, block_hashes("e", 2))
    s.lookup("a")
    s.on_allocated("a", [kv.AllocatedGroup([])], 0)
    with pytest.raises(kv.InvalidArgument, match="groups"):  # two groups for a one-group model
        s.build_step([kv.ScheduledRequest("a", 0, 32, [[1, 2], [3, 4]])])
    with pytest.raises(kv.InvalidArgument, match="negative block id"):
        s.build_step([kv.ScheduledRequest("a", 0, 32, [[1, -2]])])
    with pytest.raises(kv.InvalidArgument, match="unknown job 99"):
        s.on_completed([kv.JobReport(99)])
    with pytest.raises(TypeError):
        s.lookup(42)
    # The scheduler still works after every refused call.
    step = s.build_step([kv.ScheduledRequest("a", 0, 32, [[1, 2]])])
    assert len(step.store_jobs) == 1


def test_worker_errors():
    import numpy as np
    gpu = np.zeros((8, 64), dtype=np.uint8)
    t = kv.tensor_of(gpu)
    with pytest.raises(kv.InvalidArgument, match="host_blocks"):
        kv.Worker(kv.WorkerConfig([t], [[(0, 64)]], host_blocks=0))
    with pytest.raises(kv.InvalidArgument, match="backend"):
        kv.Worker(kv.WorkerConfig([t], [[(0, 64)]], host_blocks=4, backend="tpu"))
    with pytest.raises(kv.InvalidArgument):
        kv.Worker(kv.WorkerConfig([t], [[(3, 64)]], host_blocks=4))  # no tensor 3
    try:
        kv.Worker(kv.WorkerConfig([t], [[(0, 64)]], host_blocks=4, backend="cuda"))
    except (kv.Unsupported, kv.CudaError) as e:
        assert "CUDA" in str(e)
    with pytest.raises(kv.OutOfMemory):
        big = kv.KvTensor(t.base, 8, 1 << 20, 1 << 20)
        kv.Worker(kv.WorkerConfig([big], [[(0, 1 << 20)]], host_blocks=2**31 - 2))
    w = kv.Worker(kv.WorkerConfig([t], [[(0, 64)]], host_blocks=4, threads=1))
    with pytest.raises(kv.InvalidArgument, match="host block 4 is out of range"):
        w.host_block(4)
    with pytest.raises(kv.InvalidArgument, match="tensor_of"):
        kv.tensor_of([1, 2, 3])
