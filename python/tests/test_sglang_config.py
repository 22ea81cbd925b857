"""kvoffload.sglang without SGLang: its extra config, the features it refuses, and where it
reads each page of a host pool (a stand-in pool with SGLang's get_page_buffer_meta)."""

import types

import pytest

import kvoffload as kv
import kvoffload.sglang as kvs


def test_extra_config():
    base = {"backend_name": "kvoffload", "module_path": "kvoffload.sglang",
            "class_name": "KvoffloadStorage", "interface_v1": 1}
    assert kvs.offload_extra(dict(base, host_bytes="1GiB")) == {"host_bytes": "1GiB"}
    with pytest.raises(kv.InvalidArgument, match='"interface_v1": 1'):
        kvs.offload_extra({"host_bytes": "1GiB"})
    with pytest.raises(kv.InvalidArgument, match=r"unknown key\(s\) \['max_store_bytes_in_fl"):
        kvs.offload_extra(dict(base, max_store_bytes_in_flight="1GiB"))
    with pytest.raises(kv.InvalidArgument, match="expected a JSON object"):
        kvs.offload_extra("host_bytes=1GiB")


def test_unproven_features_are_named():
    plain = types.SimpleNamespace(is_mla_model=False, pp_size=1, attn_cp_size=1, dcp_size=1,
                                  should_split_heads=False, tp_lcm_size=None)
    assert kvs.storage_problems(plain) == []
    bad = types.SimpleNamespace(is_mla_model=True, pp_size=2, attn_cp_size=1, dcp_size=1,
                                should_split_heads=True, tp_lcm_size=8)
    problems = kvs.storage_problems(bad)
    assert len(problems) == 3 and "MLA" in problems[0] and "pp_size 2" in problems[1]


class Pool:
    """SGLang's page-first pool in miniature: K and V buffers of `pages` pages each."""

    def __init__(self, pages=8, ps=4, token_bytes=64, uneven=False):
        self.page_size, self.size, self.layout = ps, pages * ps, "page_first"
        self.tb, self.uneven = token_bytes, uneven

    def get_page_buffer_meta(self, indices):
        p = int(indices[0]) // self.page_size
        skew = 4096 if self.uneven and p == self.size // self.page_size - 1 else 0
        page = self.page_size * self.tb
        return [1 << 20 | p * page + skew, 1 << 24 | p * page], [page, page]


def test_page_buffers_from_the_pools_metadata():
    def index(lo, hi):
        return list(range(lo, hi))
    assert kvs.page_buffers(Pool(), index) == [(1 << 20, 8, 256, 256), (1 << 24, 8, 256, 256)]
    with pytest.raises(kv.InvalidArgument, match="not evenly spaced"):
        kvs.page_buffers(Pool(uneven=True), index)
