import runpy
from pathlib import Path


def test_credit_toy_example_runs(capsys):
    runpy.run_path(str(Path(__file__).parents[2] / "examples" / "credit_toy.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "exact advantage" in out and "branched" in out
