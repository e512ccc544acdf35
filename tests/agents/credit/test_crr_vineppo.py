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
        policy=policy, rng=np.random.default_rng(0), noise_seed=3, config=vineppo.VineConfig(per_state=2),
        runners=Runners(twins=twins_fn, values=values_fn)))
    flat = np.concatenate(res.advantages)
    assert abs(flat.mean()) < 1e-9 and flat.std() == pytest.approx(1.0, rel=1e-6)
    raw = np.concatenate(vineppo.vine_credit(episodes, values_fn(policy, episodes, None, k=2, noise_seed=3).records))
    np.testing.assert_allclose(flat, (raw - raw.mean()) / (raw.std() + vineppo.WHITEN_EPS))
