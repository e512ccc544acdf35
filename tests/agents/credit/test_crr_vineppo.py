"""CRR and VinePPO credit on CreditToy: unbiased against the exact advantages."""

import numpy as np
import pytest

from twice_envs.agents.credit import crr, twice, vineppo
from twice_envs.agents.credit.grpo import episode_advantages
from twice_envs.agents.credit.registry import CreditContext, Runners, get_method, run_credit
from twice_envs.agents.credit.twice import TwiceConfig
from twice_envs.agents.lab import toy
from twice_envs.agents.lab.runner import lab_runners

from .stats_helpers import bias_z_scores, chi2_upper_z, decision_types


def test_crr_branches_uniformly_at_twice_cost_and_its_difference_is_unbiased(toy_batch, independent_twins):
    _, episodes, _, index, exact = toy_batch
    plan = crr.plan_branches(episodes, np.random.default_rng(3), TwiceConfig(beta=0.5))
    assert np.ptp(plan.q) == 0
    spent = np.dot(plan.q, plan.costs)
    assert abs(spent / (0.5 * sum(e.num_generated_tokens for e in episodes)) - 1) < 0.03
    chosen = [tw for tw, b in zip(independent_twins, plan.branched) if b]
    assert all(not tw.coupled for tw in chosen)
    adv = crr.crr_advantages(episodes, chosen)
    rows = np.flatnonzero(plan.branched)
    diffs = np.array([adv[index[r][0]][index[r][1]] for r in rows])
    zs = bias_z_scores(diffs, exact[rows], decision_types(episodes, [index[r] for r in rows]))
    assert len(zs) >= 15
    assert chi2_upper_z(zs) < 3.5


def test_crr_replaces_the_advantage_of_a_branched_decision_with_its_outcome_difference():
    """Published CRR: U - U' at branched decisions (no inverse weight, no GRPO term), A_traj elsewhere."""
    policy = toy.toy_policy()
    episodes, envs = toy.toy_rollouts(policy, 12, 5, noise_seed=4)
    twins_fn, values_fn = lab_runners(envs)
    res = run_credit(get_method("crr"), episodes, CreditContext(
        policy=policy, rng=np.random.default_rng(1), noise_seed=5, config=TwiceConfig(beta=0.5),
        runners=Runners(twins=twins_fn, values=values_fn)))
    a_traj = episode_advantages([e.utility for e in episodes], [e.group for e in episodes])
    # rerun the same coins to learn which decisions were branched and their counterfactuals
    plan = crr.plan_branches(episodes, np.random.default_rng(1), TwiceConfig(beta=0.5))
    cf = twins_fn(policy, episodes, plan.branched_decisions, crr.crr_config(TwiceConfig(beta=0.5)), None,
                  np.random.default_rng(1), noise_seed=5)
    u_cf = {tuple(r.twin_of): r.utility for r in cf.records}
    assert 0 < len(u_cf) < len(plan.index)
    for (i, t) in plan.index:
        want = episodes[i].utility - u_cf[(i, t)] if (i, t) in u_cf else a_traj[i]
        assert res.advantages[i][t] == pytest.approx(want)
    assert res.stats["aux_accounted"] == pytest.approx(np.dot(plan.branched, plan.costs))


def test_crr_added_is_the_additive_ablation():
    policy = toy.toy_policy()
    episodes, envs = toy.toy_rollouts(policy, 12, 5, noise_seed=4)
    twins_fn, values_fn = lab_runners(envs)
    res = run_credit(get_method("crr-added"), episodes, CreditContext(
        policy=policy, rng=np.random.default_rng(1), noise_seed=5, config=TwiceConfig(beta=0.5),
        runners=Runners(twins=twins_fn, values=values_fn)))
    cfg = crr.crr_config(TwiceConfig(beta=0.5))
    rng = np.random.default_rng(1)
    plan = crr.plan_branches(episodes, rng, TwiceConfig(beta=0.5))
    cf = twins_fn(policy, episodes, plan.branched_decisions, cfg, None, rng, noise_seed=5)
    credit = twice.twin_credit(episodes, cf.records, plan, cf.kept, cfg)
    want = twice.combine(episodes, plan.index, credit.a_hat, cfg)
    for a, b in zip(res.advantages, want):
        np.testing.assert_allclose(a, b)


def test_vineppo_values_from_forks_are_unbiased(toy_batch):
    policy, episodes, envs, index, exact = toy_batch
    n = 2000  # the first 2000 episodes, K = 2 rollouts per state
    sub_eps, sub_envs = episodes[:n], envs[:n]
    states = vineppo.value_states(sub_eps)
    rollouts = []
    for k in range(vineppo.K_ROLLOUTS):
        rollouts += toy.toy_twins(policy, sub_eps, sub_envs, states, coupled=False, branch=1 + k, fresh_salt=100 + k)
    credit = vineppo.vine_credit(sub_eps, rollouts)
    values = np.concatenate(credit)
    sub_index = [(i, t) for i, t in index if i < n]
    zs = bias_z_scores(values, exact[: len(sub_index)], decision_types(sub_eps, sub_index))
    assert len(zs) >= 10
    assert chi2_upper_z(zs) < 3.5
    # the last value is the episode's own utility
    v = vineppo.state_values(sub_eps, rollouts)
    assert all(v[i][-1] == ep.utility for i, ep in enumerate(sub_eps))


def test_vineppo_trains_on_whitened_credit():
    policy = toy.toy_policy()
    episodes, envs = toy.toy_rollouts(policy, 10, 5, noise_seed=2)
    twins_fn, values_fn = lab_runners(envs)
    res = run_credit(get_method("vineppo"), episodes, CreditContext(
        policy=policy, rng=np.random.default_rng(0), noise_seed=3, config=vineppo.VineConfig(per_state=2, budget=None),
        runners=Runners(twins=twins_fn, values=values_fn)))
    flat = np.concatenate(res.advantages)
    assert abs(flat.mean()) < 1e-9 and flat.std() == pytest.approx(1.0, rel=1e-6)
    raw = np.concatenate(vineppo.vine_credit(episodes, values_fn(policy, episodes, None, k=2, noise_seed=3).records))
    np.testing.assert_allclose(flat, (raw - raw.mean()) / (raw.std() + vineppo.WHITEN_EPS))


def _ep(utility, turns, group):
    from types import SimpleNamespace
    return SimpleNamespace(utility=utility, turns=[None] * turns, group=group)


def _value(i, t, u):
    from types import SimpleNamespace
    return SimpleNamespace(twin_of=(i, t), self_twin=False, utility=u)


def test_vineppo_credit_between_estimated_boundaries_by_hand():
    """Episode 0 (U = 1) has values at s_1 only (0 and 1: 0.5); its V(s_0) is the other episode's utility (0).
    Episode 1 (U = 0) has none: V(s_0) = 1 from episode 0, every turn gets 0 - 1. Episode 2 is alone in its
    task: its stretch before s_2 gets 0. Break: a stretch's difference given to its first turn only -> turns
    1, 2 of episode 0 read 0."""
    eps = [_ep(1.0, 3, 0), _ep(0.0, 3, 0), _ep(1.0, 3, 7)]
    vals = [_value(0, 1, 0.0), _value(0, 1, 1.0), _value(2, 2, 0.25), _value(2, 2, 0.25)]
    credit = vineppo.vine_credit(eps, vals)
    np.testing.assert_allclose(credit[0], [0.5, 0.5, 0.5])
    np.testing.assert_allclose(credit[1], [-1.0, -1.0, -1.0])
    np.testing.assert_allclose(credit[2], [0.0, 0.0, 0.75])
    with pytest.raises(ValueError, match="no value rollouts for turns"):
        vineppo.state_values(eps, vals)


def test_vineppo_plan_meets_its_budget_in_expectation_and_spends_it_on_the_lab():
    """Every boundary of the toy's episodes costs about 5x the factual batch; at the published 3.20x each
    boundary is drawn with one q and the expected value tokens are 2.2x the factual ones. Break: the plan
    estimating every boundary -> the run spends about 5x and q is 1."""
    policy = toy.toy_policy()
    episodes, envs = toy.toy_rollouts(policy, 20, 5, noise_seed=6)
    factual = sum(e.num_generated_tokens for e in episodes)
    every = vineppo.K_ROLLOUTS * sum(e.remaining_tokens(t) for e in episodes for t in range(len(e.turns)))
    assert every > 3 * factual
    cfg = vineppo.VineConfig()
    spent = []
    for seed in range(40):
        states, q = vineppo.value_plan(episodes, cfg, np.random.default_rng(seed))
        assert q == pytest.approx((cfg.budget - 1) * factual / every)
        spent.append(vineppo.K_ROLLOUTS * sum(episodes[i].remaining_tokens(t) for i, t in states))
    assert np.mean(spent) / ((cfg.budget - 1) * factual) == pytest.approx(1.0, abs=0.05)
    assert vineppo.value_plan(episodes, vineppo.VineConfig(budget=50.0), np.random.default_rng(0)) == (None, 1.0)
    assert vineppo.value_plan(episodes, vineppo.VineConfig(budget=None), np.random.default_rng(0)) == (None, 1.0)
    twins_fn, values_fn = lab_runners(envs)
    aux = []
    for seed in range(10):
        res = run_credit(get_method("vineppo"), episodes, CreditContext(
            policy=policy, rng=np.random.default_rng(seed), noise_seed=3, config=cfg,
            runners=Runners(twins=twins_fn, values=values_fn)))
        aux.append(res.aux_tokens)
    assert 1 + np.mean(aux) / factual == pytest.approx(cfg.budget, rel=0.05)


@pytest.mark.parametrize("budget", [1.0, 0.5, -2, float("nan"), float("inf"), True, "3.2"])
def test_vineppo_refuses_a_budget_that_is_not_above_one(budget):
    with pytest.raises(ValueError, match="vineppo budget"):
        vineppo.VineConfig(budget=budget)
