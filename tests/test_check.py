"""The public checker passes on the toy envs and catches each kind of broken env."""

from __future__ import annotations

import pytest

import twice_envs
from tests import toy_envs
from twice_envs.check import CheckFailure


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


def _expects_invalid(env_id):
    """The env's own parser: True where a turn holds no action of the env's protocol."""
    if env_id.startswith("SearchQA"):
        from twice_envs.envs.searchqa.protocol import parse_action

        return lambda a: parse_action(a).kind is None
    if env_id.startswith("WebShop"):
        from twice_envs.envs.webshop.env import parse_action

        return lambda a: parse_action(a) is None
    return lambda a: True  # ALFWorld: none of the bad inputs is an admissible command


@pytest.mark.parametrize("env_id", ["SearchQA-v0", "WebShop-v0", "ALFWorld-v0"])
def test_bad_action_probe_on_each_env_family(env_id, tmp_path):
    """80+ bad inputs: a clear, flagged observation each, no exception, no hang, exact records."""
    from twice_envs.check import BAD_ACTIONS, probe_bad_actions
    from twice_envs.trajectory import load_trajectories, save_trajectories

    if env_id.startswith("ALFWorld"):
        pytest.importorskip("alfworld")
    assert len(BAD_ACTIONS) >= 80 and len(set(BAD_ACTIONS)) == len(BAD_ACTIONS)
    env = twice_envs.make(env_id)
    probe = probe_bad_actions(env, BAD_ACTIONS, seed=3, max_step_s=5.0)
    assert [s[0] for s in probe.steps] == list(BAD_ACTIONS)
    expects_invalid = _expects_invalid(env_id)
    missed = [a[:40] for a, _, _, invalid, _ in probe.steps if expects_invalid(a) and not invalid]
    assert missed == []
    flagged = sum(invalid for _, _, _, invalid, _ in probe.steps)
    assert flagged >= 0.85 * len(BAD_ACTIONS)
    path = tmp_path / "bad.jsonl"
    save_trajectories(path, probe.records)
    back = load_trajectories(path)
    assert [r.to_json() for r in back] == [r.to_json() for r in probe.records]
    assert sum(r.num_turns for r in back) == len(BAD_ACTIONS)
    for r in back:
        assert twice_envs.replay(r).trajectory.digests == r.digests


class RescanningParser(toy_envs.CoinChain):
    """Looks for a closing bracket after every ``click[`` (quadratic on ``"click[" * n``)."""

    def _step(self, action):
        pos = action.find("click[")
        while pos >= 0:
            i = pos + 6
            while i < len(action) and action[i] != "]":
                i += 1
            pos = action.find("click[", pos + 1)
        return super()._step(action)


def test_linear_time_check_catches_a_rescanning_parser():
    from twice_envs.check import check_linear_time

    env = twice_envs.make("CoinChain-v0")
    ratios = check_linear_time(env, shapes=["click["], sizes=(1 << 10, 1 << 14))
    assert ratios["click["] < 32
    twice_envs.register("RescanningParser-v0", RescanningParser, override=True)
    with pytest.raises(CheckFailure, match="'click\\[' repeated took .*the action parser rescans"):
        check_linear_time(twice_envs.make("RescanningParser-v0"), shapes=["click["], sizes=(1 << 10, 1 << 14))


class HangsOnSurrogates(toy_envs.CoinChain):
    def _step(self, action):
        if "\udcff" in action:
            import time

            time.sleep(0.3)
        return super()._step(action)


class SilentInvalid(toy_envs.CoinChain):
    def _step(self, action):
        obs, reward, term, info = super()._step(action)
        return ("" if info.get("invalid") else obs), reward, term, info


def test_bad_action_probe_catches_slow_and_silent_envs():
    from twice_envs.check import BAD_ACTIONS, probe_bad_actions

    twice_envs.register("HangsOnSurrogates-v0", HangsOnSurrogates, override=True)
    twice_envs.register("SilentInvalid-v0", SilentInvalid, override=True)
    probe = probe_bad_actions(twice_envs.make("CoinChain-v0"), BAD_ACTIONS, max_step_s=0.25)
    assert all(invalid for _, _, _, invalid, _ in probe.steps)
    with pytest.raises(CheckFailure, match=r"step\('\\udcff'\) \(1 characters\) took 0\.\d s \(limit 0\.25 s\)"):
        probe_bad_actions(twice_envs.make("HangsOnSurrogates-v0"), BAD_ACTIONS, max_step_s=0.25)
    with pytest.raises(CheckFailure, match=r"step\(''\) \(0 characters\) is flagged invalid but the observation is empty"):
        probe_bad_actions(twice_envs.make("SilentInvalid-v0"), BAD_ACTIONS)


def test_checker_catches_a_restore_that_shares_the_snapshots_data():
    # Every fork of this env looks right on its own; the restore aliases its snapshot.
    twice_envs.register("CoinChainAliasedRestore-v0", "tests.toy_envs:CoinChainAliasedRestore", override=True)
    with pytest.raises(CheckFailure, match=r"fork\(\d+\) of the episode with seed \d+ is wrong: .*snapshot restore"):
        twice_envs.check_env(twice_envs.make("CoinChainAliasedRestore-v0"), num_episodes=3, num_steps=8)

