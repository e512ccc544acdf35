"""Smoke test: examples/webshop_scripted.py runs and prints both agents' scores."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_example_runs():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "webshop_scripted.py"), "10"],
        capture_output=True, text=True, timeout=120, env=env, check=True,
    ).stdout
    assert "scripted mean reward" in out and "random   mean reward" in out
    assert "fork is back on: search | original still on: results" in out
