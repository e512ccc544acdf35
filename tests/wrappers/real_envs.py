"""The envs the adapter tests run on, and a scripted way to pick actions in each."""

from __future__ import annotations

import random
from typing import Optional

import pytest

import tests.toy_envs  # noqa: F401  (registers CoinChain-v0 and CoinChainReplay-v0)
import twice_envs

#: env id -> the optional module it needs (None: always available).
REAL_ENVS = {"SearchQA-v0": "bm25s", "WebShop-v0": "bm25s", "ALFWorld-v0": "alfworld"}
#: Envs that list admissible actions.
LISTING_ENVS = ("CoinChain-v0", "CoinChainReplay-v0", "WebShop-v0", "ALFWorld-v0")

#: Actions tried in envs without an action list: well-formed ones that do not end the
#: episode, and malformed ones.
FREE_TEXT_ACTIONS = (
    "<search> who founded the company </search>",
    "<think>hm</think><search> capital city of france </search>",
    "look",
    "",
)


def require_env(env_id: str) -> None:
    """Skip when the env's optional dependency is missing (never when the env itself is)."""
    module = REAL_ENVS.get(env_id)
    if module is not None:
        pytest.importorskip(module)
    assert env_id in twice_envs.registry, f"{env_id} is not registered"


def pick_action(info: dict, rng: random.Random) -> str:
    """A scripted action: one of the listed admissible actions, else a fixed free-text one."""
    actions: Optional[list] = info.get("admissible_actions")
    if actions:
        return rng.choice(list(actions))
    return rng.choice(FREE_TEXT_ACTIONS)
