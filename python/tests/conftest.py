import hashlib
import types

import pytest


def block_hashes(prefix: str, n: int):
    """n distinct 16-byte block hashes; the same prefix gives the same hashes."""
    return [hashlib.sha256(f"{prefix}/{i}".encode()).digest()[:16] for i in range(n)]


@pytest.fixture
def hashes():
    return block_hashes


class TorchLike:
    """Stands in for a torch.Tensor over a NumPy array, with the part of its API that
    kvoffload reads (strides in elements, as torch gives them); ``cuda`` makes it claim to be
    on a GPU (nothing copies from it: the tests that use it fake the worker)."""

    def __init__(self, array, cuda: bool = False, device_index: int = 0):
        self._a = array
        self.is_cuda = cuda
        self.device = types.SimpleNamespace(type="cuda" if cuda else "cpu",
                                            index=device_index if cuda else None)
        self.shape = array.shape
        self.dtype = f"torch.{array.dtype}"  # what kvoffload.vllm.page_note prints

    def data_ptr(self) -> int:
        return self._a.__array_interface__["data"][0]

    def element_size(self) -> int:
        return self._a.itemsize

    def dim(self) -> int:
        return self._a.ndim

    def numel(self) -> int:
        return self._a.size

    def stride(self, d=None):
        s = tuple(x // self._a.itemsize for x in self._a.strides)
        return s if d is None else s[d]

    def is_contiguous(self) -> bool:
        return self._a.flags.c_contiguous

    def __getitem__(self, i):
        return TorchLike(self._a[i], self.is_cuda, self.device.index)
