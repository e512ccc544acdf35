import runpy
from pathlib import Path

import pytest


def test_alfworld_expert_example(capsys):
    pytest.importorskip("alfworld")
    pytest.importorskip("fast_downward")
    runpy.run_path(str(Path(__file__).resolve().parents[2] / "examples" / "alfworld_expert.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "Your task is to:" in out
    assert "won: True" in out and "reward 1.0" in out
    assert "fork replays the episode: True" in out
