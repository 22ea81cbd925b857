"""The Python config dataclasses have kvoffload's C++ defaults (one set of defaults: C++)."""

import dataclasses

import kvoffload as kv
from kvoffload import _kvoffload


def dataclass_defaults(cls):
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def test_scheduler_config_defaults_are_the_libraries():
    ours = dataclass_defaults(kv.SchedulerConfig)
    lib = _kvoffload._scheduler_config_defaults()
    assert ours == lib
    # Every field has a default (groups and host_blocks are empty: the caller must set them).
    assert set(ours) == {f.name for f in dataclasses.fields(kv.SchedulerConfig)}


def test_worker_config_defaults_are_the_libraries():
    ours = dataclass_defaults(kv.WorkerConfig)
    lib = _kvoffload._worker_config_defaults()
    assert ours == lib
    # tensors and groups (the engine's memory) have no default in either.
    assert {f.name for f in dataclasses.fields(kv.WorkerConfig)} - set(ours) == {"tensors",
                                                                                "groups"}


def test_shared_tier_config_defaults_are_the_libraries():
    ours = dataclass_defaults(kv.SharedTierConfig)
    assert ours == _kvoffload._shared_tier_config_defaults()
    assert {f.name for f in dataclasses.fields(kv.SharedTierConfig)} - set(ours) == {"nodes",
                                                                                    "name"}
