"""What every engine adapter of kvoffload shares (kvoffload.vllm, kvoffload.sglang): the one
schema of the offload config and its tiers (``config``, ``tiers``), the weights' identity every
tier keys blocks by (``identity``), the counters engines report (``metrics``) and kvoffload's
events grouped for an engine to publish (``events``). Nothing here imports an engine; an
adapter maps its engine's objects onto these and keeps only what is its engine's own.
"""
