"""The hubs page's OpenEnv example runs: an episode over the wire, a fork, and a restore on a second server."""

import runpy
from pathlib import Path

import pytest

pytest.importorskip("openenv")

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "hubs" / "openenv_client.py"


def test_openenv_client_example(capsys):
    out = runpy.run_path(str(EXAMPLE))["main"]([])
    assert out["same"] and out["restored"] == out["digest"]
    assert "same digest after the restore: True" in capsys.readouterr().out
