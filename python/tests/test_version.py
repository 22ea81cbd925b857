"""The version has one source, project() in CMakeLists.txt: the package, its metadata and the
native library all report it."""

import importlib.metadata
import pathlib
import re

import kvoffload as kv


def test_one_version_everywhere():
    cmake = (pathlib.Path(__file__).resolve().parents[2] / "CMakeLists.txt").read_text()
    want = re.search(r"project\(kvoffload VERSION ([0-9]+\.[0-9]+\.[0-9]+)", cmake).group(1)
    assert kv.__version__ == want
    assert importlib.metadata.version("kvoffload") == want
