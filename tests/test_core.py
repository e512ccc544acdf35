"""The TextEnv contract on the toy envs: seeding, records, forks, noise keys."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import twice_envs
from tests import toy_envs  # noqa: F401  (registers CoinChain-v0)
from twice_envs import NoiseKey, ReplayDivergence, TwiceError
from tests.test_trajectory import rechained
from twice_envs.trajectory import step_digest

ACTIONS = ["left", "right", "look", "jump", ""]


def play(env, seed, actions, options=None):
    env.reset(seed=seed, options=options)
    for a in actions:
        if env.done:
            break
        env.step(a)
    return env


@pytest.mark.parametrize("env_id", ["CoinChain-v0", "CoinChainReplay-v0"])
def test_same_seed_same_episode(env_id):
    a = play(twice_envs.make(env_id), 3, ["right"] * 6)
    b = play(twice_envs.make(env_id), 3, ["right"] * 6)
    assert a.trajectory.to_json() == b.trajectory.to_json()
    c = play(twice_envs.make(env_id), 4, ["right"] * 6)
    assert c.trajectory.digests[0] != a.trajectory.digests[0]


def test_seed_none_is_recorded_and_replayable():
    env = twice_envs.make("CoinChain-v0")
    env.reset()
    env.step("right")
    rec = env.trajectory
    assert isinstance(rec.seed, int)
    assert twice_envs.replay(rec.to_json()).trajectory.digests == rec.digests


def test_info_contract_and_digest_chain():
    env = twice_envs.make("CoinChain-v0")
    obs, info = env.reset(seed=1)
    assert info["turn"] == 0 and info["invalid"] is False
    assert info["noise_key"] == NoiseKey(env.noise_schedule.episode_seed, 0, 0, 0, 0)
    obs, r, term, trunc, info = env.step("look")
    assert info["turn"] == 1 and info["noise_key"].turn == 1
    t = env.trajectory
    assert t.digests[1] == step_digest(t.digests[0], "look", obs, r)
    assert info["digest"] == t.digests[-1]


def test_bad_actions_never_raise_and_are_flagged():
    env = twice_envs.make("CoinChain-v0")
    env.reset(seed=0)
    for bad in ["", "🙂" * 100, None, 42, "x" * 100000]:
        obs, r, term, trunc, info = env.step(bad)
        assert info["invalid"] is True and r == 0.0 and isinstance(obs, str)


def test_step_before_reset_and_after_end():
    env = twice_envs.make("CoinChain-v0")
    with pytest.raises(TwiceError, match="reset"):
        env.step("left")
    env.reset(seed=0, options={"goal": 1})
    while not env.done:
        env.step("right")
    n = env.turn
    obs, r, term, trunc, info = env.step("right")
    assert info["invalid"] and info["episode_over"] and env.turn == n


def test_turn_limit_truncates():
    env = twice_envs.make("CoinChain-v0", max_turns=3)
    env.reset(seed=0)
    out = [env.step("look") for _ in range(3)]
    assert [o[3] for o in out] == [False, False, True]
    assert env.trajectory.truncated


@pytest.mark.parametrize("env_id", ["CoinChain-v0", "CoinChainReplay-v0"])
def test_fork_bounds_are_checked(env_id):
    env = play(twice_envs.make(env_id), 0, ["look", "look"])
    with pytest.raises(ValueError, match=r"0\.\.2"):
        env.fork(3)
    with pytest.raises(ValueError, match=r"0\.\.2"):
        env.fork(-1)
    with pytest.raises(TypeError):
        env.fork("1")


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    actions=st.lists(st.sampled_from(ACTIONS), min_size=0, max_size=10),
    data=st.data(),
)
def test_fork_equals_replay_property(seed, actions, data):
    snap = play(twice_envs.make("CoinChain-v0"), seed, actions)
    rep = play(twice_envs.make("CoinChainReplay-v0"), seed, actions)
    turn = data.draw(st.integers(0, snap.turn))
    cont = data.draw(st.lists(st.sampled_from(ACTIONS), max_size=5))
    for parent in (snap, rep):
        f = parent.fork(turn)
        assert f.trajectory.digests == parent.trajectory.digests[: turn + 1]
        assert f.noise_key() == NoiseKey(parent.noise_schedule.episode_seed, turn, 0, 0, 0)
        # same continuation on the fork and on a fresh episode with the same actions -> same episode
        ref = play(twice_envs.make(parent.env_id), seed, actions[:turn] + cont)
        for a in cont:
            if f.done:
                break
            f.step(a)
        assert f.trajectory.digests == ref.trajectory.digests[: f.turn + 1]
        assert f.turn == ref.turn


def test_fork_is_independent_of_original():
    env = play(twice_envs.make("CoinChain-v0"), 5, ["look", "right"])
    before = json.dumps(env.trajectory.to_json())
    f = env.fork(1)
    for _ in range(4):
        if not f.done:
            f.step("right")
    assert json.dumps(env.trajectory.to_json()) == before
    # the original can still go on exactly as a fresh replay would
    env.step("look")
    ref = play(twice_envs.make("CoinChain-v0"), 5, ["look", "right", "look"])
    assert env.trajectory.digests == ref.trajectory.digests


def test_fork_restores_env_rng():
    """The gust is drawn from np_random: a fork must continue the same random stream."""
    env = play(twice_envs.make("CoinChain-v0", length=50), 11, ["right"] * 10, options={"goal": 49})
    assert env.turn >= 8
    for t in range(env.turn + 1):
        f = env.fork(t)
        for a in env.trajectory.actions[t:]:
            f.step(a)
        assert f.trajectory.digests == env.trajectory.digests


def test_replay_detects_tampering_and_version_change():
    env = play(twice_envs.make("CoinChain-v0"), 2, ["right", "look", "right"])
    rec = env.trajectory.to_json()
    tampered = json.loads(json.dumps(rec))
    tampered["observations"][2] = "You are at 99."
    with pytest.raises(ReplayDivergence, match="turn 2"):
        twice_envs.replay(tampered)
    # a consistent chain that the env does not reproduce: the digests were recomputed
    from twice_envs.trajectory import Trajectory, step_digest

    forged = Trajectory.from_json(json.loads(json.dumps(rec)))
    forged.observations[1] = "You are at 99."
    for t in range(1, len(forged.digests)):
        forged.digests[t] = step_digest(forged.digests[t - 1], forged.actions[t - 1], forged.observations[t], forged.rewards[t - 1])
    with pytest.raises(ReplayDivergence) as exc:
        twice_envs.replay(forged)
    assert exc.value.turn == 1
    old = json.loads(json.dumps(rec))
    old["env_version"] = "0"
    with pytest.raises(ReplayDivergence, match="digest chain is broken at turn 0"):
        twice_envs.replay(old)  # an edited version: the record's own digests[0] covers it
    old["digests"] = rechained(old)  # a record made by version 0 of the env
    with pytest.raises(TwiceError, match="version 0"):
        twice_envs.replay(old)


def test_nondeterministic_env_is_caught_by_fork():
    import random

    class Flaky(toy_envs.CoinChainReplayOnly):
        def _step(self, action):
            obs, r, term, info = super()._step(action)
            return obs + f" ({random.random():.6f})", r, term, info

    twice_envs.register("Flaky-v0", Flaky, override=True)
    env = play(twice_envs.make("Flaky-v0"), 0, ["look", "look"])
    with pytest.raises(ReplayDivergence, match="turn 1"):
        env.fork(2)


def test_noise_schedule_and_twin_keys():
    from twice_envs.wrappers import twin

    env = play(twice_envs.make("CoinChain-v0", length=40), 9, ["look"] * 5)
    seed = env.noise_schedule.episode_seed
    tw = twin(env.fork(2), "right", env.noise_schedule, branch=3)
    assert tw.alternative_key == NoiseKey(seed, 2, 3, 0, 0)
    assert tw.noise_key() == NoiseKey(seed, 3, 0, 0, 0)
    tw.step("look")
    assert tw.noise_key() == NoiseKey(seed, 4, 0, 0, 0)
    # the original's schedule is untouched
    assert env.noise_schedule.branches == {}
    ind = twin(env.fork(2), "right", 12345)
    assert ind.noise_key() == NoiseKey(12345, 3, 0, 0, 0)


def test_noise_seed_option_and_derivation_are_stable():
    env = twice_envs.make("CoinChain-v0")
    _, info = env.reset(seed=7)
    # pinned: the derivation must not change between releases or platforms
    assert info["noise_key"].episode_seed == twice_envs.derive_episode_seed(7)
    assert twice_envs.derive_episode_seed(7) != twice_envs.derive_episode_seed(8)
    _, info = env.reset(seed=7, options={"noise_seed": 2**64 - 1})
    assert info["noise_key"].episode_seed == 2**64 - 1


def test_reset_rejects_bad_seed_and_options():
    env = twice_envs.make("CoinChain-v0")
    with pytest.raises(ValueError):
        env.reset(seed=-1)
    with pytest.raises(ValueError, match="JSON"):
        env.reset(seed=0, options={"x": object()})


def test_render_ansi():
    env = twice_envs.make("CoinChain-v0", render_mode="ansi")
    obs, _ = env.reset(seed=0)
    assert env.render() == obs


# ---------------------------------------------------------------- resets that fail
BAD_RESETS = [
    ({"seed": 5, "options": {"noise_seed": -1}}, "noise_seed"),
    ({"seed": 5, "options": {"noise_seed": 1.5}}, "noise_seed"),
    ({"seed": 5, "options": {"noise_seed": 2**64}}, "noise_seed"),
    ({"seed": 5, "options": {"noise_seed": "7"}}, "noise_seed"),
    ({"seed": 5, "options": {"bogus": 1}}, "unknown CoinChain(Replay)? reset options \\['bogus'\\]"),
    ({"seed": 5, "options": "notadict"}, "reset options must be a dict"),
    ({"seed": 5, "options": {"goal": 1, 3: 4}}, "option names must be strings"),
    ({"seed": 2**64}, "seed must be an int in 0..2\\*\\*64-1"),
    ({"seed": 1.5}, "seed must be an int"),
    ({"seed": True}, "seed must be an int"),
]


@pytest.mark.parametrize("kwargs, match", BAD_RESETS)
@pytest.mark.parametrize("env_id", ["CoinChain-v0", "CoinChainReplay-v0"])
def test_rejected_reset_changes_nothing(env_id, kwargs, match):
    env = play(twice_envs.make(env_id), 0, ["right", "look"])
    ref = play(twice_envs.make(env_id), 0, ["right", "look"])
    before = env.trajectory.to_json()
    with pytest.raises(ValueError, match=match):
        env.reset(**kwargs)
    assert env.trajectory.to_json() == before
    # The old episode goes on exactly as an undisturbed env's does.
    for a in ["left", "look", "right", "look"]:
        if ref.done:
            break
        assert env.step(a)[:4] == ref.step(a)[:4]
    assert env.trajectory.to_json() == ref.trajectory.to_json()


def test_reset_that_raises_in__reset_refuses_to_step_until_a_good_reset():
    env = play(twice_envs.make("CoinChain-v0"), 0, ["right"])
    with pytest.raises(ValueError):
        env.reset(seed=5, options={"goal": "not a number"})  # int("...") raises inside _reset
    with pytest.raises(TwiceError, match=r"the last reset\(seed=5.*raised ValueError.*step\(\) is refused"):
        env.step("look")
    env.reset(seed=5)
    obs, *_ = env.step("look")
    assert "You are at 0" in obs and env.turn == 1


def test_seeds_do_not_alias_and_bad_seed_types_are_refused():
    # A uint64 seed maps to its own noise seed; nothing is folded into 64 bits.
    seeds = {twice_envs.derive_episode_seed(s) for s in (0, 1, 2**63, 2**64 - 1)}
    assert len(seeds) == 4
    for bad in (2**64, 2**70, -1, 1.5, "3"):
        with pytest.raises(ValueError, match="0..2\\*\\*64-1"):
            twice_envs.derive_episode_seed(bad)
    env = twice_envs.make("CoinChain-v0")
    with pytest.raises(ValueError, match="seed must be an int in 0..2\\*\\*64-1, got 1180591620717411303424"):
        env.reset(seed=2**70)
    _, info = env.reset(seed=np.uint64(2**64 - 1))
    assert env.trajectory.seed == 2**64 - 1 and info["noise_key"].episode_seed == twice_envs.derive_episode_seed(2**64 - 1)


# ---------------------------------------------------------------- unseeded resets
@pytest.mark.parametrize("env_id", ["CoinChain-v0", "CoinChainReplay-v0"])
def test_unseeded_reset_continues_the_envs_own_generator(env_id):
    runs = []
    for _ in range(2):
        env = twice_envs.make(env_id)
        env.reset(seed=123)
        env.step("right")
        seeds = []
        for _ in range(3):
            env.reset()
            seeds.append(env.trajectory.seed)
            env.step("look")
        runs.append((seeds, env.trajectory.to_json()))
    assert runs[0] == runs[1]
    assert len(set(runs[0][0])) == 3 and 123 not in runs[0][0]
    # the recorded seed replays the episode
    rec = twice_envs.Trajectory.from_json(runs[0][1])
    assert twice_envs.replay(rec).trajectory.digests == rec.digests
    # only a never-seeded env reads entropy
    fresh = {twice_envs.make(env_id).reset()[1]["noise_key"].episode_seed for _ in range(3)}
    assert len(fresh) == 3


# ---------------------------------------------------------------- steps that raise
class FailsMidStepReplayOnly(toy_envs.CoinChainReplayOnly):
    """CoinChain whose ``boom`` action changes the state and draws from np_random, then raises."""

    def _step(self, action):
        if action == "boom":
            self.pos = self.length - 1
            self.np_random.random()
            raise RuntimeError("the tool failed")
        return super()._step(action)


class FailsMidStep(FailsMidStepReplayOnly):
    """The same with snapshots (forks and roll-back by restore)."""

    _snapshot = toy_envs.CoinChain._snapshot
    _restore = toy_envs.CoinChain._restore


def test_step_that_raises_rolls_back_a_snapshot_env_exactly():
    twice_envs.register("FailsMidStep-v0", "tests.test_core:FailsMidStep", override=True)
    env = play(twice_envs.make("FailsMidStep-v0"), 4, ["right", "look"])
    ref = play(twice_envs.make("FailsMidStep-v0"), 4, ["right", "look"])
    before = (env.trajectory.to_json(), env._snapshot(), env.np_random.bit_generator.state, env.last_info)
    with pytest.raises(RuntimeError, match="the tool failed"):
        env.step("boom")
    assert (env.trajectory.to_json(), env._snapshot(), env.np_random.bit_generator.state, env.last_info) == before
    for a in ["left", "left", "look", "right"]:
        if ref.done:
            break
        assert env.step(a)[:4] == ref.step(a)[:4]
    assert env.trajectory.to_json() == ref.trajectory.to_json()
    assert twice_envs.replay(env.trajectory).trajectory.digests == env.trajectory.digests


def test_step_that_raises_without_snapshots_refuses_to_step_until_reset():
    twice_envs.register("FailsMidStepReplayOnly-v0", "tests.test_core:FailsMidStepReplayOnly", override=True)
    env = play(twice_envs.make("FailsMidStepReplayOnly-v0"), 4, ["right"])
    before = env.trajectory.to_json()
    with pytest.raises(RuntimeError):
        env.step("boom")
    assert env.trajectory.to_json() == before
    with pytest.raises(TwiceError, match="step\\(\\) raised RuntimeError: the tool failed.*refused until a reset"):
        env.step("look")
    # the record is intact: a fork (by replay) is the episode before the failed step
    assert env.fork(1).trajectory.digests == before["digests"]
    env.reset(seed=4)
    assert env.step("look")[0].startswith("You are at 0")


# ---------------------------------------------------------------- verified snapshot forks
def test_fork_verifies_the_restored_state():
    twice_envs.register("CoinChainAliasedRestore-v0", "tests.toy_envs:CoinChainAliasedRestore", override=True)
    env = play(twice_envs.make("CoinChainAliasedRestore-v0"), 2, ["left", "left", "look"])
    first = env.fork(1)
    first.step("left")  # appends to the list the parent's snapshot of turn 1 holds
    with pytest.raises(ReplayDivergence, match="turn 1.*snapshot restore"):
        env.fork(1)
    # a correct env forks the same turn any number of times
    ok = play(twice_envs.make("CoinChain-v0"), 2, ["left", "left", "look"])
    ok.fork(1).step("left")
    assert ok.fork(1).trajectory.digests == ok.trajectory.digests[:2]


def test_replay_checks_the_end_flags_and_the_noise_seed_of_toy_records():
    import pickle

    from twice_envs.errors import TrajectoryFormatError

    for env_id in ("CoinChain-v0", "CoinChainReplay-v0"):
        env = play(twice_envs.make(env_id, length=40, max_turns=3), 4, ["look", "look", "look"])
        assert env.trajectory.truncated and twice_envs.first_divergence(env.trajectory) is None
        rec = env.trajectory.to_json()
        rec["truncated"] = False
        div = twice_envs.first_divergence(rec)
        assert div.field == "truncated" and div.turn == 3 and div.expected == div.got
        assert "the digests agree, but the record says truncated=False; the replay ended truncated=True" in str(div)
        again = pickle.loads(pickle.dumps(div))
        assert (again.turn, again.field, str(again)) == (div.turn, div.field, str(div))
        rec = env.trajectory.to_json()
        rec["noise"]["episode_seed"] ^= 1
        div = twice_envs.first_divergence(rec)
        assert div.field == "noise.episode_seed" and div.turn == 0
        del rec["noise"]["episode_seed"]
        with pytest.raises(TrajectoryFormatError, match="missing field 'noise.episode_seed'"):
            twice_envs.replay(rec)
