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


def _run_twice(config, updates: int, groups: int = 16):
    """Twice's credit step on fresh SearchToy batches of a fixed policy: (update, stats) per update."""
    from twice_envs.agents.lab import toy
    from twice_envs.agents.lab.runner import lab_runners
    from twice_envs.agents.lab.search_toy import search_toy_policy
    from twice_envs.agents.credit.registry import CreditContext, Runners, get_method, run_credit

    policy = search_toy_policy()
    rng, state, out = np.random.default_rng(0), None, []
    for u in range(updates):
        eps, envs = toy.toy_rollouts(policy, groups, 5, noise_seed=100 + u)
        tf, vf = lab_runners(envs)
        res = run_credit(get_method("twice"), eps, CreditContext(policy=policy, rng=rng, update=u, noise_seed=u,
                                                                 predictor_state=state, config=config,
                                                                 runners=Runners(twins=tf, values=vf)))
        state = res.predictor_state
        out.append((u, res.stats))
    return out


def test_twice_plans_every_batch_at_its_budget_and_its_accounted_tokens_keep_it():
    """After warm-up, each batch's plan spends beta x policy tokens in expectation (one lambda per
    batch, no recycling of earlier savings), and the accounted tokens over the run stay within 3%."""
    from twice_envs.agents.credit.twice import TwiceConfig

    runs = _run_twice(TwiceConfig(beta=0.7, warmup_updates=2), updates=40)  # per-batch coin noise ~7%
    assert [st["warmup"] for _, st in runs[:3]] == [True, True, False]
    after = [st for u, st in runs if u >= 2]
    for st in after:
        assert st["aux_planned"] == pytest.approx(st["aux_target"], rel=1e-6)
    ratio = sum(st["aux_accounted"] for st in after) / sum(st["aux_target"] for st in after)
    assert ratio == pytest.approx(1.0, abs=0.03)


def test_cost_calibration_is_an_ablation_that_scales_every_cost_by_earlier_realised_over_planned():
    """Twice plans on c_t net of its self-twins; the ablation also divides the budget by what earlier updates
    realised per planned token (here half), so it plans twice the target: the accounted tokens leave beta."""
    from twice_envs.agents.credit import predictor, twice
    from twice_envs.agents.types import EpisodeRecord, TurnRecord
    from twice_envs.keys import NoiseKey

    eps = [EpisodeRecord("E", 0, {}, group=0, utility=float(u),
                         turns=[TurnRecord([1] * 4, [-5.0] * 4, "x", NoiseKey(1, t)) for t in range(3)])
           for u in (0, 1)]
    state = predictor.PredictorState(cost_realised=50.0, cost_expected=100.0)
    for calibrated, planned in ((False, 0.7 * 24), (True, 2 * 0.7 * 24)):
        config = twice.TwiceConfig(beta=0.7, warmup_updates=0, q_min=0.0, cost_calibration=calibrated)
        plan, _, _ = twice.plan_batch(eps, config, state, np.random.default_rng(0), update=1)
        assert float(np.dot(plan.q, plan.unit_costs(config))) == pytest.approx(planned, rel=1e-6)


def test_the_twin_cost_sample_counts_continued_twins_that_are_not_self_twins():
    from types import SimpleNamespace

    from twice_envs.agents.types import EpisodeRecord, TurnRecord
    from twice_envs.keys import NoiseKey

    def twin(t, tokens, **kw):
        return EpisodeRecord("E", 0, {}, twin_of=(0, t), branch=1,
                             turns=[TurnRecord([1] * tokens, [0.0] * tokens, "x", NoiseKey(1, t))], **kw)

    plan = SimpleNamespace(index=[(0, 0), (0, 1), (0, 2)], costs=np.array([4.0, 3.0, 2.0]))
    records = [twin(0, 5), twin(1, 1, self_twin=True), twin(2, 1)]
    # the self-twin and the twin the evidence coin stopped (kept False) are left out
    assert budget.twin_cost_sample(plan, records, [True, True, False]) == (5.0, 4.0)


def test_pairs_and_stars_plan_each_twin_and_replica_net_of_self_twins():
    """Break: replicas planned whatever their twins (no 1 - p^K factor) give 14, not 13."""
    from types import SimpleNamespace

    from twice_envs.agents.credit.twice import TwiceConfig
    from twice_envs.agents.types import EpisodeRecord

    cfg = TwiceConfig(pairs=2, star=2)
    # c = 4, len = 1, p = 1/2: four twins of 4 - 1/2 x 3 and one replica of 4, run unless both its twins are selves
    assert budget.expected_twin_costs([4.0], [1.0], [0.5], cfg) == pytest.approx([4 * 2.5 + 4 * 0.75])
    assert budget.expected_twin_costs([4.0], [1.0], [0.0], cfg) == pytest.approx([4.0 * budget.twins_per_decision(cfg)])
    plan = SimpleNamespace(index=[(0, 0)], costs=np.array([4.0]), branched=np.array([True]), turn_costs=np.array([1.0]),
                           cost_ratio=1.0)
    twin = lambda pair, self_twin: EpisodeRecord("E", 0, {}, twin_of=(0, 0), pair=pair, self_twin=self_twin)  # noqa: E731
    # pair 1's twins are both self-twins: they cost a turn each and its replica nothing; pair 0's one self-twin a turn
    recs = [twin(0, True), twin(0, False), twin(1, True), twin(1, True)]
    assert budget.accounted_tokens(plan, cfg, recs) == pytest.approx(5 * 4 - 3 * 3 - 4)
