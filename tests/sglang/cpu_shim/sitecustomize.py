# A test shim that lets a real SGLang 0.5.23 server run HiCache on a CPU-only machine
# (tests/sglang/server_check.py; docs/sglang.md). SGLang's host pool pins memory with
# cudaHostRegister unconditionally, and its L1<->L2 copy ops exist only for CUDA, ROCm and
# XPU. With
# KVOFFLOAD_SGLANG_CPU_SHIM=1 and this folder on PYTHONPATH: host pools are not pinned, and the
# "direct" io backend's transfer_kv_direct (layer_first layout) is a torch index copy, per
# layer: dst[dst_indices] = src[src_indices]. Nothing else of SGLang is changed.
#
# A fault for tests/sglang/server_check.py's control, with KVOFFLOAD_SGLANG_TEST_CORRUPT=<file>:
# once that file exists, every page kvoffload's batch_get_v1 loads is negated in the host pool
# (layer_first layout), as if the store had served other bytes.
import os
if os.environ.get("KVOFFLOAD_SGLANG_CPU_SHIM") == "1":
    import importlib.abc, importlib.util, sys

    def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):
        for s, d in zip(src_layers, dst_layers):
            d[dst_indices.to(d.device)] = s[src_indices.to(s.device)]

    def patch_base(module):
        init = module.HostKVCache.__init__
        def patched(self, *a, **kw):
            if "pin_memory" in kw:
                kw["pin_memory"] = False
            else:
                a = list(a); a[8] = False
            return init(self, *a, **kw)
        module.HostKVCache.__init__ = patched

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
            if os.path.exists(flag):
                pool = self.mem_pool_host
                assert pool.layout == "layer_first", pool.layout
                idx = host_indices.to(pool.kv_buffer.device)
                pool.kv_buffer[:, :, idx] = -pool.kv_buffer[:, :, idx]
            return got
        module.KvoffloadStorage.batch_get_v1 = corrupt

    PATCHES = {"sglang.srt.mem_cache.pool_host.base": patch_base,
               "sglang.srt.mem_cache.pool_host.mha": patch_mha,
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
