# A test shim that lets a real SGLang 0.5.23 server run HiCache on a CPU-only machine
# (tests/sglang/server_check.py, bench/sglang_serve_bench.py; docs/sglang.md). SGLang's host
# pool pins memory with cudaHostRegister unconditionally, and its L1<->L2 copy ops exist only
# for CUDA, ROCm and XPU. With KVOFFLOAD_SGLANG_CPU_SHIM=1 and this folder on PYTHONPATH: host
# pools are not pinned, and the "direct" io backend's transfer_kv_direct (layer_first layout)
# is a torch index copy, per layer: dst[dst_indices] = src[src_indices]. Nothing else of SGLang
# is changed.
#
# Two test hooks of tests/sglang/server_check.py, off unless their variable is set:
# - KVOFFLOAD_SGLANG_TEST_POISON=1: whenever SGLang clears its device or host KV pool (at start,
#   /flush_cache), every value is set to POISON: /flush_cache frees slots but keeps their bytes,
#   so a hit that copied nothing (or to the wrong slots) could read the old, right KV; poisoned,
#   it reads POISON and the output changes.
# - KVOFFLOAD_SGLANG_TEST_CORRUPT=<file>: once that file exists, the first token of the first
#   page each kvoffload batch_get_v1 loads has its layer-0 keys and values negated in the host
#   pool, as if the store had served one wrong token: the control that the comparisons see a
#   single bad page.
import os

POISON = 7.0

if os.environ.get("KVOFFLOAD_SGLANG_CPU_SHIM") == "1":
    import importlib.abc
    import importlib.util
    import sys

    def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):
        for s, d in zip(src_layers, dst_layers):
            d[dst_indices.to(d.device)] = s[src_indices.to(s.device)]

    def poisoning():
        return os.environ.get("KVOFFLOAD_SGLANG_TEST_POISON") == "1"

    def patch_base(module):
        init = module.HostKVCache.__init__

        def unpinned(self, *a, **kw):
            if "pin_memory" in kw:
                kw["pin_memory"] = False
            else:
                a = list(a)
                a[8] = False
            return init(self, *a, **kw)
        module.HostKVCache.__init__ = unpinned
        if poisoning():
            clear = module.HostKVCache.clear

            def poisoned(self):
                clear(self)
                if getattr(self, "kv_buffer", None) is not None:
                    self.kv_buffer.fill_(POISON)
            module.HostKVCache.clear = poisoned

    def patch_paged(module):
        if not poisoning():
            return
        clear = module.PagedTokenToKVPoolAllocator.clear

        def poisoned(self):
            clear(self)
            kv = getattr(self, "_kvcache", None)
            for buf in (getattr(kv, "k_buffer", None) or []) + \
                    (getattr(kv, "v_buffer", None) or []):
                buf.fill_(POISON)
        module.PagedTokenToKVPoolAllocator.clear = poisoned

    def patch_mha(module):
        if not hasattr(module, "transfer_kv_direct"):
            module.transfer_kv_direct = transfer_kv_direct

    def patch_backend(module):
        flag = os.environ.get("KVOFFLOAD_SGLANG_TEST_CORRUPT")
        if not flag:
            return
        get = module.KvoffloadStorage.batch_get_v1

        def corrupt(self, keys, host_indices, extra_info=None):
            got = get(self, keys, host_indices, extra_info)
            if os.path.exists(flag) and len(host_indices) and got and got[0]:
                pool = self.mem_pool_host
                assert pool.layout == "layer_first", pool.layout
                i = int(host_indices[0])
                pool.kv_buffer[:, 0, i] = -pool.kv_buffer[:, 0, i]
            return got
        module.KvoffloadStorage.batch_get_v1 = corrupt

    PATCHES = {"sglang.srt.mem_cache.pool_host.base": patch_base,
               "sglang.srt.mem_cache.pool_host.mha": patch_mha,
               "sglang.srt.mem_cache.allocator.paged": patch_paged,
               "kvoffload.sglang.backend": patch_backend}

    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in PATCHES:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            orig = spec.loader.exec_module

            def exec_module(module, orig=orig, patch=PATCHES[name]):
                orig(module)
                patch(module)
            spec.loader.exec_module = exec_module
            return spec
    sys.meta_path.insert(0, _Hook())
