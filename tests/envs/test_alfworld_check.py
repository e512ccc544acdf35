"""ALFWorld-v0 passes the contract checker; a recorded 30-step episode replays identically."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("alfworld")
pytest.importorskip("fast_downward")

import twice_envs  # noqa: E402
from twice_envs import ReplayDivergence, check_env, load_trajectories, replay  # noqa: E402
from twice_envs.trajectory import step_digest  # noqa: E402

RECORD = Path(__file__).resolve().parent / "data" / "alfworld_episode_30.jsonl"


@pytest.mark.slow
def test_check_env_passes():
    report = check_env(twice_envs.make("ALFWorld-v0"), seed=3, num_episodes=2, num_steps=8, max_forks=4)
    assert "determinism across processes (different PYTHONHASHSEED)" in report.passed
    assert not report.skipped


def test_recorded_30_step_episode_replays_identically():
    (record,) = load_trajectories(RECORD)
    assert record.num_turns == 30 and record.env_id == "ALFWorld-v0"
    env = replay(record)  # raises ReplayDivergence at the first differing turn
    assert env.trajectory.digests == record.digests
    assert env.trajectory.observations == record.observations
    # a fork in the middle continues exactly like the record
    child = env.fork(17)
    for action in record.actions[17:]:
        child.step(action)
    assert child.trajectory.digests == record.digests
    # a record whose observation 12 differs (with a consistent digest chain) diverges at turn 12
    bad = load_trajectories(RECORD)[0]
    bad.observations[12] = "You arrive somewhere else."
    for t in range(12, bad.num_turns + 1):
        bad.digests[t] = step_digest(bad.digests[t - 1], bad.actions[t - 1], bad.observations[t], bad.rewards[t - 1])
    with pytest.raises(ReplayDivergence) as err:
        replay(bad)
    assert err.value.turn == 12
