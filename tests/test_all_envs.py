"""Every registered env id passes the public contract checker."""

from __future__ import annotations

import pytest

import twice_envs
from twice_envs._deps import available

ALL_IDS = sorted(twice_envs.registry)
NEEDS = {"ALFWorld": "alfworld", "SearchQA-Dense": "faiss"}


def test_the_builtin_ids_are_all_here():
    for env_id in ("SearchQA-v0", "ALFWorld-v0", "WebShop-v0"):
        assert env_id in ALL_IDS


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_check_env_on_every_registered_id(env_id):
    for prefix, module in NEEDS.items():
        if env_id.startswith(prefix) and not available(module):
            pytest.skip(f"{env_id} needs {module}")
    report = twice_envs.check_env(
        twice_envs.make(env_id),
        num_episodes=2,
        num_steps=6,
        extra_actions=["<search> capital of Velora </search>", "<answer> Velora </answer>"],
    )
    assert report.skipped == [], report.skipped
    for check in ("protocol", "determinism across resets", "fork == replay", "fork independence", "bad actions handled",
                  "trajectory JSON round trip and replay", "determinism across processes"):
        assert any(p.startswith(check) for p in report.passed), (check, report.passed)
