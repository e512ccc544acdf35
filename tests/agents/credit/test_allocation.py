"""Twice on grown batches at Twice's budget: tree sampling and prefix-level allocation."""

import numpy as np
import pytest

import twice_envs
from twice_envs.agents.bench.learn import LearnConfig, train_one
from twice_envs.agents.credit import allocation, predictor, tree
from twice_envs.agents.credit.grpo import episode_advantages
from twice_envs.agents.credit.predictor import decision_index
from twice_envs.agents.credit.registry import CreditContext, check_env, factual_group_size, get_method, run_credit
from twice_envs.agents.credit.twice import TwiceConfig, policy_tokens
from twice_envs.agents.lab import toy
from twice_envs.agents.lab.runner import lab_policy, lab_step_fns
from twice_envs.agents.types import EpisodeRecord, TurnRecord


def _episode(group, turns, utility=0.0, tokens=1):
    return EpisodeRecord("CreditToy-v0", 0, {}, group=group, utility=utility,
                         turns=[TurnRecord([t] * tokens, [0.0] * tokens, f"a{t}", (0, t, 0, 0, 0))
                                for t in range(turns)])


def test_a_grown_episode_copies_the_prefix_and_owns_only_its_own_decisions_and_tokens():
    """Break: counting the copied turns as generated doubles the prefix's tokens in the budget."""
    root = _episode(3, 4, utility=1.0, tokens=2)
    cont = EpisodeRecord("CreditToy-v0", 0, {}, group=3, twin_of=(0, 2), utility=0.0,
                         turns=[TurnRecord([9, 9, 9], [0.0] * 3, "b", (5, 2, 1, 0, 0))])
    grown = root.grow(cont)
    assert grown.prefix == 2 and grown.group == 3 and grown.twin_of is None and grown.utility == 0.0
    assert [t.text for t in grown.turns] == ["a0", "a1", "b"]
    assert grown.num_generated_tokens == 3 and policy_tokens([root, grown]) == 8 + 3
    assert decision_index([root, grown]) == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 2)]
    assert EpisodeRecord.from_json(grown.to_json()).prefix == 2
    with pytest.raises(ValueError, match="names its boundary"):
        root.grow(_episode(3, 1))


def test_tree_sampling_draws_each_trees_boundaries_uniformly_and_each_once():
    """Break: drawing t from 1 .. T - 1 never starts a new episode of the prompt (boundary 0)."""
    eps = [_episode(0, 1), _episode(0, 3), _episode(1, 5)]
    seen = {0: set(), 1: set(), 2: set()}
    for s in range(200):
        for i, t in tree.TreeDraws(eps).propose(np.random.default_rng(s)):
            seen[i].add(t)
    assert seen == {0: {0}, 1: {0, 1, 2}, 2: {0, 1, 2, 3, 4}}
    draws = tree.TreeDraws(eps)
    draws.take((1, 2))
    assert all(n != (1, 2) for s in range(50) for n in draws.propose(np.random.default_rng(s)))


def test_allocation_sends_each_tasks_rollouts_to_its_prefixes_with_mixed_predicted_success():
    """Break: weights p_hat instead of p_hat (1 - p_hat) send them to the sure successes."""
    assert allocation.allocation_weights([0.0, 0.5, 1.0], 0.05) == pytest.approx([0.05, 0.30, 0.05])
    eps = [_episode(0, 2), _episode(0, 1), _episode(1, 2), _episode(1, 2)]
    # boundaries in order: (0,0) (0,1) (1,0) (2,0) (2,1) (3,0) (3,1)
    p_hat = np.array([1.0, 0.5, 1.0, 0.0, 1.0, 0.5, 0.0])
    draws = allocation.AllocationDraws(eps, p_hat, 0.0)
    assert sorted(draws.propose(np.random.default_rng(0))) == [(0, 1), (3, 0)]  # one per task, its mixed boundary
    counts = {}
    draws = allocation.AllocationDraws(eps, p_hat, 0.05)
    for s in range(300):
        for n in draws.propose(np.random.default_rng(s)):
            counts[n] = counts.get(n, 0) + 1
    assert counts[(0, 1)] / 300 == pytest.approx(0.30 / 0.40, abs=0.06)  # task 0: 0.30 of 0.05 + 0.30 + 0.05
    with pytest.raises(ValueError, match="one p_hat per boundary"):
        allocation.AllocationDraws(eps, p_hat[:3], 0.0)


@pytest.mark.parametrize("method", ["twice-tree", "twice-alloc"])
def test_the_lab_grows_real_episodes_to_grpos_tokens_and_credits_all_of_them(method):
    """Break: a budget of 1 / share (not 1 / share - 1) x the roots' tokens grows 2.5 chains per root, not 1.5."""
    policy = lab_policy("SearchToy-v0")
    roots, envs = toy.toy_rollouts(policy, 6, factual_group_size(method, 5), noise_seed=11)
    res = run_credit(get_method(method), roots, CreditContext(
        policy=policy, rng=np.random.default_rng(1), update=5, noise_seed=11, runners=lab_step_fns(envs),
        config=TwiceConfig(beta=0.0, q_min=0.0, warmup_updates=0)))
    batch, grown = res.episodes, res.episodes[len(roots):]
    assert batch[:len(roots)] == list(roots) and len(grown) > len(roots) and len(envs) == len(batch)
    for ep, env in zip(grown, envs[len(roots):]):
        parent = next(r for r in roots if r.group == ep.group and [t.text for t in r.turns[:ep.prefix]] ==
                      [t.text for t in ep.turns[:ep.prefix]])
        assert parent is not None
        # the grown record is its env's episode: replaying its actions gives its outcome
        replay = twice_envs.make(policy.env_id, **policy.env_kwargs)
        replay.reset(seed=0, options={"noise_seed": ep.options["noise_seed"]})
        for turn in ep.turns:
            replay.step(turn.text)
        assert replay.unwrapped.trajectory.total_reward == ep.utility == env.unwrapped.trajectory.total_reward
    # the factual batch spends GRPO's tokens: the roots stand for 2 of 5 chains, the grown paths for the rest
    assert res.stats["grown_target"] == pytest.approx(1.5 * policy_tokens(roots))
    assert res.stats["grown_tokens"] == pytest.approx(res.stats["grown_target"], rel=0.2)
    # beta = 0: no twin is branched, and every turn carries GRPO's term over all the task's episodes
    a_traj = episode_advantages([e.utility for e in batch], [e.group for e in batch])
    for i, (ep, adv) in enumerate(zip(batch, res.advantages)):
        assert adv == pytest.approx(np.full(len(ep.turns), a_traj[i]))
    assert res.aux_tokens == res.stats["grown_tokens"] == sum(e.num_generated_tokens for e in grown)
    # with a budget the twins branch the batch's own decisions, grown episodes' included, at beta x its tokens
    res = run_credit(get_method(method), roots, CreditContext(
        policy=policy, rng=np.random.default_rng(2), update=5, noise_seed=12,
        config=TwiceConfig(beta=0.7, warmup_updates=0), runners=lab_step_fns(envs[:len(roots)])))
    assert res.aux_tokens > res.stats["grown_tokens"] and res.stats["aux_target"] == pytest.approx(
        0.7 * policy_tokens(res.episodes))


def test_a_grown_episodes_first_turn_is_not_its_own_twin():
    """Break: drawing the grown turn on branch 1 (the first twin's) makes every twin of it a self-twin."""
    policy = lab_policy("SearchToy-v0")
    roots, envs = toy.toy_rollouts(policy, 30, 2, noise_seed=5)
    fns = lab_step_fns(envs)
    nodes = [(i, 0) for i in range(len(roots))]
    grown = fns.branches(policy, roots, nodes, None, noise_seed=3)
    twins, _ = toy.lab_twins(policy, list(roots) + grown, envs, [(len(roots) + k, 0) for k in range(len(grown))])
    p = np.mean(predictor.self_twin_probability(grown, [(k, 0) for k in range(len(grown))]))
    assert np.mean([t.self_twin for t in twins]) == pytest.approx(p, abs=0.2) and p < 0.8


def test_grown_batches_train_in_the_learning_bench_and_refuse_envs_that_cannot_fork():
    trace = train_one("twice-tree", 0, LearnConfig(updates=3, groups=4))
    assert len(trace.values) == 4 and trace.values[-1] != trace.values[0] and all(a > 0 for a in trace.aux)
    for method in ("twice-tree", "twice-alloc"):
        with pytest.raises(ValueError, match=f"'{method}' forks episodes.*'Unregistered-v0'"):
            check_env(method, "Unregistered-v0")
