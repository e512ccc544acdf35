import runpy
from pathlib import Path


def test_custom_env_example(capsys):
    runpy.run_path(str(Path(__file__).resolve().parents[2] / "examples" / "custom_env.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "Correct!" in out
    assert "same secret: True" in out
    assert "checks passed" in out
