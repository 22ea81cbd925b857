import pytest
import numpy as np

import kvoffload as kv
from conftest import TorchLike, block_hashes


def test_round_trip_through_the_host_pool():
    """Store a request's pages, overwrite the GPU copy, load them into other blocks of a
    second request with the same prompt and compare the bytes."""
    f, page = 2, 128
    gpu = np.zeros((32, page), dtype=np.uint8)  # the "GPU" KV tensor: 32 blocks
    rng = np.random.default_rng(7)
    s = kv.Scheduler(groups=[kv.GroupConfig("full_attention", 16)], host_blocks=16,
                     block_size_factor=f)
    w = kv.Worker(kv.WorkerConfig([kv.tensor_of(gpu)], [[(0, page)]], host_blocks=16,
                                  block_size_factor=f, threads=1))
    h = block_hashes("w", 4)  # 64 tokens: 4 GPU blocks, 2 host blocks
    first = [1, 2, 3, 4]
    gpu[first] = rng.integers(0, 256, size=(4, page), dtype=np.uint8)
    original = gpu[first].copy()

    s.update_request("a", 64, h)
    assert s.lookup("a") == 0
    s.on_allocated("a", [kv.AllocatedGroup([])], 0)
    step = s.build_step([kv.ScheduledRequest("a", 0, 64, [first])])
    w.submit_step(step)
    w.wait([j.id for j in step.store_jobs])
    finished = w.get_finished()
    assert [(x.job, x.kind, x.ok) for x in finished] == [(step.store_jobs[0].id, "store", True)]
    assert finished[0].bytes == 4 * page
    s.on_completed([kv.JobReport(x.job, ok=x.ok) for x in finished])
    s.on_finished("a")
    host = step.store_jobs[0].host_block_ids
    assert np.array_equal(w.host_block(int(host[0]))[: 2 * page], original[:2].reshape(-1))

    gpu[first] = 0  # the GPU copy is gone
    second = [9, 10, 11, 12]
    s.update_request("b", 64, h)
    hit = s.lookup("b")
    assert hit == 64
    s.on_allocated("b", [kv.AllocatedGroup(second)], hit)
    step = s.build_step([kv.ScheduledRequest("b", hit, 0, [[]])])
    assert len(step.load_jobs) == 1
    w.submit_step(step)
    w.wait([step.load_jobs[0].id])
    done = s.on_completed([kv.JobReport(x.job, ok=x.ok) for x in w.get_finished()])
    assert [d.kind for d in done] == ["load"] and done[0].ok
    assert np.array_equal(gpu[second], original)


def test_tensor_of_reads_numpy_layouts():
    a = np.zeros((10, 4, 8), dtype=np.float16)
    t = kv.tensor_of(a)
    assert (t.num_blocks, t.page_bytes, t.block_stride_bytes) == (10, 64, 64)
    assert t.base == a.__array_interface__["data"][0]
    padded = np.zeros((10, 96), dtype=np.uint8)[:, :64]  # pages of 64 bytes, 96 apart
    t = kv.tensor_of(padded)
    assert (t.page_bytes, t.block_stride_bytes) == (64, 96)


@pytest.mark.parametrize("wrap", [lambda a: a, TorchLike], ids=["numpy", "torch"])
def test_tensor_of_refuses_pages_that_are_not_their_bytes(wrap):
    """A page is copied as page_bytes bytes at base + i * stride: a view whose pages have gaps
    (t[:, :, :half]: the copy would take the other half's bytes too) or overlap is refused;
    padding between whole pages and pages whose dimensions are permuted (vLLM's HND
    stride order) are the page's bytes and accepted."""
    a = np.zeros((10, 4, 8), dtype=np.float16)
    t = kv.tensor_of(wrap(a))
    assert (t.base, t.num_blocks, t.page_bytes, t.block_stride_bytes) == \
        (a.__array_interface__["data"][0], 10, 64, 64)
    t = kv.tensor_of(wrap(np.zeros((10, 96), dtype=np.uint8)[:, :64]))  # padding between pages
    assert (t.page_bytes, t.block_stride_bytes) == (64, 96)
    t = kv.tensor_of(wrap(a[:, :2]))  # the first rows of each page: still whole bytes
    assert (t.page_bytes, t.block_stride_bytes) == (32, 64)
    t = kv.tensor_of(wrap(np.zeros((10, 8, 4), dtype=np.float16).transpose(0, 2, 1)))
    assert (t.page_bytes, t.block_stride_bytes) == (64, 64)
    t = kv.tensor_of(wrap(np.zeros((2, 10, 4, 8), dtype=np.float16)[1]))  # V of stacked K/V
    assert (t.num_blocks, t.page_bytes, t.block_stride_bytes) == (10, 64, 64)

    for bad in (a[:, :, :4], a[:, ::2], a[:, :, ::-1]):
        with pytest.raises(kv.InvalidArgument, match="pages t\\[i\\].*not contiguous"):
            kv.tensor_of(wrap(bad))
    for bad in (np.broadcast_to(np.zeros((1, 64), dtype=np.uint8), (10, 64)),  # stride 0
                np.zeros((10, 64), dtype=np.uint8)[::-1]):
        with pytest.raises(kv.InvalidArgument, match="pages overlap"):
            kv.tensor_of(wrap(bad))
    with pytest.raises(kv.InvalidArgument, match="no block dimension"):
        kv.tensor_of(wrap(np.zeros((), dtype=np.uint8)))


class _FakeTorchStream:
    """Stands in for torch.cuda.Stream: only the cuda_stream attribute is read."""

    def __init__(self, handle):
        self.cuda_stream = handle


def test_compute_stream_handles():
    """An int or anything with a cuda_stream attribute; 0 (the legacy stream) is a stream,
    None is not; bools and other objects are refused by name."""
    assert kv.stream_handle(None) is None
    assert kv.stream_handle(0) == 0
    assert kv.stream_handle(0x7f00) == 0x7f00
    assert kv.stream_handle(_FakeTorchStream(0x1234)) == 0x1234
    with pytest.raises(kv.InvalidArgument, match="compute_stream"):
        kv.stream_handle(True)
    with pytest.raises(kv.InvalidArgument, match="cuda_stream attribute"):
        kv.stream_handle("stream")


def test_compute_stream_is_checked_by_the_worker():
    gpu = np.zeros((4, 64), dtype=np.uint8)
    base = dict(tensors=[kv.tensor_of(gpu)], groups=[[(0, 64)]], host_blocks=2, threads=1)
    # cudaStreamPerThread names another stream on the backend's threads.
    with pytest.raises(kv.InvalidArgument, match="cudaStreamPerThread"):
        kv.Worker(kv.WorkerConfig(**base, backend="cuda", compute_stream=2))
    # The host backend has no compute stream, not even the legacy one (0).
    with pytest.raises(kv.InvalidArgument, match="host backend"):
        kv.Worker(kv.WorkerConfig(**base, compute_stream=_FakeTorchStream(0)))
    w = kv.Worker(kv.WorkerConfig(**base))
    with pytest.raises(kv.InvalidArgument, match="needs the CUDA backend"):
        w.set_compute_stream(0)


def test_copy_mode_is_checked_and_the_host_backend_has_no_cuda_stats():
    gpu = np.zeros((4, 64), dtype=np.uint8)
    base = dict(tensors=[kv.tensor_of(gpu)], groups=[[(0, 64)]], host_blocks=2, threads=1)
    with pytest.raises(kv.InvalidArgument, match='copy_mode: unknown copy mode "fast"'):
        kv.Worker(kv.WorkerConfig(**base, copy_mode="fast"))
    assert kv.Worker(kv.WorkerConfig(**base, copy_mode="batch")).cuda_stats() is None


def test_build_facts():
    assert isinstance(kv.built_with_cuda(), bool)
    n = kv.cuda_device_count()
    assert isinstance(n, int) and n >= 0
    if not kv.built_with_cuda():
        assert n == 0


def test_a_job_built_by_hand_runs_and_is_checked_on_submit():
    """kv.Job's constructor (tools and the GPU bundle's checks build jobs without a
    scheduler): a store and a load of it round-trip; a tier job's kind is refused at once, and
    a load writing one GPU block twice is refused on submit, naming the job."""
    f, page = 2, 64
    gpu = np.zeros((16, page), dtype=np.uint8)
    w = kv.Worker(kv.WorkerConfig([kv.tensor_of(gpu)], [[(0, page)]], host_blocks=4,
                                  block_size_factor=f, threads=1))
    gpu[[1, 2]] = np.arange(2 * page, dtype=np.uint8).reshape(2, page)
    keys = [(b"\x01" * 16, 0)]
    store = kv.Job(7, "store", keys, [1, 2], [2], [0], [3], request_id="by-hand")
    assert (store.id, store.kind, store.request_id, list(store.host_block_ids)) == (
        7, "store", "by-hand", [3])
    w.submit(store)
    w.wait([7])
    assert [(x.job, x.ok) for x in w.get_finished()] == [(7, True)]
    w.submit(kv.Job(8, "load", keys, [5, 6], [2], [0], [3]))
    w.wait([8])
    assert [(x.job, x.ok) for x in w.get_finished()] == [(8, True)]
    assert np.array_equal(gpu[[5, 6]], gpu[[1, 2]])
    with pytest.raises(kv.InvalidArgument, match="tier job"):
        kv.Job(9, "promote", keys, [1, 2], [2], [0], [3])
    with pytest.raises(kv.InvalidArgument, match="job 10: GPU block 1 is loaded twice"):
        w.submit(kv.Job(10, "load", keys, [1, 1], [2], [0], [3]))
