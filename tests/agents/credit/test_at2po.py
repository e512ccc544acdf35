"""AT2PO: entropy-guided node choice with its penalty, tree values, turn advantages, budget, forks."""

import numpy as np
import pytest

from twice_envs.agents.bench import learn as bench_learn
from twice_envs.agents.credit import at2po
from twice_envs.agents.credit.registry import CreditContext, get_method
from twice_envs.agents.credit.twice import TwiceConfig
from twice_envs.agents.lab import toy
from twice_envs.agents.lab.runner import lab_policy, lab_runners
from twice_envs.agents.rollout.twins import Twins, credit_step
from twice_envs.agents.types import EpisodeRecord, TurnRecord


def _episode(utility, group, logprobs, env_id="CreditToy-v0"):
    """One token per turn; turn t's log-prob is ``logprobs[t]`` (its entropy estimate is ``-logprobs[t]``)."""
    return EpisodeRecord(env_id, 0, {}, group=group, utility=utility,
                         turns=[TurnRecord([1], [lp], "a", (0, t, 0, 0, 0)) for t, lp in enumerate(logprobs)])


def _sibling(i, t, utility, lp=-1.0):
    return EpisodeRecord("CreditToy-v0", 0, {}, utility=utility, twin_of=(i, t), branch=1, coupled=False,
                         turns=[TurnRecord([1], [lp], "b", (0, t, 1, 0, 0))])


def _batch():
    # group 0: entropies of the non-leaf turns (0, 1) = 2.0, (0, 2) = 0.5, (1, 1) = 1.0; turns 0 and the leaves
    # have larger ones and are never candidates
    return [_episode(1.0, 0, [-9.0, -2.0, -0.5, -8.0]), _episode(0.0, 0, [-9.0, -1.0, -7.0])]


def test_entropy_choice_takes_the_top_k_non_leaf_turns_and_the_penalty_changes_the_second_pick():
    """Break: dropping ``- alpha m`` from the score re-picks (0, 1) in the second iteration."""
    eps = [_episode(1.0, 0, [-9.0, -1.0, -0.98, -9.0])]  # H(0, 1) = 1.0, H(0, 2) = 0.98
    rng = np.random.default_rng(0)
    assert at2po.candidate_nodes(eps) == [(0, 1), (0, 2)]
    counts, st = at2po.plan_expansions(eps, 1, 1, 0.05, 1e9, rng, iterations=2)
    assert counts == {(0, 1): 1, (0, 2): 1} and st["at2po_iterations"] == 2  # 1.0 - 0.05 < 0.98
    assert at2po.plan_expansions(eps, 1, 1, 0.0, 1e9, rng, iterations=2)[0] == {(0, 1): 2}
    assert at2po.plan_expansions(eps, 1, 1, 0.01, 1e9, rng, iterations=2)[0] == {(0, 1): 2}  # 0.99 > 0.98
    # top k per tree: each group gets its own k picks
    two = [_episode(1.0, 0, [0.0, -3.0, -2.0, 0.0]), _episode(0.0, 1, [0.0, -0.1, -0.2, 0.0])]
    counts, st = at2po.plan_expansions(two, 1, 1, 0.05, 1e9, rng, iterations=1)
    assert counts == {(0, 1): 1, (1, 2): 1} and st["aux_accounted"] == 3 + 2


def test_node_values_bootstrap_from_the_children_of_tree_normalised_leaves():
    """Break: averaging all descendant leaves (leaf mean) gives V(0, 0) = 0.15 z, not 0.7 z / 3."""
    eps = [_episode(1.0, 0, [-1.0] * 3), _episode(0.0, 0, [-1.0] * 2),
           _episode(1.0, 1, [-1.0]), _episode(1.0, 1, [-1.0])]
    raw = {(0, 1): [1.0, 1.0], (0, 2): [0.0]}  # siblings at s_1 and s_2 of episode 0
    leaf, sib = at2po.normalised_leaves(eps, raw)
    z = 1 / (np.sqrt(0.24) + 1e-6)  # tree 0's leaves 1, 0, 1, 1, 0: mean 0.6, std sqrt(0.24); tree 1 all ties
    assert leaf == pytest.approx([0.4 * z, -0.6 * z, 0.0, 0.0])
    assert sib[(0, 1)] == pytest.approx([0.4 * z, 0.4 * z]) and sib[(0, 2)] == pytest.approx([-0.6 * z])
    v = at2po.turn_values(eps, leaf, sib)
    # V(0, 2) = leaf; V(0, 1) = mean(V(0, 2), sib at s_2); V(0, 0) = mean(V(0, 1), sibs at s_1)
    assert v[0] == pytest.approx([(-0.1 + 0.4 + 0.4) / 3 * z, (0.4 - 0.6) / 2 * z, 0.4 * z])
    assert v[1] == pytest.approx([-0.6 * z, -0.6 * z]) and v[2] == pytest.approx([0.0])
    # advantage = value; against the parent, turn 0's parent is the root (mean of the tree's turn-0 values)
    assert at2po.turn_advantages(eps, v, "value")[0] == pytest.approx(v[0])
    d = at2po.turn_advantages(eps, v, "diff_parent")
    root = (0.7 / 3 - 0.6) / 2 * z
    assert d[0] == pytest.approx([0.7 / 3 * z - root, -0.1 * z - 0.7 / 3 * z, 0.5 * z])
    assert d[1] == pytest.approx([-0.6 * z - root, 0.0])
    # the released script's aggregate: children weighted by the softmax of their turns' entropies
    w = np.exp([1.0, 3.0]) / np.exp([1.0, 3.0]).sum()
    vs = at2po.turn_values(eps[:1], [1.0], {(0, 2): [0.0]}, "entropy_softmax", {(0, 2): [3.0]})
    assert vs[0][1] == pytest.approx(w[0] * 1.0)


class _Stub:
    """A values runner: sibling j of node (i, t) has utility ``u[j - 1]``."""

    def __init__(self, u):
        self.u, self.calls = u, []

    def __call__(self, policy, factual, sampling, *, k, noise_seed, states):
        self.calls.append((list(states), k))
        recs = [_sibling(i, t, self.u[j - 1]) for i, t in states for j in range(1, k + 1)]
        return Twins(recs, [True] * len(recs), len(recs))


def _ctx(stub, beta):
    return CreditContext(run_values=stub, twice=TwiceConfig(beta=beta), rng=np.random.default_rng(0))


def test_each_turn_gets_its_node_value_under_the_budget_chosen_expansions():
    """Break: hanging the siblings of s_t under node t (not t - 1) gives V(0, 1) = 1/3 instead of 1."""
    eps = _batch()  # 7 policy tokens; node costs (0, 1): 3, (0, 2): 2, (1, 1): 2
    stub = _Stub([0.0, 1.0])
    res = at2po.at2po_step(eps, _ctx(stub, beta=6 / 7), config=at2po.AT2POConfig(k=1))  # budget 6: (0, 1) twice
    assert stub.calls == [([(0, 1)], 2)] and res.aux_tokens == 2
    assert res.stats["expansions"] == 2 and res.stats["aux_accounted"] == 6.0
    # leaves 1, 0 and siblings 0, 1: mean 0.5, std 0.5 -> U~ = +-1
    one = 1 / (1 + 2e-6)
    assert res.advantages[0] == pytest.approx([one / 3, one, one, one])
    assert res.advantages[1] == pytest.approx([-one] * 3)
    # a penalty of 1.5 moves the second expansion to (1, 1) (2.0 - 1.5 < 1.0): one sibling each, its own run
    stub = _Stub([0.0])
    res = at2po.at2po_step(eps, _ctx(stub, beta=5 / 7), config=at2po.AT2POConfig(k=1, alpha=1.5))
    assert stub.calls == [([(0, 1), (1, 1)], 1)]
    z = 1 / (np.sqrt(0.1875) + 1e-6)  # leaves 1, 0, 0, 0: mean 0.25
    assert res.advantages[0] == pytest.approx([(0.75 - 0.25) / 2 * z, 0.75 * z, 0.75 * z, 0.75 * z])
    assert res.advantages[1] == pytest.approx([-0.25 * z] * 3)


def test_budget_is_met_in_expectation_and_a_fixed_iteration_count_over_it_is_refused():
    """Break: keeping the crossing expansion without its coin overshoots the budget on every batch."""
    eps = _batch()
    with pytest.raises(ValueError, match=r"at2po: k 2 x width 1 over 2 iterations plans 10 .* budget of 7 .* "
                                         r"largest k that fits is 1"):
        at2po.choose_expansions(eps, at2po.AT2POConfig(k=2, iterations=2, beta=1.0), np.random.default_rng(0), "at2po")
    counts, st = at2po.choose_expansions(eps, at2po.AT2POConfig(k=1, iterations=2, beta=1.0),
                                         np.random.default_rng(0), "at2po")
    assert counts == {(0, 1): 2} and st["aux_accounted"] == 6.0
    assert at2po.choose_expansions(eps, at2po.AT2POConfig(beta=0.0), np.random.default_rng(0), "x")[0] == {}
    policy = lab_policy("SearchToy-v0")
    batch, _ = toy.toy_rollouts(policy, 8, 5, noise_seed=3)
    cfg = at2po.AT2POConfig(beta=0.7)
    plans = [at2po.choose_expansions(batch, cfg, np.random.default_rng(s), "x")[1] for s in range(300)]
    target = plans[0]["aux_target"]
    top = max(batch[i].remaining_tokens(t) for i, t in at2po.candidate_nodes(batch))
    assert all(p["aux_accounted"] <= target + top for p in plans)
    assert any(p["aux_accounted"] < target for p in plans) and any(p["aux_accounted"] > target for p in plans)
    assert np.mean([p["aux_accounted"] for p in plans]) / target == pytest.approx(1, abs=0.03)


def test_an_env_that_cannot_fork_is_refused_before_any_rollout():
    """Break: checking forks after the runner is called records a call."""
    stub = _Stub([0.0])
    eps = [_episode(1.0, 0, [-1.0] * 3, env_id="Stub-v0"), _episode(0.0, 0, [-1.0] * 3, env_id="Stub-v0")]
    with pytest.raises(ValueError, match=r"at2po forks.*Stub-v0 cannot fork"):
        get_method("at2po")(eps, _ctx(stub, 1.0))
    assert stub.calls == []


def test_registered_on_the_lab_runners_and_joins_bench_learn():
    """Break: registering without benches=("learn",) drops it from the bench's default methods."""
    m = get_method("at2po")
    assert m.display == "AT2PO (our reading)" and m.needs == {"value_rollouts"} and m.config is at2po.AT2POConfig
    assert "at2po" in bench_learn.LearnConfig().methods
    policy = lab_policy("SearchToy-v0")
    eps, envs = toy.toy_rollouts(policy, 8, 5, noise_seed=3)
    tf, vf = lab_runners(envs)
    res = credit_step("at2po", policy, eps, config=TwiceConfig(beta=0.7), sampling=None, rng=np.random.default_rng(1),
                      update=0, noise_seed=5, twins_fn=tf, values_fn=vf)
    assert res.stats["siblings"] == res.stats["expansions"] > 0 and res.aux_tokens > 0
    assert all(len(a) == len(ep.turns) and np.all(np.isfinite(a)) for a, ep in zip(res.advantages, eps))
