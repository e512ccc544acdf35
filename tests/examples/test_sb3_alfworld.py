import re
import runpy
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_sb3_alfworld_example(capsys, monkeypatch):
    pytest.importorskip("sb3_contrib")
    script = Path(__file__).resolve().parents[2] / "examples" / "sb3_alfworld.py"
    argv = [str(script), "--timesteps", "32", "--episodes", "1", "--max-turns", "4", "--n-steps", "16"]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert re.search(r"env: (ALFWorld-[A-Za-z]+-v0|WebShop-v0), task: \S", out)
    match = re.search(r"success before: ([0-9.]+)  after 32 steps: ([0-9.]+)  \(1 episodes each\)", out)
    assert match and all(0.0 <= float(v) <= 1.0 for v in match.groups())
