import runpy
from pathlib import Path


def test_vector_envs_example(capsys):
    runpy.run_path(str(Path(__file__).resolve().parents[2] / "examples" / "vector_envs.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "terminated: [False, True, False, True]" in out
    assert "first result of sub-env 0: Doc 1" in out
    assert "reward 1.0, sub-env 1 still has reward 0.0" in out
