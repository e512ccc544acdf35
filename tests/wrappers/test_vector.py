"""make_vec: tuple-of-string batches, seed streams, autoreset, per-sub-env records and forks, clean shutdown."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import gymnasium
import numpy as np
import pytest
from gymnasium.error import ClosedEnvironmentError
from gymnasium.utils.env_checker import check_env as gym_check_env

import twice_envs
from tests.wrappers.real_envs import REAL_ENVS, pick_action, require_env
from twice_envs import TextEnv, TwiceError
from twice_envs.wrappers.vector import (
    SeededSubEnv,
    TextAsyncVectorEnv,
    TextSyncVectorEnv,
)

MODES = ("sync", "async")


def _run(vec, steps: int, seed: int = 0):
    """Step with scripted actions; return everything observed (obs, rewards, flags, digests)."""
    rng = random.Random(seed)
    obs, infos = vec.reset()
    log = [(obs, tuple(infos["digest"]))]
    for _ in range(steps):
        actions = tuple(
            pick_action({"admissible_actions": infos["admissible_actions"][i]} if "admissible_actions" in infos else {}, rng)
            for i in range(vec.num_envs)
        )
        obs, rew, term, trunc, infos = vec.step(actions)
        log.append((obs, tuple(rew.tolist()), tuple(term.tolist()), tuple(trunc.tolist()), tuple(infos["digest"])))
    return log


def _walk_sub_env_0_to_coin(vec, infos):
    """Walk sub-env 0 to the coin at 1 (a gust may push it past) while sub-env 1 only looks."""
    for _ in range(12):
        action = "right" if infos["position"][0] < 1 else "left"
        obs, rew, term, trunc, infos = vec.step((action, "look"))
        if term[0] or trunc[0]:
            break
    assert term[0] or trunc[0]
    return term, infos


def _assert_workers_exit(vec: TextAsyncVectorEnv, within: float = 10.0) -> None:
    for p in vec.processes:
        p.join(within)
        assert not p.is_alive(), f"worker {p.pid} still running after close()"


@pytest.mark.parametrize("mode", MODES)
def test_spaces_and_tuple_of_string_observations(mode):
    vec = twice_envs.make_vec("CoinChain-v0", 3, mode, seeds=0)
    try:
        assert isinstance(vec, TextSyncVectorEnv if mode == "sync" else TextAsyncVectorEnv)
        assert isinstance(vec, gymnasium.vector.VectorEnv)
        assert isinstance(vec.observation_space, gymnasium.spaces.Tuple) and len(vec.observation_space) == 3
        obs, infos = vec.reset()
        assert isinstance(obs, tuple) and len(obs) == 3 and all(isinstance(o, str) for o in obs)
        assert obs in vec.observation_space
        obs, rew, term, trunc, infos = vec.step(("right", "look", "bogus"))
        assert isinstance(obs, tuple) and all(isinstance(o, str) for o in obs)
        assert rew.shape == (3,) and term.dtype == np.bool_ and trunc.dtype == np.bool_
        assert infos["invalid"].tolist() == [False, False, True]
        assert infos["turn"].tolist() == [1, 1, 1]
        assert vec.protocol().stop == ("\n",)
    finally:
        vec.close()


@pytest.mark.parametrize("env_id", ["CoinChain-v0", "CoinChainReplay-v0"])
def test_sync_and_async_give_identical_transcripts(env_id):
    logs = []
    for mode in MODES:
        vec = twice_envs.make_vec(env_id, 3, mode, seeds=[5, 5, 11])
        try:
            logs.append(_run(vec, 30))
            records = vec.trajectories()
        finally:
            vec.close()
        # sub-envs 0 and 1 start on the same seed (identical reset digests); every later
        # episode of a stream is num_envs seeds further on.
        assert logs[-1][0][1][0] == logs[-1][0][1][1] != logs[-1][0][1][2]
        assert [(r.seed - s) % 3 for r, s in zip(records, (5, 5, 11))] == [0, 0, 0]
    assert logs[0] == logs[1]


@pytest.mark.parametrize("mode", MODES)
def test_seed_streams_and_reset_seed(mode):
    vec = twice_envs.make_vec("CoinChain-v0", 2, mode, seeds=[7, 7])
    try:
        vec.reset()
        assert [t.seed for t in vec.trajectories()] == [7, 7]
        vec.reset()  # the next episode of each stream: seed + num_envs
        assert [t.seed for t in vec.trajectories()] == [9, 9]
        vec.reset(seed=100)  # gymnasium convention: seed + i, and the streams restart there
        assert [t.seed for t in vec.trajectories()] == [100, 101]
        vec.reset(seed=[3, 40])
        vec.reset()
        assert [t.seed for t in vec.trajectories()] == [5, 42]
        with pytest.raises(ValueError, match="3 entries but there are 2 sub-envs"):
            vec.reset(seed=[1, 2, 3])
        with pytest.raises(ValueError, match=r"must be an int in 0\.\.2\*\*64-1, got -1"):
            vec.reset(seed=-1)
    finally:
        vec.close()


def test_same_seed_same_task_across_modes_and_options():
    sync = twice_envs.make_vec("CoinChain-v0", 2, "sync", seeds=3, options=[{"goal": 2}, {"goal": 4}])
    try:
        sync.reset()
        for _ in range(12):
            sync.step(("right", "right"))
        recs = sync.trajectories()
        assert [r.options for r in recs] == [{"goal": 2}, {"goal": 4}]
    finally:
        sync.close()


@pytest.mark.parametrize("mode", MODES)
def test_next_step_autoreset_keeps_finished_episode_reachable(mode):
    vec = twice_envs.make_vec("CoinChain-v0", 2, mode, seeds=[1, 2], options={"goal": 1})
    try:
        obs, infos = vec.reset()
        term, infos = _walk_sub_env_0_to_coin(vec, infos)
        finished = infos["trajectory"][0]
        assert infos["_trajectory"].tolist() == [True, False]
        assert finished.digest == vec.trajectory(0).digest
        assert finished.terminated == bool(term[0])
        # the finished episode can still be forked before the next step resets it
        branch = vec.fork(0, finished.num_turns - 1)
        assert branch.trajectory.digest == finished.digests[-2]
        obs, rew, term, trunc, infos = vec.step(("look", "look"))
        assert rew[0] == 0.0 and not term[0] and infos["turn"][0] == 0
        assert vec.trajectory(0).seed == 1 + 2  # the next seed of sub-env 0's stream
        assert obs[0] == vec.trajectory(0).observations[0]
    finally:
        vec.close()


@pytest.mark.parametrize("mode", MODES)
def test_same_step_autoreset_reports_final_record(mode):
    vec = twice_envs.make_vec("CoinChain-v0", 1, mode, seeds=4, options={"goal": 1}, autoreset_mode="same_step")
    try:
        vec.reset()
        for _ in range(12):
            obs, rew, term, trunc, infos = vec.step(("right",))
            if term[0] or trunc[0]:
                break
        assert term[0] or trunc[0]
        final = infos["final_info"]["trajectory"][0]
        assert final.seed == 4 and (final.terminated or final.truncated)
        assert infos["final_obs"][0] == final.observations[-1]
        assert vec.trajectory(0).seed == 5 and vec.trajectory(0).num_turns == 0
        assert obs[0] == vec.trajectory(0).observations[0]
    finally:
        vec.close()


@pytest.mark.parametrize("env_id", ["CoinChain-v0", "CoinChainReplay-v0"])
@pytest.mark.parametrize("mode", MODES)
def test_fork_per_sub_env_equals_replay_and_is_independent(env_id, mode):
    vec = twice_envs.make_vec(env_id, 2, mode, seeds=[10, 20], autoreset_mode="disabled")
    try:
        vec.reset()
        for a in (("left", "right"), ("look", "look"), ("right", "left")):
            vec.step(a)
        record = vec.trajectory(1)
        for turn in range(record.num_turns + 1):
            branch = vec.fork(1, turn)
            assert isinstance(branch, TextEnv) and branch.turn == turn
            assert branch.trajectory.digest == record.digests[turn]
            assert branch.noise_schedule.to_json() == record.noise
            assert twice_envs.replay(vec.fork_record(1, turn)).trajectory.digest == record.digests[turn]
        branch = vec.fork(1, 1)
        branch.step("right")
        branch.step("right")
        assert vec.trajectory(1).digest == record.digest  # the sub-env did not move
        vec.step(("look", "look"))
        assert vec.trajectory(1).digests[:4] == record.digests
        with pytest.raises(ValueError, match="outside this episode"):
            vec.fork(0, 99)
        with pytest.raises(IndexError, match="out of range"):
            vec.fork(2, 0)
    finally:
        vec.close()


def test_sync_call_reaches_sub_env_fork():
    vec = twice_envs.make_vec("CoinChain-v0", 2, "sync", seeds=0)
    try:
        vec.reset()
        vec.step(("right", "left"))
        forks = vec.call("fork", 1)
        assert [f.trajectory.digest for f in forks] == [t.digests[1] for t in vec.trajectories()]
        assert isinstance(vec.envs[0], SeededSubEnv)
    finally:
        vec.close()


def test_trajectory_before_reset_is_a_clear_error_and_worker_survives():
    vec = twice_envs.make_vec("CoinChain-v0", 2, "async")
    try:
        with pytest.raises(TwiceError, match="no episode yet"):
            vec.trajectory(0)
        assert all(p.is_alive() for p in vec.processes)
        vec.reset(seed=0)
        assert vec.trajectory(0).seed == 0
    finally:
        vec.close()
    _assert_workers_exit(vec)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="2 entries but there are 3 sub-envs"):
        twice_envs.make_vec("CoinChain-v0", 3, seeds=[1, 2])
    with pytest.raises(ValueError, match="2 entries but there are 3 sub-envs"):
        twice_envs.make_vec("CoinChain-v0", 3, "async", seeds=[1, 2])
    with pytest.raises(ValueError, match=r"seeds\[1\] must be an int in 0\.\.2\*\*64-1, got -2"):
        twice_envs.make_vec("CoinChain-v0", 2, seeds=[1, -2])
    with pytest.raises(ValueError, match="vectorization_mode"):
        twice_envs.make_vec("CoinChain-v0", 2, "threads")
    with pytest.raises(ValueError, match="num_envs"):
        twice_envs.make_vec("CoinChain-v0", 0)
    with pytest.raises(ValueError, match="autoreset_mode"):
        twice_envs.make_vec("CoinChain-v0", 2, autoreset_mode="sometimes")
    with pytest.raises(ValueError, match="one per sub-env"):
        twice_envs.make_vec("CoinChain-v0", 2, options=[{}])
    with pytest.raises(TwiceError, match="Did you mean 'CoinChain-v0'"):
        twice_envs.make_vec("CoinChian-v0", 2, "async")
    with pytest.raises(TwiceError, match="unknown kwargs"):
        twice_envs.make_vec("CoinChain-v0", 2, "async", lenght=3)


@pytest.mark.parametrize("mode", MODES)
def test_close_twice_is_a_no_op_and_use_after_close_raises(mode):
    vec = twice_envs.make_vec("CoinChain-v0", 2, mode, seeds=0)
    vec.reset()
    vec.close()
    vec.close()
    assert vec.closed
    if mode == "async":
        _assert_workers_exit(vec)
    with pytest.raises(ClosedEnvironmentError, match="closed"):
        vec.step(("left", "left"))
    with pytest.raises(ClosedEnvironmentError, match="closed"):
        vec.reset()
    with pytest.raises(ClosedEnvironmentError, match="closed"):
        vec.trajectory(0)


def _close_in_thread(vec, within: float) -> None:
    t = threading.Thread(target=vec.close, daemon=True)
    t.start()
    t.join(within)
    assert not t.is_alive(), "close() hung"


def test_close_after_a_worker_died_does_not_hang():
    vec = twice_envs.make_vec("CoinChain-v0", 2, "async", seeds=0, close_timeout=3)
    vec.reset()
    victim = vec.processes[0]
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(5)
    _close_in_thread(vec, 20)
    _assert_workers_exit(vec)


class _Sleepy(TextEnv):
    """Hangs on the action 'hang' (a stuck tool); otherwise a one-line echo."""

    def protocol(self):
        return twice_envs.Protocol("Say anything.")

    def _reset(self, options):
        return "ready", {}

    def _step(self, action):
        if action == "hang":
            time.sleep(120)
        return f"echo {action}", 0.0, False, {}


twice_envs.register("SleepyEcho-v0", _Sleepy, description="test env that hangs", override=True)


def test_close_with_a_stuck_worker_terminates_it():
    vec = twice_envs.make_vec("SleepyEcho-v0", 2, "async", seeds=0, close_timeout=1)
    vec.reset()
    vec.step_async(("hang", "ok"))
    _close_in_thread(vec, 15)
    _assert_workers_exit(vec, within=1)


@pytest.mark.filterwarnings("ignore:.*different from the unwrapped version")
@pytest.mark.parametrize("env_id", ["CoinChain-v0", "CoinChainReplay-v0"])
def test_gymnasium_checker_accepts_the_sub_env(env_id):
    vec = twice_envs.make_vec(env_id, 1, "sync", seeds=0)
    try:
        gym_check_env(vec.envs[0], skip_render_check=True)
    finally:
        vec.close()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*different from the unwrapped version")
@pytest.mark.parametrize("env_id", list(REAL_ENVS))
def test_real_envs_sync_equals_async_and_fork(env_id):
    require_env(env_id)
    check = twice_envs.make_vec(env_id, 1, seeds=0)
    try:
        gym_check_env(check.envs[0], skip_render_check=True)
    finally:
        check.close()
    logs, records = [], []
    for mode in MODES:
        vec = twice_envs.make_vec(env_id, 2, mode, seeds=[3, 3], autoreset_mode="disabled")
        try:
            logs.append(_run(vec, 3, seed=1))
            records.append(vec.trajectories())
            branch = vec.fork(1, 2)
            assert branch.trajectory.digest == records[-1][1].digests[2]
            branch.close()
        finally:
            vec.close()
        assert logs[-1][0][0][0] == logs[-1][0][0][1]  # same seed, same task
    assert logs[0] == logs[1]
    assert [r.digest for r in records[0]] == [r.digest for r in records[1]]


@pytest.mark.parametrize("mode", MODES)
def test_disabled_autoreset_finished_sub_env_answers_episode_over(mode):
    vec = twice_envs.make_vec("CoinChain-v0", 2, mode, seeds=0, options={"goal": 1}, autoreset_mode="disabled")
    try:
        obs, infos = vec.reset()
        term, infos = _walk_sub_env_0_to_coin(vec, infos)
        digest = vec.trajectory(0).digest
        obs, rew, term2, trunc2, infos = vec.step(("look", "look"))
        assert "episode is over" in obs[0] and infos["invalid"][0] and rew[0] == 0.0
        assert vec.trajectory(0).digest == digest  # nothing was recorded
        obs, infos = vec.reset(options={"reset_mask": np.array([True, False])})
        assert vec.trajectory(0).num_turns == 0 and vec.trajectory(1).num_turns > 0
    finally:
        vec.close()


def test_vec_bench_runs(capsys):
    from twice_envs.wrappers.vector_bench import main

    assert main(["--quick", "--envs", "Echo", "--steps", "20"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("Echo"))
    assert row.split()[1] == "20" and row.split()[4].endswith("x")


@pytest.mark.parametrize("mode", MODES)
def test_distinct_noise_for_a_group_of_one_task(mode):
    vec = twice_envs.make_vec("CoinChain-v0", 3, mode, seeds=[7, 7, 7], distinct_noise=True)
    try:
        obs, infos = vec.reset()
        keys = list(infos["noise_key"])
        assert len(set(obs)) == 1 and len({k.episode_seed for k in keys}) == 3
        plain = twice_envs.make("CoinChain-v0")
        plain.reset(seed=7)
        assert vec.trajectory(0).digests == plain.trajectory.digests  # sub-env 0 is the plain episode
        assert vec.trajectory(1).options["noise_seed"] == twice_envs.derive_episode_seed(7, 1)
        vec.reset()  # the next episode (seed 10) gets fresh noise seeds too
        assert vec.trajectory(2).options["noise_seed"] == twice_envs.derive_episode_seed(10, 2)
    finally:
        vec.close()
    same = twice_envs.make_vec("CoinChain-v0", 2, mode, seeds=[7, 7])
    try:
        _, infos = same.reset()
        assert infos["noise_key"][0] == infos["noise_key"][1]
    finally:
        same.close()


def test_a_script_without_the_main_guard_is_told_why_its_spawned_workers_died(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "vec_script.py"
    script.write_text('import twice_envs\n\nvec = twice_envs.make_vec("CreditToy-v0", 2, vectorization_mode="async", '
                      'context="spawn")\nvec.close()\n')
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0
    assert last.startswith("twice_envs.errors.TwiceError: the async vector env of CreditToy-v0")
    assert f'{script} has no `if __name__ == "__main__":` guard' in last and "'spawn' imports the main script" in last
