"""Twin credit on CreditToy, where every advantage is known exactly."""

from dataclasses import replace

import numpy as np
import pytest

from twice_envs.agents.credit import twice
from twice_envs.agents.credit.twice import BranchPlan, TwiceConfig
from twice_envs.agents.types import EpisodeRecord, TurnRecord
from twice_envs.keys import NoiseKey

from .stats_helpers import bias_z_scores, chi2_upper_z, decision_types


def _estimate(toy_batch, twins, config, seed):
    """A_hat for every decision with random q in [0.05, 1] and real branch/evidence coins."""
    _, episodes, _, index, exact = toy_batch
    rng = np.random.default_rng(seed)
    q = rng.uniform(0.05, 1.0, len(index))
    branched = rng.random(len(index)) < q
    plan = BranchPlan(index, np.ones(len(index)), np.full(len(index), np.nan), q, branched)
    chosen = [tw for tw, b in zip(twins, branched) if b]
    kept = twice.evidence_coins([twice.evidence_exponent(tw) for tw in chosen], config, rng)
    return twice.twin_credit(episodes, chosen, plan, kept, config).a_hat, exact


def test_twin_difference_is_unbiased(toy_batch, coupled_twins):
    _, episodes, _, index, exact = toy_batch
    d = np.array([episodes[i].utility - tw.utility for (i, _), tw in zip(index, coupled_twins)])
    zs = bias_z_scores(d, exact, decision_types(episodes, index))
    assert len(zs) >= 15
    assert chi2_upper_z(zs) < 3.5
    assert np.max(np.abs(zs)) < 4.5
    # the twins are real: some differ from the factual outcome, some are self-twins
    assert 0.05 < np.mean(d != 0) < 0.9
    assert 0.05 < np.mean([tw.self_twin for tw in coupled_twins]) < 0.8


def test_inverse_weights_keep_twice_unbiased_for_any_q(toy_batch, coupled_twins):
    a_hat, exact = _estimate(toy_batch, coupled_twins, TwiceConfig(), seed=5)
    _, episodes, _, index, _ = toy_batch
    zs = bias_z_scores(a_hat, exact, decision_types(episodes, index))
    assert chi2_upper_z(zs) < 3.5
    assert np.max(np.abs(zs)) < 4.5


def test_without_inverse_weights_the_estimator_is_biased(toy_batch, coupled_twins):
    a_hat, exact = _estimate(toy_batch, coupled_twins, replace(TwiceConfig(), inverse_weights=False), seed=5)
    _, episodes, _, index, _ = toy_batch
    assert chi2_upper_z(bias_z_scores(a_hat, exact, decision_types(episodes, index))) > 8


def test_skip_same_evidence_is_detectably_biased(toy_batch, coupled_twins):
    config = replace(TwiceConfig(), skip_same_evidence=True)
    a_hat, exact = _estimate(toy_batch, coupled_twins, config, seed=5)
    _, episodes, _, index, _ = toy_batch
    zs = bias_z_scores(a_hat, exact, decision_types(episodes, index))
    assert chi2_upper_z(zs) > 8
    assert np.max(np.abs(zs)) > 5


def test_coupling_shrinks_variance_by_one_minus_rho(toy_batch, coupled_twins, independent_twins):
    _, episodes, _, index, _ = toy_batch
    root = [r for r, (_, t) in enumerate(index) if t == 0]  # every episode's first decision: one state
    u = np.array([episodes[index[r][0]].utility for r in root])
    u_c = np.array([coupled_twins[r].utility for r in root])
    u_i = np.array([independent_twins[r].utility for r in root])
    rho = np.corrcoef(u, u_c)[0, 1]
    assert rho > 0.15  # a broken coupling gives rho ~ 0
    assert abs(np.corrcoef(u, u_i)[0, 1]) < 0.06  # independent means independent
    assert np.var(u - u_c) <= (1 - rho) * np.var(u - u_i) * 1.08


def _episode(utility, group, n_turns=2):
    key = NoiseKey(1, 0)
    turns = [TurnRecord([1, 2], [-0.1, -0.2], "x", key) for _ in range(n_turns)]
    return EpisodeRecord("E", 0, {}, group=group, turns=turns, utility=utility)


def test_combine_adds_scaled_twin_credit_to_grpo():
    eps = [_episode(1.0, 0), _episode(0.0, 0), _episode(1.0, 1), _episode(1.0, 1)]
    index = [(i, t) for i in range(4) for t in range(2)]
    a_hat = np.zeros(8)
    a_hat[1] = 0.5  # episode 0, turn 1
    out = twice.combine(eps, index, a_hat, TwiceConfig(omega=2.0))
    sigma = np.std([1, 0, 1, 1])
    assert out[0][0] == pytest.approx(1.0, abs=1e-5)
    assert out[0][1] == pytest.approx(1.0 + 2.0 * 0.5 / sigma, abs=1e-5)
    assert out[1].tolist() == pytest.approx([-1.0, -1.0], abs=1e-5)
    assert out[2].tolist() == [0.0, 0.0]  # a tied group
    only = twice.combine(eps, index, a_hat, TwiceConfig(trajectory_term=False))
    assert only[0].tolist() == pytest.approx([0.0, 0.5 / sigma])


def test_sigma_hat_is_floored():
    assert twice.sigma_hat([0.0, 0.0, 0.0]) == 0.1
    assert twice.sigma_hat([0.0, 1.0]) == pytest.approx(0.5)


def test_self_twins_count_as_zero_and_are_never_reweighted_by_evidence():
    eps = [_episode(1.0, 0)]
    tw = EpisodeRecord("E", 0, {}, twin_of=(0, 1), branch=1, self_twin=True, same_evidence=True, utility=0.0)
    plan = BranchPlan([(0, 0), (0, 1)], np.ones(2), np.zeros(2), np.array([0.5, 0.5]), np.array([False, True]))
    credit = twice.twin_credit(eps, [tw], plan, [True], TwiceConfig())
    assert credit.a_hat.tolist() == [0.0, 0.0]
    assert twice.evidence_exponent(tw) == 0


def test_twin_of_unbranched_decision_is_rejected():
    eps = [_episode(1.0, 0)]
    tw = EpisodeRecord("E", 0, {}, twin_of=(0, 0), branch=1, utility=0.0)
    plan = BranchPlan([(0, 0), (0, 1)], np.ones(2), np.zeros(2), np.array([0.5, 0.5]), np.array([False, True]))
    with pytest.raises(ValueError, match="branch coin was 0"):
        twice.twin_credit(eps, [tw], plan, [True], TwiceConfig())


def test_warmup_branches_everything_with_probability_point_three():
    eps = [_episode(1.0, 0, 3), _episode(0.0, 0, 3)]
    rng = np.random.default_rng(0)
    plan = twice.plan_branches(eps, TwiceConfig(), None, rng, update=3)
    assert np.all(plan.q == 0.3)
    plan = twice.plan_branches(eps, TwiceConfig(), np.full(6, 0.5), rng, update=10)
    assert np.all(plan.q < 1.0) and np.isfinite(plan.lam)
    spent = float(np.dot(plan.q, plan.unit_costs(TwiceConfig())))  # costs net of the predicted self-twins
    assert spent == pytest.approx(0.7 * 12, rel=0.03)


def test_mixed_outcome_targeting_follows_each_decisions_success_prediction_not_its_cost():
    eps = [_episode(1.0, 0, 2), _episode(0.0, 0, 2)]
    eps[0].turns[1] = TurnRecord([1] * 9, [0.0] * 9, "x", NoiseKey(1, 0))  # a dearer decision
    p_hat = np.array([0.5, 0.1, 0.9, 0.3])  # four decisions of one group, four predictions
    config = TwiceConfig(branching="mixed", beta=0.2, q_min=0.0)
    plan = twice.plan_branches(eps, config, None, np.random.default_rng(0), update=99, success=p_hat)
    score = 2 * p_hat * (1 - p_hat)
    assert np.all(plan.q < 1)
    np.testing.assert_allclose(plan.q / plan.q[0], score / score[0], rtol=1e-9)
    with pytest.raises(ValueError, match="p_hat"):
        twice.plan_branches(eps, config, None, np.random.default_rng(0), update=99)


def test_within_decision_rho_centres_each_decision_on_its_own_means():
    # decision 0: (1,1),(0,0); decision 1: (1,0),(1,1),(0,0); decision 2 has one pair; one pair not kept.
    # centred: d0 (.5,.5),(-.5,-.5); d1 u (1/3,1/3,-2/3), v (-1/3,2/3,-1/3)
    # sum c c' = 1/2 + 1/3, sum c^2 = 1/2 + 2/3 on each side -> rho-bar = (5/6) / (7/6)
    pairs = [(0, 1, 1, 0, True), (0, 0, 0, 0, True), (1, 1, 0, 0, True), (1, 1, 1, 1, True), (1, 0, 0, 0, True),
             (2, 1, 0, 0, True), (1, 0, 1, 0, False)]
    assert twice.within_decision_rho(pairs) == pytest.approx(5 / 7)
    # between-state correlation: the pooled Pearson is high, the within-decision one is not
    # (every combination within a decision: no correlation there; the states differ a lot)
    between = [(r, base + a, base + b, 0, True) for r, base in ((0, 2.0), (1, -2.0)) for a in (0, 1) for b in (0, 1)]
    assert twice.pair_correlation([(u, v) for _, u, v, _, _ in between]) > 0.8
    assert twice.within_decision_rho(between) == pytest.approx(0.0, abs=1e-12)
    assert np.isnan(twice.within_decision_rho([(0, 1, 1, 0, True), (0, 0, 1, 0, True)]))  # U' constant
    assert np.isnan(twice.within_decision_rho([(0, 1, 0, 0, True)]))


def test_twin_term_is_measured_over_branched_decisions():
    plan = BranchPlan([(0, t) for t in range(5)], np.ones(5), np.zeros(5), np.full(5, 0.5),
                      np.array([True, True, False, True, True]))
    credit = twice.TwinCredit(np.array([2.0, -8.0, 0.0, 0.0, 4.0]), np.zeros(5))
    stats = twice.twin_stats(credit, plan, [], omega=0.5, scale=0.25)
    term = np.array([4.0, 16.0, 0.0, 8.0])  # |0.5 A_hat / 0.25| of the four branched decisions
    assert stats["twin_term_max"] == 16.0 and stats["sigma_hat"] == 0.25
    assert stats["twin_term_q50"] == pytest.approx(np.quantile(term, 0.5))
    assert stats["twin_term_q90"] == pytest.approx(np.quantile(term, 0.9))


def test_running_scale_comes_from_earlier_updates_only():
    from twice_envs.agents.credit import predictor

    running = TwiceConfig(twin_scale="running")
    util = [0.0, 0.0, 1.0]
    assert twice.twin_scale(util, running) == pytest.approx(twice.sigma_hat(util))  # nothing tracked yet
    state = predictor.track_twin_scale(predictor.PredictorState(), [3.0, -4.0])
    assert state.twin_rms == pytest.approx(np.sqrt(12.5))
    state = predictor.track_twin_scale(state, [1.0])
    assert state.twin_rms == pytest.approx(np.sqrt((0.9 * 25 + 1) / (0.9 * 2 + 1)))
    assert predictor.PredictorState.from_json(state.to_json()).twin_rms == pytest.approx(state.twin_rms)
    assert twice.twin_scale(util, running, state.twin_rms) == pytest.approx(state.twin_rms)
    assert twice.twin_scale(util, running, 0.01) == running.sigma_min
    eps = [_episode(1.0, 0), _episode(0.0, 0)]
    out = twice.combine(eps, [(0, 0), (0, 1), (1, 0), (1, 1)], np.array([0.0, 3.0, 0.0, 0.0]), running, 2.0)
    assert out[0][1] - out[0][0] == pytest.approx(1.5)
    with pytest.raises(ValueError, match="twin_scale"):
        twice.twin_scale(util, TwiceConfig(twin_scale="nope"), 1.0)


def test_coupled_toy_twins_read_the_factual_keys_after_the_branch(toy_batch, coupled_twins, independent_twins):
    _, episodes, _, index, _ = toy_batch
    checked = 0
    for (i, t), tw, ind in zip(index, coupled_twins, independent_twins):
        ep = episodes[i]
        if tw.self_twin:
            continue
        seed = tuple(ep.turns[t].noise_key)[0]
        assert tuple(tw.turns[0].noise_key) == (seed, t, 1, 0, 0)
        later = [tuple(x.noise_key) for x in tw.turns[1:]]
        assert later == [tuple(x.noise_key) for x in ep.turns[t + 1: t + 1 + len(later)]]
        checked += len(later)
        # an independent counterfactual reads other keys after the branch
        assert all(tuple(x.noise_key)[0] != seed for x in ind.turns[1:])
    assert checked > 1000


def test_final_turn_twins_are_never_same_evidence(toy_batch, coupled_twins):
    _, episodes, _, index, _ = toy_batch
    last = [tw for (i, t), tw in zip(index, coupled_twins) if t == len(episodes[i].turns) - 1 and not tw.self_twin]
    earlier = [tw for (i, t), tw in zip(index, coupled_twins) if t < len(episodes[i].turns) - 1 and not tw.self_twin]
    assert len(last) > 100 and not any(tw.same_evidence for tw in last)
    assert any(tw.same_evidence for tw in earlier)  # same lights earlier on are same evidence


def _halves():
    """One episode of two one-token turns, each drawn with probability 1/2: a twin's alternative repeats the
    factual turn with probability 1/2 (a self-twin, costing its one-token alternative turn)."""
    turns = [TurnRecord([7], [np.log(0.5)], "a", NoiseKey(1, t)) for t in range(2)]
    return [EpisodeRecord("E", 0, {}, group=0, turns=turns, utility=1.0)]


def test_self_twins_free_their_budget_and_the_ablation_plans_them_at_full_cost():
    # c = (2, 1), len = (1, 1), p = 1/2: expected costs (1.5, 1) with the shortcut, (2, 1) without;
    # target 0.5 x 2 tokens = 1; eta = 1/2 each: q = lambda sqrt(eta / E), sum q E = 1
    eps, eta = _halves(), np.full(2, 0.5)
    with_cut = TwiceConfig(beta=0.5, q_min=0.0)
    without = replace(with_cut, self_twin_shortcut=False)
    a = twice.plan_branches(eps, with_cut, eta, np.random.default_rng(8), update=99)
    b = twice.plan_branches(eps, without, eta, np.random.default_rng(8), update=99)
    np.testing.assert_allclose(a.unit_costs(with_cut), [1.5, 1.0])
    np.testing.assert_allclose(b.unit_costs(without), [2.0, 1.0])
    lam_a, lam_b = 1 / (np.sqrt(0.75) + np.sqrt(0.5)), 1 / (1 + np.sqrt(0.5))
    np.testing.assert_allclose(a.q, lam_a * np.sqrt(0.5 / np.array([1.5, 1.0])), rtol=1e-9)
    np.testing.assert_allclose(b.q, lam_b * np.sqrt(0.5 / np.array([2.0, 1.0])), rtol=1e-9)
    # the same coin (0.327 for decision 0) branches it with the shortcut (q 0.367) and not without (q 0.293)
    assert a.branched.tolist() == [True, False] and b.branched.tolist() == [False, False]


def test_a_self_twin_is_charged_its_alternative_turn_and_the_others_their_full_cost():
    eps = _halves()
    plan = twice.plan_branches(eps, TwiceConfig(), None, np.random.default_rng(0), update=0)
    plan.branched = np.array([True, True])
    self_twin = EpisodeRecord("E", 0, {}, twin_of=(0, 0), branch=1, self_twin=True)
    other = EpisodeRecord("E", 0, {}, twin_of=(0, 1), branch=1)
    assert twice.accounted_tokens(plan, TwiceConfig()) == 3.0  # no records: c_0 + c_1
    assert twice.accounted_tokens(plan, TwiceConfig(), [self_twin, other]) == 1.0 + 1.0  # len_0 + c_1
    plan.cost_ratio = 2.0  # a twin that is not a self-twin costs 2 c_t; a self-twin still its turn
    assert twice.accounted_tokens(plan, TwiceConfig(), [self_twin, other]) == 1.0 + 2.0


def test_no_self_twin_shortcut_changes_what_is_branched_and_generated_in_the_lab():
    from twice_envs.agents.credit.ablations import apply_ablations
    from twice_envs.agents.lab import toy
    from twice_envs.agents.lab.runner import lab_runners
    from twice_envs.agents.lab.search_toy import search_toy_policy
    from twice_envs.agents.credit.registry import CreditContext, Runners, get_method, run_credit

    policy = search_toy_policy()
    eps, envs = toy.toy_rollouts(policy, 12, 5, noise_seed=4)
    out = {}
    for name, cfg in (("full", TwiceConfig(warmup_updates=0)),
                      ("ablation", apply_ablations(TwiceConfig(warmup_updates=0), ["no-self-twin-shortcut"]))):
        tf, vf = lab_runners(envs)
        res = run_credit(get_method("twice"), eps, CreditContext(policy=policy, rng=np.random.default_rng(1),
                                                                 config=cfg, runners=Runners(twins=tf, values=vf)))
        out[name] = res
    full, abl = out["full"].stats, out["ablation"].stats
    assert full["self_twin_share"] > 0.1 and abl["self_twin_share"] == 0  # identical alternatives are continued
    assert full["branched_share"] > abl["branched_share"]  # the freed budget branches more decisions
    assert full["aux_self_freed"] > 0 and abl["aux_self_freed"] == 0
    assert out["full"].aux_tokens != out["ablation"].aux_tokens


def test_realised_pairs_count_the_kept_twins_of_each_decision():
    """Break: counting the twins the evidence coin dropped gives decision 1 a pair it never realised."""
    credit = twice.TwinCredit(np.zeros(3), np.full(3, np.nan),
                              [(0, 1.0, 1.0, 0, True), (0, 1.0, 0.0, 0, True), (1, 0.0, 1.0, 1, False)])
    assert credit.realised.tolist() == [2, 0, 0]
