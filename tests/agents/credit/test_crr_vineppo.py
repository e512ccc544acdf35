"""CRR and VinePPO credit on CreditToy: unbiased against the exact advantages."""

import numpy as np

from twice_envs.agents.credit import crr, vineppo
from twice_envs.agents.credit.twice import TwiceConfig
from twice_envs.agents.lab import toy

from .stats_helpers import bias_z_scores, chi2_upper_z, decision_types


def test_crr_branches_uniformly_at_twice_cost_and_is_unbiased(toy_batch, independent_twins):
    _, episodes, _, index, exact = toy_batch
    plan = crr.plan_branches(episodes, np.random.default_rng(3), TwiceConfig(beta=0.5))
    assert np.ptp(plan.q) == 0
    assert np.dot(plan.q, plan.costs) == np.float64(np.dot(plan.q, plan.costs))
    spent = np.dot(plan.q, plan.costs)
    assert abs(spent / (0.5 * sum(e.num_generated_tokens for e in episodes)) - 1) < 0.03
    chosen = [tw for tw, b in zip(independent_twins, plan.branched) if b]
    assert all(not tw.coupled for tw in chosen)
    credit = crr.crr_credit(episodes, chosen, plan)
    zs = bias_z_scores(credit.a_hat, exact, decision_types(episodes, index))
    assert len(zs) >= 15
    assert chi2_upper_z(zs) < 3.5


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
