import runpy
import sys
from pathlib import Path

import twice_envs
from tests.agents._tiny import tiny_dir


def test_agent_rollout_example(capsys, monkeypatch):
    env_id = "SearchQA-v0" if "SearchQA-v0" in twice_envs.registry else "CoinChain-v0"
    example = Path(__file__).resolve().parents[2] / "examples" / "agent_rollout.py"
    monkeypatch.setattr(sys, "argv", [str(example), "--model", str(tiny_dir()), "--env", env_id])
    runpy.run_path(str(example), run_name="__main__")
    out = capsys.readouterr().out
    assert out.count("episode ") == 4
    assert "twin of turn 0" in out and "D = " in out
