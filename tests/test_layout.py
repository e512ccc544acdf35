"""check_layout: every registered id plays the same episodes in one process, fork and spawn
pools, threads and asyncio, with the same noise draws; a difference names env, layout and episode."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

import numpy as np
import pytest

import twice_envs
from tests.toy_envs import CoinChain
from twice_envs import layout_workers
from twice_envs._deps import available
from twice_envs.layout import LAYOUTS, LayoutMismatch, NoiseProbe, _fill, close_pools, drawn_action

ALL_IDS = sorted(twice_envs.registry)
NEEDS = {"ALFWorld": "alfworld", "SearchQA-Dense": "faiss"}
_PARENT_PID = os.getpid()


@pytest.fixture(scope="module", autouse=True)
def _end_pools():
    yield
    close_pools()


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_every_registered_id_is_the_same_in_every_layout(env_id):
    for prefix, module in NEEDS.items():
        if env_id.startswith(prefix) and not available(module):
            pytest.skip(f"{env_id} needs {module}")
    report = twice_envs.check_layout(env_id, noise=True)
    assert set(report.layouts) | set(report.skipped) == set(LAYOUTS), report
    assert report.turns > 0 and report.noise_keys == report.turns * NoiseProbe().keys_per_turn
    assert "identical in" in str(report)


@pytest.mark.parametrize("env_id", ["SearchQA-v0", "WebShop-v0"])
def test_searchqa_and_webshop_with_four_threads(env_id):
    """One env per thread, longer episodes (SearchQA: mostly searches, so the retriever runs in every thread)."""
    report = twice_envs.check_layout(
        env_id,
        layouts=("thread", "asyncio"),
        workers=4,
        episodes=16,
        num_steps=8,
        extra_actions=["<search> query </search>"] * 3 if env_id.startswith("SearchQA") else (),
    )
    assert report.layouts == ["serial", "thread", "asyncio"] and report.turns >= 16 * 3


# --------------------------------------------------------------------------- envs that break a layout


class DiffersInThreads(CoinChain):
    """Observations change from the second action on when the env runs off the main thread."""

    def _step(self, action):
        obs, reward, done, info = super()._step(action)
        if self.turn >= 1 and threading.current_thread() is not threading.main_thread():
            obs += " (worker thread)"
        return obs, reward, done, info


class DiffersInForks(CoinChain):
    """The reset observation says whether the env runs in the process that imported this module."""

    def _reset(self, options):
        obs, info = super()._reset(options)
        return obs + (" (child)" if os.getpid() != _PARENT_PID else ""), info


class RaisesInThreads(CoinChain):
    def _step(self, action):
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("boom off the main thread")
        return super()._step(action)


class SlowInThreads(CoinChain):
    def _step(self, action):
        if threading.current_thread() is not threading.main_thread():
            time.sleep(2.0)
        return super()._step(action)


def _look(env, info, rng):
    return "look"


@pytest.fixture(scope="module")
def broken_ids():
    ids = {}
    for cls in (DiffersInThreads, DiffersInForks, RaisesInThreads, SlowInThreads):
        env_id = f"Layout{cls.__name__}-v0"
        twice_envs.register(env_id, f"tests.test_layout:{cls.__name__}", override=True)
        ids[cls.__name__] = env_id
    yield ids
    for env_id in ids.values():
        twice_envs.registry.pop(env_id, None)


def test_a_thread_difference_names_env_layout_episode_and_turn(broken_ids):
    env_id = broken_ids["DiffersInThreads"]
    with pytest.raises(LayoutMismatch) as err:
        twice_envs.check_layout(env_id, layouts=("serial", "fork", "thread"), policy=_look, options={"goal": 5})
    e = err.value
    assert (e.env_id, e.layout, e.episode, e.seed, e.turn) == (env_id, "thread", 0, 0, 2)
    msg = str(e)
    for part in (env_id, "'thread'", "episode 0 (seed 0", "turn 2", "(worker thread)", "action 'look'"):
        assert part in msg, (part, msg)
    # asyncio runs every env call on executor threads: the same difference
    with pytest.raises(LayoutMismatch, match="layout 'asyncio'"):
        twice_envs.check_layout(env_id, layouts=("asyncio",), policy=_look, options={"goal": 5})


def test_a_fork_difference_is_found_at_the_reset(broken_ids):
    env_id = broken_ids["DiffersInForks"]
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    with pytest.raises(LayoutMismatch) as err:
        twice_envs.check_layout(env_id, layouts=("fork",), episodes=3)
    assert (err.value.layout, err.value.episode, err.value.turn) == ("fork", 0, 0)
    assert "(child)" in str(err.value) and "the reset" in str(err.value)
    # threads share this process: no difference there
    twice_envs.check_layout(env_id, layouts=("thread", "asyncio"), episodes=3)


def test_an_exception_in_a_worker_is_reported_with_its_episode(broken_ids):
    env_id = broken_ids["RaisesInThreads"]
    with pytest.raises(LayoutMismatch) as err:
        twice_envs.check_layout(env_id, layouts=("thread",), policy=_look)
    assert err.value.layout == "thread" and err.value.episode == 0
    assert "raised in episode 0" in str(err.value) and "RuntimeError: boom off the main thread" in str(err.value)


def test_a_layout_that_hangs_is_reported_after_the_timeout(broken_ids):
    start = time.monotonic()
    with pytest.raises(LayoutMismatch, match=r"layout 'thread' \(2 workers\) did not finish within 0.5 s"):
        twice_envs.check_layout(
            broken_ids["SlowInThreads"], layouts=("thread",), policy=_look, num_steps=1, timeout_s=0.5
        )
    assert time.monotonic() - start < 1.8


def test_different_noise_draws_are_found(monkeypatch):
    original = layout_workers.philox_words_np

    def skewed(rows, vocab_size, token_ids=None):
        words = original(rows, vocab_size, token_ids)
        return words if threading.current_thread() is threading.main_thread() else words ^ np.uint32(1)

    monkeypatch.setattr(layout_workers, "philox_words_np", skewed)
    with pytest.raises(LayoutMismatch, match="drew different keyed noise in episode 0") as err:
        twice_envs.check_layout("CreditToy-v0", layouts=("thread",), noise=NoiseProbe(branches=1, lines=1, positions=2))
    assert err.value.turn == 0
    # without noise=True the records alone agree
    twice_envs.check_layout("CreditToy-v0", layouts=("thread",))


def test_a_spawned_worker_registers_an_id_registered_at_run_time():
    env_id = "LayoutCoinChain-v0"
    twice_envs.register(env_id, "tests.toy_envs:CoinChain", kwargs={"length": 5}, override=True)
    try:
        report = twice_envs.check_layout(env_id, layouts=("spawn",), episodes=2, noise=True)
    finally:
        twice_envs.registry.pop(env_id, None)
    assert report.layouts == ["serial", "spawn"]


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="unknown layouts"):
        twice_envs.check_layout("CreditToy-v0", layouts=("greenthreads",))
    with pytest.raises(ValueError, match="workers"):
        twice_envs.check_layout("CreditToy-v0", workers=0)
    with pytest.raises(ValueError, match="2 entries for 3 episodes"):
        twice_envs.check_layout("CreditToy-v0", episodes=3, options=[{}, {}])


# --------------------------------------------------------------------------- the default actions


def test_placeholders_are_filled_with_words():
    assert _fill("<search> query </search>", "red fox") == "<search> red fox </search>"
    assert _fill("<answer> answer </answer>", "x") == "<answer> x </answer>"
    assert _fill("<action>COMMAND</action>", "go to fridge 1") == "<action> go to fridge 1 </action>"
    assert _fill("search[<query>]", "red shirt") == "search[red shirt]"
    assert _fill("click[buy now]", "x") == "click[buy now]"
    assert _fill("go to fridge 1", "x") == "go to fridge 1"


def test_drawn_actions_are_deterministic_and_use_the_protocol():
    env = twice_envs.make("SearchQA-v0")

    def actions():
        _, info = env.reset(seed=3)
        rng = np.random.default_rng(7)
        return [drawn_action(env, info, rng) for _ in range(40)]

    first = actions()
    assert first == actions()
    filled = [a for a in first if a.startswith(("<search> ", "<answer> ")) and a.endswith(("</search>", "</answer>"))]
    assert len(filled) >= 30 and all(len(a.split()) >= 3 for a in filled)
    # the words come from the end of the observation (the question)
    question = env.trajectory.observations[0][-600:].lower()
    assert all(w in question for a in filled for w in a.split()[1:-1])


# --------------------------------------------------------------------------- a script without the __main__ guard


SCRIPT = """import twice_envs

def main():
    twice_envs.check_layout("CreditToy-v0", layouts=("spawn",), workers=1, episodes=1, num_steps=1, timeout_s=60)
    print("same in every layout")

{tail}
"""


@pytest.mark.parametrize("guarded", [False, True])
def test_a_script_without_the_main_guard_is_told_why_its_spawned_worker_died(tmp_path, guarded):
    import subprocess
    import sys

    script = tmp_path / "layout_script.py"
    script.write_text(SCRIPT.format(tail='if __name__ == "__main__":\n    main()' if guarded else "main()"))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    if guarded:
        assert done.returncode == 0 and "same in every layout" in done.stdout, done.stderr[-2000:]
        return
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0 and last.startswith("twice_envs.layout.LayoutMismatch: check_layout(CreditToy-v0)")
    assert f'{script} has no `if __name__ == "__main__":` guard' in last and "'spawn' imports the main script" in last
