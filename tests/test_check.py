"""The public checker passes on the toy envs and catches each kind of broken env."""

from __future__ import annotations

import pytest

import twice_envs
from twice_envs.check import CheckFailure
from tests import toy_envs


@pytest.mark.parametrize("env_id", ["CoinChain-v0", "CoinChainReplay-v0"])
def test_checker_passes_on_toy_envs(env_id):
    report = twice_envs.check_env(twice_envs.make(env_id), num_episodes=3)
    text = str(report)
    assert "determinism across processes" in text
    assert "fork == replay" in text and "self-twin" in text


class RaisesOnBadAction(toy_envs.CoinChain):
    def _step(self, action):
        if action.strip() not in ("left", "right", "look"):
            raise ValueError("bad action")
        return super()._step(action)


class LeaksAcrossResets(toy_envs.CoinChain):
    visits = 0

    def _reset(self, options):
        obs, info = super()._reset(options)
        type(self).visits += 1
        return obs + f" (visit {type(self).visits})", info


class SharedSnapshot(toy_envs.CoinChain):
    """Snapshot returns mutable state that later steps mutate: forks are not independent."""

    def _reset(self, options):
        obs, info = super()._reset(options)
        self.state = {"pos": 0}
        return obs, info

    def _step(self, action):
        self.pos = self.state["pos"]
        out = super()._step(action)
        self.state["pos"] = self.pos
        return out

    def _snapshot(self):
        return self.state

    def _restore(self, state):
        self.state = state
        self.goal = 3


class HashOrder(toy_envs.CoinChainReplayOnly):
    """Depends on str hash order: deterministic in one process, not across processes."""

    def _reset(self, options):
        obs, info = super()._reset(options)
        return obs + " " + ",".join(list({f"word{i}" for i in range(12)})), info


@pytest.mark.parametrize(
    "cls, match",
    [
        (RaisesOnBadAction, "raised ValueError"),
        (LeaksAcrossResets, "same seed and actions"),
        (SharedSnapshot, "fork"),
        (HashOrder, "second process"),
    ],
)
def test_checker_catches_broken_envs(cls, match):
    env_id = f"Broken{cls.__name__}-v0"
    twice_envs.register(env_id, f"tests.test_check:{cls.__name__}", override=True)
    with pytest.raises(CheckFailure, match=match):
        twice_envs.check_env(twice_envs.make(env_id), num_episodes=2, num_steps=6)


def test_checker_catches_a_restore_that_shares_the_snapshots_data():
    # Every fork of this env looks right on its own; the restore aliases its snapshot.
    twice_envs.register("CoinChainAliasedRestore-v0", "tests.toy_envs:CoinChainAliasedRestore", override=True)
    with pytest.raises(CheckFailure, match=r"fork\(\d+\) of the episode with seed \d+ is wrong: .*snapshot restore"):
        twice_envs.check_env(twice_envs.make("CoinChainAliasedRestore-v0"), num_episodes=3, num_steps=8)

