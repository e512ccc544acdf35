"""gymnasium's own ``check_env`` passes on every registered id (PettingZoo's tests: tests/wrappers/test_pettingzoo.py)."""

from __future__ import annotations

import warnings

import pytest
from gymnasium.utils.env_checker import check_env as gymnasium_check_env

import twice_envs
from tests import toy_envs  # noqa: F401  (registers CoinChain-v0 and CoinChainReplay-v0)
from twice_envs._deps import available

#: Every id the package registers, and the toy ids the core tests use.
IDS = sorted(i for i, s in twice_envs.registry.items() if str(s.entry_point).startswith("twice_envs.")) + [
    "CoinChain-v0",
    "CoinChainReplay-v0",
]
NEEDS = {"ALFWorld": "alfworld", "SearchQA-Dense": "faiss", "SearchQA": "bm25s", "WebShop": "bm25s"}
#: gymnasium warns about this for every env that renders text only; it is no contract of ours.
NO_FPS = "No render fps was declared"


def test_the_builtin_ids_are_checked():
    assert {"SearchQA-v0", "ALFWorld-v0", "WebShop-v0"} <= set(IDS)


@pytest.mark.slow
@pytest.mark.parametrize("env_id", IDS)
def test_gymnasium_check_env_on_every_registered_id(env_id):
    for prefix, module in NEEDS.items():
        if env_id.startswith(prefix) and not available(module):
            pytest.skip(f"{env_id} needs {module}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gymnasium_check_env(twice_envs.make(env_id))
    # gymnasium reports near-misses (e.g. reset observations "similar but not equal") as warnings
    assert [str(w.message) for w in caught if NO_FPS not in str(w.message)] == []
