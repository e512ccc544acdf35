"""AT2PO: entropy-guided expansion of a tree grown within GRPO's tokens, every turn credited with its node's value."""

import numpy as np
import pytest

from twice_envs.agents.bench import learn as bench_learn
from twice_envs.agents.credit import at2po
from twice_envs.agents.credit.registry import CreditContext, Runners, factual_group_size, get_method, run_credit
from twice_envs.agents.credit.tree import Forest
from twice_envs.agents.lab import toy
from twice_envs.agents.lab.runner import lab_policy, lab_step_fns
from twice_envs.agents.types import EpisodeRecord, TurnRecord
from twice_envs.keys import NoiseKey


def _episode(utility, group, entropies, env_id="CreditToy-v0"):
    """One one-token turn per entropy (its log-prob is minus the entropy)."""
    return EpisodeRecord(env_id, 0, {}, group=group, utility=utility,
                         turns=[TurnRecord([1], [-h], "a", NoiseKey(0, t)) for t, h in enumerate(entropies)])


def _grow(chain, i, t, utility, entropies):
    cont = EpisodeRecord(chain.env_id, 0, {}, group=chain.group, twin_of=(i, t), utility=utility,
                         turns=[TurnRecord([1], [-h], "b", NoiseKey(1, t + k)) for k, h in enumerate(entropies)])
    return chain.grow(cont)


def _forest():
    """Roots A (U 1, entropies 1, 2, 0.5) and B (U 0; 1.5, 3) of one task, and C grown from A's turn 1 (U 0)."""
    a, b = _episode(1.0, 0, [1.0, 2.0, 0.5]), _episode(0.0, 0, [1.5, 3.0])
    forest = Forest.of_roots([a, b])
    forest.add([_grow(a, 0, 1, 0.0, [1.0, 1.0])], [(0, 1)])
    return forest


def test_a_nodes_score_is_its_entropy_less_a_penalty_per_branch_already_at_its_state():
    """Break: counting the branches of the node's own state (after its turn) leaves A1's score at 2.0."""
    forest = _forest()
    assert at2po.candidates(forest) == [(0, 0), (0, 1), (1, 0), (2, 1)]  # C's turn 0 is A's node
    s = at2po.scores(forest, at2po.candidates(forest), alpha=0.5)
    # A0 and B0 are two branches at the prompt; A1 and C1 two at the state after A's first turn
    assert s == pytest.approx({(0, 0): 0.5, (0, 1): 1.5, (1, 0): 1.0, (2, 1): 0.5})
    assert at2po.top_k(forest, 1, alpha=0.5) == [(0, 1)]
    assert at2po.top_k(forest, 2, alpha=0.5) == [(0, 1), (1, 0)]  # then in score order


def test_node_values_bootstrap_from_entropy_weighted_children_of_tree_normalised_leaves():
    """Break: hanging C's turn 1 under the state after its own turn 1 leaves V(A0) at V(A1) = 1.414."""
    forest = _forest()
    z = 1 / (np.sqrt(2 / 9) + 1e-6)  # leaves U = 1, 0, 0: mean 1/3
    hi, lo = 2 / 3 * z, -1 / 3 * z
    v = at2po.node_values(forest, "entropy")
    assert v[(0, 2)] == pytest.approx(hi) and v[(0, 1)] == pytest.approx(hi) and v[(2, 1)] == pytest.approx(lo)
    assert v[(0, 0)] == pytest.approx(2 / 3 * hi + 1 / 3 * lo)  # children A1 (H 2) and C1 (H 1): weights 2/3, 1/3
    assert v[(1, 0)] == pytest.approx(lo)
    assert at2po.node_values(forest, "mean")[(0, 0)] == pytest.approx((hi + lo) / 2)
    w = np.exp([2.0, 1.0]) / np.exp([2.0, 1.0]).sum()
    assert at2po.node_values(forest, "entropy_softmax")[(0, 0)] == pytest.approx(w @ [hi, lo])
    # every turn of every path gets its node's value: C's copied turn 0 is A's node
    assert at2po.node_of(forest, 2, 0) == (0, 0) and at2po.node_of(forest, 2, 1) == (2, 1)


class _Branches:
    """A branches runner whose grown path takes two one-token turns of entropy 1 with utility ``u``."""

    def __init__(self, u=0.0):
        self.u, self.calls = u, []

    def __call__(self, policy, factual, nodes, sampling, *, noise_seed):
        self.calls.append(list(nodes))
        return [_grow(factual[i], i, t, self.u, [1.0, 1.0]) for i, t in nodes]


def test_the_step_grows_within_grpos_tokens_and_trains_every_path():
    """Break: ending the growth after its first iteration leaves 2 of the 3.3 tokens generated."""
    roots = [_episode(1.0, 0, [1.0, 2.0, 0.5]), _episode(0.0, 0, [1.5, 3.0])]  # 5 tokens: budget 5 (1/0.6 - 1)
    runner = _Branches()
    ctx = CreditContext(rng=np.random.default_rng(0), runners=Runners(branches=runner))
    res = at2po.at2po_step(roots, ctx, config=at2po.AT2POConfig(k=1), share=0.6)
    assert res.stats["aux_target"] == pytest.approx(5 / 0.6 - 5)
    assert runner.calls[0] == [(0, 1)]  # the highest entropy first
    assert res.stats["aux_generated"] == 2 * res.stats["expansions"] >= 4  # rounds until 3.3 tokens were generated
    assert res.episodes[:2] == roots and [len(a) for a in res.advantages] == [len(e.turns) for e in res.episodes]
    assert res.aux_tokens == res.stats["aux_generated"]


def test_a_fixed_iteration_count_over_the_budget_is_refused_naming_the_largest_k():
    """Break: not multiplying by k accepts k = 2 (2.3 planned tokens per k and iteration, budget 3.3)."""
    roots = [_episode(1.0, 0, [1.0, 2.0, 0.5]), _episode(0.0, 0, [1.5, 3.0])]
    ctx = CreditContext(rng=np.random.default_rng(0), runners=Runners(branches=_Branches()))
    with pytest.raises(ValueError, match=r"at2po: k 2 over 1 iterations plans about 5 .* budget of 3 .* largest k "
                                         r"that fits is 1"):
        at2po.at2po_step(roots, ctx, config=at2po.AT2POConfig(k=2, iterations=1), share=0.6)
    res = at2po.at2po_step(roots, ctx, config=at2po.AT2POConfig(k=1, iterations=1), share=0.6)
    assert res.stats["expansions"] == 1 and res.stats["at2po_iterations"] == 1
    with pytest.raises(ValueError, match="at2po aggregate must be one of"):
        at2po.AT2POConfig(aggregate="max")


def test_an_env_that_cannot_fork_is_refused_before_any_rollout():
    """Break: checking forks after the runner is called records a call."""
    runner = _Branches()
    eps = [_episode(1.0, 0, [1.0] * 3, env_id="Stub-v0"), _episode(0.0, 0, [1.0] * 3, env_id="Stub-v0")]
    with pytest.raises(ValueError, match=r"at2po forks.*Stub-v0 cannot fork"):
        get_method("at2po")(eps, CreditContext(runners=Runners(branches=runner)))
    assert runner.calls == []


def test_registered_on_the_lab_runners_and_joins_bench_learn():
    """Break: registering without benches=("learn",) drops it from the bench's default methods."""
    m = get_method("at2po")
    assert m.display == "AT2PO" and m.needs == {"branches"} and m.config is at2po.AT2POConfig and m.roots == 0.6
    assert "at2po" in bench_learn.LearnConfig().methods
    policy = lab_policy("SearchToy-v0")
    eps, envs = toy.toy_rollouts(policy, 8, factual_group_size("at2po", 5), noise_seed=3)
    res = run_credit(get_method("at2po"), eps, CreditContext(policy=policy, rng=np.random.default_rng(1), update=0,
                                                             noise_seed=5, runners=lab_step_fns(envs)))
    assert res.stats["expansions"] > 0 and res.aux_tokens > 0 and res.stats["at2po_iterations"] >= 2
    assert all(len(a) == len(ep.turns) and np.all(np.isfinite(a)) for a, ep in zip(res.advantages, res.episodes))
    total = sum(e.num_generated_tokens for e in eps) + res.aux_tokens
    assert total / (sum(e.num_generated_tokens for e in eps) / 0.6) == pytest.approx(1.0, abs=0.15)
