"""The `twice` CLI, driven as a person would: piped keystrokes, saved files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def twice(*args, stdin="", cwd=ROOT):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "twice_envs.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def test_help_and_unknown_command():
    out = twice("--help")
    assert out.returncode == 0 and "play" in out.stdout and "replay" in out.stdout
    out = twice("pley")
    assert out.returncode == 2 and "Did you mean 'play'" in out.stderr


def test_envs_lists_ids():
    out = twice("envs")
    assert out.returncode == 0
    for env_id in ("SearchQA-v0", "WebShop-v0", "ALFWorld-v0"):
        line = next(l for l in out.stdout.splitlines() if l.startswith(env_id + " "))
        assert len(line.split(None, 1)) == 2  # id and a description


def test_play_fork_undo_save_then_replay(tmp_path):
    save = tmp_path / "ep.jsonl"
    keys = "\n".join(
        [
            "look",
            "right",
            "dance",  # invalid: an observation, not a crash
            ":undo",
            ":fork 1",
            "right",
            ":actions",
            f":save {save}",
            ":fork 9",
            ":quit",
        ]
    )
    out = twice("play", "tests.toy_envs:CoinChain-v0", "--seed", "4", "--option", "goal=5", stdin=keys + "\n")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "(invalid action)" in text
    assert "--- turn 2 ---" in text  # after :undo of the invalid third action
    assert "cannot fork: fork(9) is outside this episode" in text
    assert "saved 2 turns" in text
    rec = json.loads(save.read_text().splitlines()[0])
    assert rec["actions"] == ["look", "right"] and rec["options"] == {"goal": 5}

    out = twice("replay", str(save), "--import", "tests.toy_envs", "--show")
    assert out.returncode == 0, out.stderr
    assert "replays exactly" in out.stdout and "> right" in out.stdout


def test_replay_reports_first_divergence(tmp_path):
    save = tmp_path / "ep.jsonl"
    out = twice("play", "tests.toy_envs:CoinChain-v0", "--seed", "1", stdin=f"look\nlook\nlook\n:save {save}\n")
    assert out.returncode == 0, out.stderr
    rec = json.loads(save.read_text())
    rec["observations"][2] = "You are somewhere else."
    save.write_text(json.dumps(rec) + "\n")
    out = twice("replay", str(save), "--import", "tests.toy_envs")
    assert out.returncode == 1
    assert "DIVERGED at turn 2" in out.stdout and "recorded: 'You are somewhere else.'" in out.stdout


def test_replay_of_corrupt_file_is_one_clear_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "twice_envs.trajectory/1", "env_id": "CoinChain-v0"\n')
    out = twice("replay", str(bad))
    assert out.returncode == 1
    assert "bad.jsonl:1: not valid JSON" in out.stderr
    assert "Traceback" not in out.stderr


def test_check_command():
    out = twice("check", "tests.toy_envs:CoinChain-v0", "--episodes", "1")
    assert out.returncode == 0, out.stderr
    assert "checks passed" in out.stdout


def test_bench_unknown_name():
    out = twice("bench", "nosie")
    assert out.returncode == 2 and "Did you mean 'noise'" in out.stderr
