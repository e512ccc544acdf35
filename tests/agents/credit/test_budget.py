import numpy as np
import pytest

from twice_envs.agents.credit import budget


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("beta", [0.2, 0.4, 0.7])
def test_bisection_meets_the_budget_within_three_percent(seed, beta):
    rng = np.random.default_rng(seed)
    n = 500
    eta = rng.uniform(0, 1, n)
    costs = rng.integers(5, 400, n).astype(float)
    policy_tokens = costs.sum() / 2.5  # costs count remaining tokens, so they exceed the policy's
    q, lam = budget.sqrt_rule(eta, costs, beta * policy_tokens, q_min=0.05)
    spent = budget.expected_cost(q, costs)
    assert spent == pytest.approx(beta * policy_tokens, rel=0.03)
    assert np.all((q >= 0.05) & (q <= 1.0))
    # the square-root rule: unclipped probabilities are proportional to sqrt(eta / c)
    free = (q > 0.05 + 1e-9) & (q < 1 - 1e-9)
    assert free.sum() > 10
    np.testing.assert_allclose(q[free], lam * np.sqrt(eta[free] / costs[free]), rtol=1e-9)


def test_budget_extremes():
    costs = np.array([10.0, 20.0, 30.0])
    q, _ = budget.sqrt_rule([0.5, 0.5, 0.5], costs, 1000.0)
    assert q.tolist() == [1.0, 1.0, 1.0]  # the budget buys everything
    q, _ = budget.sqrt_rule([0.5, 0.5, 0.5], costs, 0.1, q_min=0.05)
    assert q.tolist() == [0.05, 0.05, 0.05]  # the floor wins
    q, _ = budget.sqrt_rule([0.0, 0.0, 0.0], costs, 10.0, q_min=0.05)
    assert q.tolist() == [0.05, 0.05, 0.05]


def test_higher_discordance_and_lower_cost_get_more_branching():
    q, _ = budget.sqrt_rule([0.9, 0.1, 0.9], [10.0, 10.0, 100.0], 15.0, q_min=0.01)
    assert q[0] > q[1] and q[0] > q[2]


def test_uniform_and_mixed_rules_spend_the_budget():
    rng = np.random.default_rng(4)
    costs = rng.integers(5, 100, 200).astype(float)
    q, _ = budget.uniform_rule(costs, 0.2 * costs.sum(), q_min=0.01)
    assert np.ptp(q) == 0 and budget.expected_cost(q, costs) == pytest.approx(0.2 * costs.sum(), rel=0.03)
    p = rng.uniform(0, 1, 200)
    q, _ = budget.mixed_outcome_rule(p, costs, 0.2 * costs.sum(), q_min=0.01)
    assert budget.expected_cost(q, costs) == pytest.approx(0.2 * costs.sum(), rel=0.03)
    assert q[np.argmax(2 * p * (1 - p))] >= q[np.argmin(2 * p * (1 - p))]
