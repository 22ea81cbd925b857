"""A vLLM general plugin for tests/vllm/engine_check.py: the model loader "seeded_dummy".

vLLM's own dummy weights are tiny uniform values, so a model's output barely depends on its
prompt and a wrong KV block could go unnoticed. "seeded_dummy" starts from those and then draws
every parameter from a normal distribution seeded by the parameter's name (1/sqrt(fan-in) for
matrices, N(0, 1) for the embedding, ones for the norms), so two engines built from the same
config.json hold the same weights and every prompt token matters.

engine_check.py registers it in its own process; for the server's engine-core process it puts a
dist-info with a vllm.general_plugins entry point on PYTHONPATH (vLLM loads those in every
process it starts).
"""

import zlib


def register():
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
                    if p.dim() == 1:
                        p.fill_(1.0)
                        continue
                    std = 1.0 if "embed_tokens" in name else p.shape[-1] ** -0.5
                    p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype)
                            * std)
