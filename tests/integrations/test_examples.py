"""Smoke tests of the integration examples (TRL on CPU; the verl launcher's data and command)."""

import importlib.util
import shlex
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_trl_searchqa_example_trains(tmp_path):
    pytest.importorskip("trl")
    mod = _load(EXAMPLES / "trl_searchqa.py")
    out = mod.main(["--steps", "1", "--questions", "1", "--group-size", "2", "--max-new-tokens", "32",
                    "--max-turns", "2", "--out", str(tmp_path / "run")])
    assert out["steps"] == 1 and out["last_aux_tokens"] >= 0


def test_verl_launcher_writes_tasks_and_the_published_command(tmp_path, capsys):
    pytest.importorskip("verl")
    pq = pytest.importorskip("pyarrow.parquet")
    mod = _load(EXAMPLES / "verl" / "launch.py")
    assert mod.main(["--model", "/models/qwen", "--dry-run", "--train-questions", "3", "--val-questions", "2",
                     "--data-dir", str(tmp_path)]) == 0
    cmd = shlex.split(capsys.readouterr().out.strip().splitlines()[-1])
    for want in ("algorithm.adv_estimator=twice", "trainer.v1.trainer_mode=twice_envs", "data.train_batch_size=256",
                 "actor_rollout_ref.rollout.n=5", "actor_rollout_ref.actor.optim.lr=1e-6",
                 "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.logprobs_mode=raw_logprobs",
                 "actor_rollout_ref.rollout.agent.default_agent_loop=twice_envs"):
        assert want in cmd, want
    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    assert len(rows) == 3 and rows[2]["agent_name"] == "twice_envs"
    assert rows[2]["extra_info"]["twice_task"] == {"seed": 2, "options": {"split": "train", "index": 2}}
    import yaml

    loops = yaml.safe_load((EXAMPLES / "verl" / "agent_loops.yaml").read_text())
    assert loops[0]["name"] == "twice_envs" and loops[0]["max_new_tokens"] == 500
