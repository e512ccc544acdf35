"""Every env refuses to be used after close(), with one clear error; close() twice is harmless."""

from __future__ import annotations

import pytest

import twice_envs
from tests import toy_envs  # registers CoinChain-v0 and CoinChainReplay-v0
from twice_envs._deps import available
from twice_envs.errors import EnvClosedError, TwiceError

ALL_IDS = sorted(twice_envs.registry)
NEEDS = {"ALFWorld": "alfworld", "SearchQA-Dense": "faiss", "SearchQA": "bm25s", "WebShop": "bm25s"}


def made(env_id: str):
    for prefix, module in NEEDS.items():
        if env_id.startswith(prefix) and not available(module):
            pytest.skip(f"{env_id} needs {module}")
    return twice_envs.make(env_id)


def an_action(info: dict) -> str:
    actions = info.get("admissible_actions")
    return min(actions) if actions else "<search> capital of Velora </search>"


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_step_fork_and_reset_after_close_raise_env_closed_error(env_id):
    env = made(env_id)
    _, info = env.reset(seed=1)
    env.step(an_action(info))
    record = env.trajectory.to_json()
    env.close()
    for call, what in ((lambda: env.step("look"), "step"), (lambda: env.fork(0), "fork"),
                       (lambda: env.fork(), "fork"), (lambda: env.reset(seed=1), "reset")):
        with pytest.raises(EnvClosedError, match=rf"{what}\(\) after close\(\)") as err:
            call()
        assert isinstance(err.value, TwiceError) and env_id in str(err.value)
        assert "twice_envs.make" in str(err.value)
    env.close()  # a second close is harmless
    # the record stays readable, and it replays on a new env
    assert env.trajectory.to_json() == record and env.closed
    assert twice_envs.first_divergence(record) is None


@pytest.mark.parametrize("env_id", ["CoinChain-v0", "CoinChainReplay-v0", "SearchQA-v0", "WebShop-v0", "ALFWorld-v0"])
def test_close_before_reset_and_twice_is_harmless(env_id):
    env = made(env_id)
    assert not env.closed
    env.close()
    env.close()
    with pytest.raises(EnvClosedError):
        env.reset(seed=0)
    with pytest.raises(EnvClosedError):
        env.step("look")


def test_forks_of_a_closed_env_were_independent():
    env = made("CoinChain-v0")
    env.reset(seed=2)
    env.step("look")
    child = env.fork(1)
    env.close()
    child.step("right")  # closing the original leaves its forks usable
    child.close()
    with pytest.raises(EnvClosedError):
        child.step("left")


def test_a_subclass_close_that_skips_super_still_marks_the_env_closed():
    released = []

    class OwnClose(toy_envs.CoinChain):
        def close(self):
            released.append(1)  # releases its own resources and never calls super().close()

    twice_envs.register("OwnClose-v0", OwnClose, override=True)
    env = twice_envs.make("OwnClose-v0")
    env.reset(seed=0)
    env.close()
    env.close()
    assert released == [1]
    with pytest.raises(EnvClosedError, match="OwnClose-v0"):
        env.step("look")
