"""Tree-GRPO and Tree-GRPO with coupled siblings: trees grown within GRPO's tokens, every leaf trained on."""

import numpy as np
import pytest

from twice_envs.agents.bench import learn as bench_learn
from twice_envs.agents.credit import tree
from twice_envs.agents.credit.registry import CreditContext, Runners, factual_group_size, get_method, run_credit
from twice_envs.agents.lab import toy
from twice_envs.agents.lab.runner import lab_policy, lab_step_fns
from twice_envs.agents.types import EpisodeRecord, TurnRecord
from twice_envs.keys import NoiseKey


def _episode(utility, group, turns, env_id="CreditToy-v0", tokens=1):
    return EpisodeRecord(env_id, 0, {}, group=group, utility=utility,
                         turns=[TurnRecord([1] * tokens, [0.0] * tokens, "a", NoiseKey(0, t)) for t in range(turns)])


class _Branches:
    """A branches runner: the path grown from ``(i, t)`` takes ``extra`` more one-token turns from ``t`` on."""

    def __init__(self, extra=2, utility=1.0):
        self.extra, self.utility, self.calls = extra, utility, []

    def __call__(self, policy, factual, nodes, sampling, *, noise_seed):
        self.calls.append((list(nodes), noise_seed))
        out = []
        for i, t in nodes:
            cont = EpisodeRecord(factual[i].env_id, 0, {}, group=factual[i].group, twin_of=(i, t), utility=self.utility,
                                 turns=[TurnRecord([1], [0.0], "b", NoiseKey(1, u)) for u in range(self.extra)])
            out.append(factual[i].grow(cont))
        return out


def test_every_leaf_gets_its_outcome_normalised_in_its_tree_and_in_its_task():
    """Break: the inter-tree term alone gives leaf 0 0.577, not 1 + 0.577."""
    eps = [_episode(1.0, 0, 2), _episode(0.0, 0, 3), _episode(1.0, 0, 1), _episode(1.0, 0, 2)]
    adv = tree.tree_advantages(eps, [0, 0, 1, 1])
    intra = np.array([1.0, -1.0, 0.0, 0.0]) * 0.5 / (0.5 + 1e-6)
    inter = (np.array([1.0, 0.0, 1.0, 1.0]) - 0.75) / (np.sqrt(0.1875) + 1e-6)
    for a, ep, x in zip(adv, eps, intra + inter):
        assert a == pytest.approx([x] * len(ep.turns))


def test_a_width_over_grpos_tokens_is_refused_naming_the_largest_that_fits():
    """Break: checking the width against the budget without the mean cost per expansion lets width 4 through."""
    roots = [_episode(1.0, 0, 3), _episode(0.0, 0, 3)]  # 6 tokens; a root at share 0.4 stands for 2.5 chains
    budget = tree.expansion_budget(roots, 0.4)
    assert budget == pytest.approx(9.0)
    ctx = CreditContext(rng=np.random.default_rng(0), runners=Runners(branches=_Branches()))
    # boundaries 0, 1, 2 cost 3, 2, 1 tokens: 2 on average per expansion, 4 per round of both trees
    with pytest.raises(ValueError, match=r"tree-grpo: width 4 .* plans about 12 .* budget of 9 .* largest width that "
                                         r"fits is 3"):
        tree.grow_trees(roots, ctx, tree.TreeConfig(width=4), budget, "tree-grpo")
    forest, st = tree.grow_trees(roots, ctx, tree.TreeConfig(width=3), budget, "tree-grpo")
    assert st["expansions"] == 4 and st["tree_rounds"] == 2 and len(forest.episodes) == 6
    # each tree expands distinct nodes of its root chain: a node at most once per tree
    for i in (0, 1):
        assert len({s for s, k in zip(forest.source, forest.tree) if k == i and s is not None}) == 2
    with pytest.raises(ValueError, match="tree depth must be None or an integer >= 0"):
        tree.TreeConfig(depth=-1)


def test_rounds_grow_until_the_generated_tokens_reach_grpos_budget():
    """Break: stopping on the planned tokens (3 + 2 at boundaries 0 and 1) ends after one round with 4 generated."""
    roots = [_episode(1.0, 0, 3), _episode(0.0, 1, 3)]
    runner = _Branches(extra=2)  # every expansion generates 2 tokens, whatever its boundary
    ctx = CreditContext(rng=np.random.default_rng(0), runners=Runners(branches=runner))
    forest, st = tree.grow_trees(roots, ctx, tree.TreeConfig(), 9.0, "tree-grpo")
    assert st["aux_generated"] >= 9 - 3 and st["aux_generated"] == 2 * st["expansions"]
    assert len(runner.calls) == st["tree_rounds"] >= 2
    assert len({seed for _, seed in runner.calls}) == len(runner.calls)  # each round on its own seeds
    # the leaves are the training batch: roots first, then the grown paths, each in its root's tree and group
    assert forest.episodes[:2] == roots and all(forest.episodes[k].group == forest.tree[k] for k in range(6))


def test_the_step_trains_on_every_leaf_and_reports_the_paths_as_its_tokens():
    """Break: returning the roots only (episodes=None) leaves the grown leaves untrained."""
    roots = [_episode(1.0, 0, 3), _episode(0.0, 0, 3)]
    runner = _Branches(extra=1, utility=0.5)
    ctx = CreditContext(rng=np.random.default_rng(1), runners=Runners(branches=runner))
    res = tree.tree_step(roots, ctx, method="tree-grpo", coupled=False, share=0.4)
    assert res.episodes[:2] == roots and len(res.episodes) > 2
    assert [len(a) for a in res.advantages] == [len(ep.turns) for ep in res.episodes]
    assert res.aux_tokens == sum(ep.num_generated_tokens for ep in res.episodes[2:])
    assert all(ep.prefix == src[1] for ep, src in zip(res.episodes[2:], [n for c, _ in runner.calls for n in c]))


def test_tree_methods_sample_fewer_roots_and_refuse_an_env_that_cannot_fork():
    """Break: registering without roots samples all G episodes as roots (5, not 2 and 3)."""
    assert factual_group_size("tree-grpo", 5) == 2 and factual_group_size("tree-grpo-coupled", 5) == 2
    assert factual_group_size("at2po", 5) == 3 and factual_group_size("grpo", 5) == 5
    calls = []
    record = lambda *a, **k: calls.append(a)  # noqa: E731
    ctx = CreditContext(runners=Runners(branches=record, twins=record))
    eps = [_episode(1.0, 0, 3, env_id="Stub-v0"), _episode(0.0, 0, 3, env_id="Stub-v0")]
    for name in ("tree-grpo", "tree-grpo-coupled"):
        with pytest.raises(ValueError, match=rf"{name} forks.*Stub-v0 cannot fork"):
            get_method(name)(eps, ctx)
    assert calls == []


def _run(method, env="SearchToy-v0", groups=8, seed=3):
    policy = lab_policy(env)
    eps, envs = toy.toy_rollouts(policy, groups, factual_group_size(method, 5), noise_seed=seed)
    res = run_credit(get_method(method), eps, CreditContext(policy=policy, rng=np.random.default_rng(1), update=0,
                                                            noise_seed=5, runners=lab_step_fns(envs)))
    return policy, eps, res


@pytest.mark.parametrize("method", ["tree-grpo", "tree-grpo-coupled"])
def test_the_lab_grows_real_trees_at_grpos_tokens(method):
    """Break: a budget of the roots' tokens x 1 / share (not 1 / share - 1) doubles the expansions."""
    policy, roots, res = _run(method)
    st = res.stats
    assert len(res.episodes) == len(roots) + st["expansions"] and st["expansions"] > len(roots)
    assert st["aux_target"] == pytest.approx(1.5 * sum(e.num_generated_tokens for e in roots))
    # generated tokens: GRPO's five chains' worth per task (the roots stand for 2 of them), within a round's error
    total = sum(e.num_generated_tokens for e in roots) + res.aux_tokens
    assert total / (2.5 * sum(e.num_generated_tokens for e in roots)) == pytest.approx(1.0, abs=0.15)


def test_coupled_siblings_continue_on_their_chains_noise_and_self_siblings_copy_the_chain():
    """Break: coupled=False in sibling_config gives the siblings fresh downstream keys."""
    policy = toy.toy_policy()
    roots, envs = toy.toy_rollouts(policy, 30, 2, noise_seed=9)
    nodes = [(i, 1) for i, ep in enumerate(roots) if len(ep.turns) > 2]
    fns = lab_step_fns(envs)
    ctx = CreditContext(policy=policy, rng=np.random.default_rng(0), noise_seed=2, runners=Runners(twins=fns.twins))
    leaves, aux, selves = tree.grow(ctx, roots, nodes, 0, coupled=True)
    assert aux > 0 and any(selves) and not all(selves)
    continued = []
    for (i, t), leaf, s in zip(nodes, leaves, selves):
        assert leaf.turns[:t] == roots[i].turns[:t] and leaf.prefix == t
        if s:
            assert leaf.turns[t + 1:] == roots[i].turns[t + 1:] and leaf.utility == roots[i].utility
        elif len(leaf.turns) > t + 1 and len(roots[i].turns) > t + 1:
            continued.append(leaf.turns[t + 1].noise_key == roots[i].turns[t + 1].noise_key)
    assert continued and all(continued)


def test_both_methods_join_bench_learn_and_train_at_a_tiny_size():
    """Break: registering without benches=("learn",) drops them from the bench's default methods."""
    assert {"tree-grpo", "tree-grpo-coupled"} <= set(bench_learn.LearnConfig().methods)
    assert get_method("tree-grpo").needs == {"branches"} and get_method("tree-grpo-coupled").needs == {"twins"}
    cfg = bench_learn.LearnConfig(methods=("grpo", "tree-grpo", "tree-grpo-coupled"), seeds=2, updates=3, groups=4,
                                  lr_grid=())
    res = bench_learn.run_learn(cfg)
    for m in ("tree-grpo", "tree-grpo-coupled"):
        r = res["methods"][m]
        assert len(r["curve"]) == 4 and np.isfinite(r["final"]["value"])
        assert r["aux_per_policy"] > 1.0  # the grown paths outweigh the two roots per task


def test_the_last_round_counts_nodes_at_what_earlier_rounds_generated_per_planned_token():
    """Break: counting the last round at planned costs (3 of the 8 tokens a path generates) overshoots by a third."""
    roots = [_episode(1.0, 0, 4), _episode(0.0, 1, 4)]  # boundaries 0..3 plan 4, 3, 2, 1 tokens
    spent = []
    for s in range(200):
        ctx = CreditContext(rng=np.random.default_rng(s), runners=Runners(branches=_Branches(extra=8)))
        spent.append(tree.grow_trees(roots, ctx, tree.TreeConfig(), 20.0, "tree-grpo")[1]["aux_generated"])
    assert np.mean(spent) == pytest.approx(20.0, rel=0.1)
