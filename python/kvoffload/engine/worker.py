"""The worker side of an adapter: the engine's KV tensors registered once each, the layout note
that keeps engines with other page layouts from reading each other's tier blocks, and the
kv.Worker over them."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import kvoffload as kv


def page_note(t: Any) -> str:
    """A KV tensor's page (everything after the block dimension): dtype, shape and strides.
    Attention backends with pages of equal bytes order them differently (NHD, HND); the
    worker's layout_note keeps such engines from reading each other's tier blocks."""
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape[1:])}/{list(t.stride()[1:])}"


class TensorTable:
    """The engine's KV tensors, each registered once (layers that share a tensor, K and V views
    of one allocation), with their page notes; ``member`` gives a group's (tensor index, page
    bytes) entry of WorkerConfig.groups."""

    def __init__(self) -> None:
        self.tensors: List[kv.KvTensor] = []
        self._index: Dict[Tuple[int, Tuple[int, ...], Tuple[int, ...]], int] = {}
        self._notes: Dict[int, str] = {}

    def member(self, t: Any) -> Tuple[int, int]:
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()))
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self.tensors)
            self.tensors.append(kv.tensor_of(t))
            self._notes[i] = page_note(t)
        return i, self.tensors[i].page_bytes

    def layout_note(self) -> str:
        return " ".join(self._notes[i] for i in sorted(self._notes))


def make_worker(config: kv.SchedulerConfig, table: TensorTable,
                groups: List[List[Tuple[int, int]]], first: Any,
                max_store_bytes: int = 0, tp_rank: int = 0,
                defer_stores: bool = True) -> Tuple[kv.Worker, Optional[int]]:
    """A kv.Worker over the registered tensors: the CUDA backend, on the current stream of
    ``first``'s device, when they are CUDA tensors; the host backend for CPU tensors. The
    factor and the pool's size come from the scheduler's config. Returns the worker and the
    compute stream's handle (None on the host)."""
    cuda = bool(getattr(first, "is_cuda", False))
    stream = None
    if cuda:
        import torch

        stream = int(torch.cuda.current_stream(first.device).cuda_stream)
    worker = kv.Worker(kv.derive_worker_config(config, kv.WorkerConfig(
        tensors=table.tensors, groups=groups,
        backend="cuda" if cuda else "host", threads=0 if cuda else 2,
        cuda_device=(first.device.index or 0) if cuda else 0, defer_stores=defer_stores,
        compute_stream=stream, max_store_bytes_in_flight=max_store_bytes,
        tp_rank=tp_rank, layout_note=table.layout_note())))
    return worker, stream
