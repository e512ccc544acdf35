"""Wrappers: twin, turn limit, recording and the chat view keep the replay API."""

from __future__ import annotations

import pytest

import twice_envs
from tests import toy_envs  # noqa: F401
from twice_envs import NoiseKey
from twice_envs.wrappers import (
    ChatView,
    RecordEpisodes,
    TurnLimit,
    chat_messages,
    fork,
    twin,
    unwrap,
)


def factual(seed=3, actions=("look", "right", "look", "left", "look")):
    env = twice_envs.make("CoinChain-v0", length=30)
    env.reset(seed=seed, options={"goal": 29})
    for a in actions:
        env.step(a)
    return env


def test_self_twin_is_the_factual_episode():
    env = factual()
    for t in range(env.turn):
        tw = twin(env.fork(t), env.trajectory.actions[t], env.noise_schedule)
        for a in env.trajectory.actions[t + 1 :]:
            tw.step(a)
        assert tw.trajectory.digests == env.trajectory.digests


def test_coupled_twin_reports_factual_keys_after_branch():
    env = factual()
    seed = env.noise_schedule.episode_seed
    tw = twin(env.fork(1), "left", seed, branch=2)
    assert tw.alternative_key == NoiseKey(seed, 1, 2, 0, 0)
    keys = [tw.noise_key()]
    for a in ["look", "look"]:
        _, _, _, _, info = tw.step(a)
        keys.append(info["noise_key"])
    assert keys == [NoiseKey(seed, u, 0, 0, 0) for u in (2, 3, 4)]
    assert tw.trajectory.digests[:2] == env.trajectory.digests[:2]
    assert tw.trajectory.digests[2] != env.trajectory.digests[2]


def test_twin_rejects_branch_zero():
    env = factual()
    with pytest.raises(ValueError, match="branch"):
        twin(env.fork(1), "left", env.noise_schedule, branch=0)
    with pytest.raises(TypeError, match="noise_keys"):
        twin(env.fork(1), "left", "seed")


def test_turn_limit_and_fork_keeps_limit():
    env = TurnLimit(twice_envs.make("CoinChain-v0", length=30), 3)
    env.reset(seed=0, options={"goal": 29})
    outs = [env.step("look") for _ in range(3)]
    assert [o[3] for o in outs] == [False, False, True]
    f = env.fork(1)
    assert isinstance(f, TurnLimit)
    assert [f.step("look")[3] for _ in range(2)] == [False, True]
    assert unwrap(f).turn == 3


def test_record_episodes_writes_replayable_file(tmp_path):
    path = tmp_path / "rec.jsonl"
    env = RecordEpisodes(twice_envs.make("CoinChain-v0", length=3), path)
    for seed in range(3):
        env.reset(seed=seed, options={"goal": 1})
        done = False
        while not done:
            _, _, term, trunc, _ = env.step("right")
            done = term or trunc
    recs = twice_envs.load_trajectories(path)
    assert len(recs) == 3 and [r.seed for r in recs] == [0, 1, 2]
    for r in recs:
        assert twice_envs.replay(r).trajectory.digests == r.digests


def test_chat_view_messages():
    env = ChatView(twice_envs.make("CoinChain-v0"), system="You walk.")
    obs, info = env.reset(seed=0)
    assert info["messages"] == [{"role": "system", "content": "You walk."}, {"role": "user", "content": obs}]
    obs2, *_, info = env.step("look")
    assert info["messages"][-2:] == [{"role": "assistant", "content": "look"}, {"role": "user", "content": obs2}]
    assert chat_messages(env.trajectory)[0]["role"] == "user"
    assert isinstance(fork(env, 1), ChatView)
