"""A tool that raises inside step() leaves the env as it was (or refuses to step until reset)."""

from __future__ import annotations

import dataclasses

import pytest

import twice_envs
from tests.wrappers.real_envs import require_env
from twice_envs import TwiceError
from twice_envs.tools import Journal, Tool

SEARCH = "<search> capital of Velora </search>"


class Failing(Tool):
    """A search tool (or index) that fails like an unreachable service."""

    name, version = "failing", "1"

    def call(self, **args):
        raise ConnectionError("the search service is down")

    def search(self, *args, **kwargs):
        raise ConnectionError("the search service is down")


def state(env) -> tuple:
    return env.trajectory.to_json(), env._snapshot(), env.np_random.bit_generator.state, env.last_info


def test_searchqa_search_that_raises_changes_nothing():
    require_env("SearchQA-v0")
    env = twice_envs.make("SearchQA-v0")
    ref = twice_envs.make("SearchQA-v0")
    for e in (env, ref):
        e.reset(seed=11)
        e.step(SEARCH)
    working = env.resources
    # a fresh journal, so the failing tool is really called
    env.resources = dataclasses.replace(working, tool=Failing(), journal=Journal(None))
    before = state(env)
    with pytest.raises(ConnectionError):
        env.step("<search> a question nobody asked before </search>")
    assert state(env) == before and env.num_searches == 1
    env.resources = working
    for a in ("<search> a question nobody asked before </search>", SEARCH, "<answer> Velora </answer>"):
        assert env.step(a)[:4] == ref.step(a)[:4]
    assert env.trajectory.to_json() == ref.trajectory.to_json()
    assert twice_envs.replay(env.trajectory).trajectory.digests == env.trajectory.digests


def test_webshop_search_that_raises_changes_nothing():
    require_env("WebShop-v0")
    env = twice_envs.make("WebShop-v0")
    ref = twice_envs.make("WebShop-v0")
    for e in (env, ref):
        e.reset(seed=4)
    working = env.res
    env.res = dataclasses.replace(working, index=Failing())
    before = state(env)
    with pytest.raises(ConnectionError):
        env.step("search[red shoes]")
    assert state(env) == before
    env.res = working
    for a in ("search[red shoes]", "click[next >]", "click[< prev]"):
        assert env.step(a)[:4] == ref.step(a)[:4]
    assert env.trajectory.to_json() == ref.trajectory.to_json()


def test_alfworld_engine_that_raises_refuses_to_step_until_reset(monkeypatch):
    require_env("ALFWorld-v0")
    env = twice_envs.make("ALFWorld-v0")
    _, info = env.reset(seed=2)
    command = info["admissible_actions"][0]
    before = env.trajectory.to_json()

    def boom(command):
        raise RuntimeError("the engine crashed")

    monkeypatch.setattr(env.engine, "step", boom)
    with pytest.raises(RuntimeError, match="the engine crashed"):
        env.step(command)
    monkeypatch.undo()
    assert env.trajectory.to_json() == before
    # the engine's state is unknown after the crash: no further step on it
    with pytest.raises(TwiceError, match="step\\(\\) raised RuntimeError: the engine crashed.*refused until a reset"):
        env.step("look")
    # the record is intact, so a fork (by replay) still gives the episode before the crash
    assert env.fork(0).trajectory.digests == before["digests"]
    _, info = env.reset(seed=2)
    assert not env.step(command)[4]["invalid"]
