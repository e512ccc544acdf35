import runpy
from pathlib import Path

import pytest

from twice_envs.envs.searchqa import resources


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TWICE_CACHE", str(tmp_path / "cache"))
    resources.clear()
    yield
    resources.clear()


def test_custom_tool_example(capsys):
    runpy.run_path(str(Path(__file__).resolve().parents[2] / "examples" / "custom_tool.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "<information>Doc 1(Title: \"fictional harbour towns (0)\")" in out
    assert "replay identical with the network off: True" in out
    assert "fork reads the journal: True" in out
    assert "a new query with the network off fails softly: True" in out
