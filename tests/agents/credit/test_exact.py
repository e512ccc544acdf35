"""Exact A*: registered once, fed the lab's exact advantages, refused where there are none."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from twice_envs.agents.credit import registry
from twice_envs.agents.credit.registry import CreditContext, check_env, get_method, run_credit
from twice_envs.agents.lab import toy
from twice_envs.agents.lab.choice_lab import ChoiceLabSetting, choice_lab_policy
from twice_envs.agents.lab.runner import lab_step_fns
from twice_envs.envs.choicelab.env import ChoiceLabConfig


def _batch():
    policy = choice_lab_policy(ChoiceLabSetting(world=ChoiceLabConfig(tasks=8, horizon=5)))
    policy = policy.with_logits(np.random.default_rng(0).normal(size=policy.logits.shape))
    eps, envs = toy.toy_rollouts(policy, 3, 2, noise_seed=11)
    return policy, eps, envs


def test_registered_once_as_a_diagnostic_of_the_learning_bench():
    m = get_method("exact-advantage")
    assert (m.display, m.needs, m.benches, m.rollouts) == ("Exact A*", frozenset({"exact_advantages"}), ("learn",), 1)
    assert "exact_advantages" in registry.NEEDS and registry.methods().count("exact-advantage") == 1
    assert "exact-advantage" in registry.methods("learn") and "exact-advantage" not in registry.methods("games")


def test_its_update_uses_the_exact_advantages_through_the_labs_step_fns():
    policy, eps, envs = _batch()
    res = run_credit(get_method("exact-advantage"), eps, CreditContext(policy=policy, runners=lab_step_fns(envs)))
    want = [policy.episode_advantages([t.text for t in e.turns]) for e in eps]
    assert res.aux_tokens == 0 and len(res.advantages) == len(eps)
    for got, exact in zip(res.advantages, want):
        assert got.tolist() == pytest.approx(exact.tolist())
    assert any(np.abs(a).max() > 0 for a in res.advantages)


def test_a_caller_without_exact_advantages_gets_a_clear_error():
    policy, eps, envs = _batch()
    runners = replace(lab_step_fns(envs), exact_advantages=None)
    with pytest.raises(ValueError, match=r"needs exact advantages .*\(need 'exact_advantages'\), but the caller's"):
        run_credit(get_method("exact-advantage"), eps, CreditContext(policy=policy, runners=runners))


@pytest.mark.parametrize("env", ["SearchQA-v0", "CreditToy-v0", "WebShop-v0"])
def test_envs_without_exact_values_are_refused_before_any_rollout(env):
    with pytest.raises(ValueError, match=f"'exact-advantage' uses exact advantages, and env '{env}' has none"):
        check_env("exact-advantage", env)


@pytest.mark.parametrize("env", ["ChoiceLab-v0", "SearchToy-v0", "TextLab-v0"])
def test_lab_envs_with_exact_values_are_served(env):
    check_env("exact-advantage", env)
