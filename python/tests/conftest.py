import hashlib

import pytest


def block_hashes(prefix: str, n: int):
    """n distinct 16-byte block hashes; the same prefix gives the same hashes."""
    return [hashlib.sha256(f"{prefix}/{i}".encode()).digest()[:16] for i in range(n)]


@pytest.fixture
def hashes():
    return block_hashes
