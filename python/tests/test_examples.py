import pathlib
import runpy

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "engine_loop.py"


def test_engine_loop_example_verifies_its_loads(capsys):
    module = runpy.run_path(str(EXAMPLE))
    assert module["main"](["--quiet"]) == 0
    out = capsys.readouterr().out
    assert "0 mismatches" in out and " 0 loaded blocks" not in out
