"""The Python config dataclasses have kvoffload's C++ defaults (one set of defaults: C++)."""

import dataclasses

import pytest

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


REQUIRED = {  # fields the caller must give: no default in Python
    "SchedulerConfig": set(), "GroupConfig": set(), "TierConfig": {"blocks"},
    "DiskTierConfig": {"path", "capacity_bytes"}, "SharedTierConfig": {"nodes", "name"},
    "WorkerConfig": {"tensors", "groups"},
}
# Python-only fields, not in the library's field lists.
PYTHON_ONLY = {"WorkerConfig": {"tensors", "groups"}}


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_config_dataclasses_have_the_libraries_fields_and_defaults(name):
    """One field list (kvoffload/detail/config_fields.hpp): the same names, and each default
    the C++ struct's."""
    cls = getattr(kv, name)
    lib = _kvoffload._config_defaults()[name]
    names = {f.name for f in dataclasses.fields(cls)}
    assert names - PYTHON_ONLY.get(name, set()) == set(lib)
    ours = dataclass_defaults(cls)
    assert names - set(ours) == REQUIRED[name]
    for k in ours:
        if k in lib:
            assert ours[k] == lib[k], f"{name}.{k}: {ours[k]!r} here, {lib[k]!r} in C++"
