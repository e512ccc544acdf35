"""Trajectory records: JSON lines round trip, atomic writes, clear errors on bad files."""

from __future__ import annotations

import json
import os

import pytest

import twice_envs
from twice_envs import TrajectoryFormatError
from twice_envs.trajectory import atomic_write_text, load_trajectories, save_trajectories
from tests import toy_envs  # noqa: F401


def episode(seed=0):
    env = twice_envs.make("CoinChain-v0")
    env.reset(seed=seed)
    for a in ["look", "right", "🙂"]:
        env.step(a)
    return env.trajectory


def test_round_trip(tmp_path):
    recs = [episode(0), episode(1)]
    path = tmp_path / "eps.jsonl"
    save_trajectories(path, recs)
    back = load_trajectories(path)
    assert [r.to_json() for r in back] == [r.to_json() for r in recs]
    assert twice_envs.replay(back[1]).trajectory.digests == recs[1].digests


@pytest.mark.parametrize(
    "line, match",
    [
        ("{not json", "not valid JSON"),
        ('{"format": "something-else/1"}', "not a twice_envs trajectory"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, line, match):
    path = tmp_path / "bad.jsonl"
    good = json.dumps(episode().to_json())
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(TrajectoryFormatError, match=rf"bad\.jsonl:2: {match}"):
        load_trajectories(path)


def test_missing_field_and_inconsistent_lengths(tmp_path):
    rec = episode().to_json()
    del rec["digests"]
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    with pytest.raises(TrajectoryFormatError, match="missing field 'digests'"):
        load_trajectories(path)
    rec = episode().to_json()
    rec["rewards"].append(1.0)
    path.write_text(json.dumps(rec) + "\n")
    with pytest.raises(TrajectoryFormatError, match="inconsistent lengths"):
        load_trajectories(path)


def test_missing_file():
    with pytest.raises(TrajectoryFormatError, match="no such file"):
        load_trajectories("/nonexistent/x.jsonl")


def test_atomic_write_leaves_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "f.txt"
    atomic_write_text(path, "old")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_text(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]  # no temp file left behind


def test_unregistered_env_in_record():
    rec = episode().to_json()
    rec["env_id"] = "Unknown-v9"
    with pytest.raises(TrajectoryFormatError, match="not registered"):
        twice_envs.replay(rec)
