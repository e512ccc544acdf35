import runpy
from pathlib import Path

import pytest


def test_pettingzoo_group_example(capsys):
    pytest.importorskip("pettingzoo")
    runpy.run_path(str(Path(__file__).resolve().parents[2] / "examples" / "pettingzoo_group.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "agents: ['world_0', 'world_1', 'world_2', 'twin_0']" in out
    assert "twin reads world_2's noise key for turn 1: True" in out
    assert "rewards: {'world_0': 1.0, 'world_1': 0.0, 'world_2': 1.0, 'twin_0': 1.0}" in out
    assert "live agents: []" in out
