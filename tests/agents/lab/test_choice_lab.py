"""ChoiceLab's lab policy: exact values by hand and by enumeration, its gradient, its coupling knob, its size
guard, and sampling through the lab's machinery."""

import argparse
import itertools
from dataclasses import replace

import numpy as np
import pytest

from twice_envs.agents.bench import learn as bench_learn
from twice_envs.agents.lab import cli, policies, toy
from twice_envs.agents.lab.choice_lab import (
    ChoiceLabSetting,
    choice_lab_policy,
    choice_setting_from_args,
    coupling_rho,
)
from twice_envs.agents.types import EpisodeRecord, TurnRecord
from twice_envs.envs.choicelab.env import ChoiceLabConfig, world

#: One task of two choices between two items of one attribute word each; with world seed 3 the right item of
#: both choices is the one described by attribute 1 (checked below).
HAND = ChoiceLabConfig(tasks=1, horizon=2, options=2, attributes=2, per_option=1, seed=3)
SMALL = ChoiceLabConfig(tasks=2, horizon=3, options=3, attributes=4, per_option=2, seed=5)


def test_exact_values_by_hand():
    w = world(HAND)
    assert w.attrs[0, :, :, 0].tolist() == [[0, 1], [1, 0]] and w.right[0].tolist() == [1, 0]
    # weight ln 3 on attribute 1: the right item has probability 3/4 at each choice
    policy = choice_lab_policy(ChoiceLabSetting(world=HAND)).with_logits(np.array([0.0, np.log(3)]))
    assert policy.value == pytest.approx(0.75)  # (3/4 + 3/4) / 2
    item = HAND.item
    # right first: 1/2 now and 3/4 x 1/2 later = 7/8 against V(s0) = 3/4; wrong first: 3/8
    assert policy.episode_advantages([item(0, 0, 1), item(0, 1, 0)]) == pytest.approx([1 / 8, 1 / 8])
    assert policy.episode_advantages([item(0, 0, 0), item(0, 1, 1)]) == pytest.approx([-3 / 8, -3 / 8])
    assert policy.episode_values([item(0, 0, 0), item(0, 1, 1)]) == pytest.approx([3 / 4, 3 / 8])
    assert policy.episode_values([item(0, 0, 1), item(0, 1, 1)]) == pytest.approx([3 / 4, 1 / 2 + 3 / 8])


def _enumerate(policy, task):
    """Every action sequence of ``task`` with its probability and utility, by brute force."""
    c, s = policy.config, policy.setting
    out = []
    for opts in itertools.product(range(c.options), repeat=c.horizon):
        prob = 1.0
        for t, o in enumerate(opts):
            z = world(c).features[task, t] @ policy.weights / s.temperature
            p = np.exp(z - z.max())
            prob *= p[o] / p.sum()
        util = np.mean([o == world(c).right[task, t] for t, o in enumerate(opts)])
        out.append(([c.item(task, t, o) for t, o in enumerate(opts)], prob, util))
    return out


def test_exact_values_match_enumeration():
    setting = ChoiceLabSetting(world=SMALL, temperature=0.7)
    policy = choice_lab_policy(setting).with_logits(np.random.default_rng(0).normal(size=4))
    V0 = []
    for task in range(SMALL.tasks):
        seqs = _enumerate(policy, task)
        v = sum(p * u for _, p, u in seqs)
        V0.append(v)
        def cond(prefix):
            sel = [(p, u) for s, p, u in seqs if s[:len(prefix)] == prefix]
            return sum(p * u for p, u in sel) / sum(p for p, _ in sel)

        for items, _, _ in seqs[::4]:
            # V(s_t) = E[U | the prefix before a_t] and A*(s_t, a_t) = E[U | the prefix through a_t] - V(s_t)
            assert policy.episode_values(items)[0] == pytest.approx(v)
            assert policy.episode_values(items) == pytest.approx([cond(items[:t]) for t in range(SMALL.horizon)])
            assert policy.episode_advantages(items) == pytest.approx(
                [cond(items[:t + 1]) - cond(items[:t]) for t in range(SMALL.horizon)])
    assert policy.value == pytest.approx(np.mean(V0))  # the uniform task distribution


def _episode(policy, task, items):
    ep = EpisodeRecord("ChoiceLab-v0", 0, {"task": task})
    ep.turns = [TurnRecord([0], [0.0], policy.action_text(i), None, "", 0.0, "") for i in items]
    return ep


def test_policy_gradient_is_the_score_function_and_its_mean_the_gradient_of_the_exact_value():
    setting = ChoiceLabSetting(world=SMALL, temperature=0.7)
    policy = choice_lab_policy(setting).with_logits(np.random.default_rng(1).normal(size=4))
    h = 1e-6

    def numeric(f):
        return np.array([(f(policy.weights + h * e) - f(policy.weights - h * e)) / (2 * h) for e in np.eye(4)])

    # one episode, any advantages: sum_t A_t grad log pi(a_t | s_t), the log-probabilities differentiated numerically
    items, adv = [SMALL.item(1, t, o) for t, o in enumerate((2, 0, 1))], np.array([0.5, -1.0, 2.0])

    def weighted_logp(w):
        p = policy.with_logits(w).table
        return sum(a * np.log(p[1, t, o]) for a, (t, o) in zip(adv, enumerate((2, 0, 1))))

    assert policy.policy_gradient([_episode(policy, 1, items)], [adv]) == pytest.approx(numeric(weighted_logp))
    # every sequence weighted by its probability, with exact advantages: the gradient of the exact value
    episodes, advantages = [], []
    for task in range(SMALL.tasks):
        for seq, p, _ in _enumerate(policy, task):
            episodes.append(_episode(policy, task, seq))
            advantages.append(policy.episode_advantages(seq) * p / SMALL.tasks)
    grad = policy.policy_gradient(episodes, advantages) * len(episodes)
    assert grad == pytest.approx(numeric(lambda w: policy.with_logits(w).value), abs=1e-7)


def test_keyed_sampling_through_the_env_matches_the_exact_value():
    setting = ChoiceLabSetting(world=replace(ChoiceLabConfig(), tasks=32), shuffle=1.0)
    policy = policies.lab_policy("ChoiceLab-v0", choice_setting=setting)
    policy = policy.with_logits(np.random.default_rng(2).normal(size=32))
    eps, envs = toy.toy_rollouts(policy, 40, 5, noise_seed=4)
    # a group's episodes share one task; tasks vary across groups
    assert all(len({e.options["task"] for e in eps[g * 5:(g + 1) * 5]}) == 1 for g in range(40))
    assert len({e.options["task"] for e in eps}) > 10
    u = np.array([e.utility for e in eps])
    exact = np.array([policy.episode_values([t.text for t in e.turns])[0] for e in eps])
    assert abs(u.mean() - exact.mean()) < 4 * u.std() / np.sqrt(len(u))
    # rewards add up and the offers never depend on the choices, so Q(s_t, a_t) = r_t + V(s_{t+1}) and the
    # exact advantages of an episode telescope to its utility minus V(s0)
    adv = toy.exact_advantages(policy, eps)
    assert [a.sum() for a in adv] == pytest.approx(u - exact)


def test_shuffle_is_the_coupling_knob_and_leaves_the_policy_alone():
    small = ChoiceLabSetting(world=replace(ChoiceLabConfig(), tasks=16, horizon=8))
    weights = np.random.default_rng(3).normal(size=32)
    # shuffle 0: a coupled twin's later choices are the factual ones, so its outcome differs by the decision alone
    policy = choice_lab_policy(replace(small, shuffle=0.0)).with_logits(weights)
    eps, envs = toy.toy_rollouts(policy, 4, 3, noise_seed=1)
    index = [(i, t) for i, e in enumerate(eps) for t in range(len(e.turns))]
    twins = toy.toy_twins(policy, eps, envs, index, coupled=True)
    c, right = policy.config, world(policy.config).right
    assert sum(not tw.self_twin for tw in twins) > 20
    for (i, t), tw in zip(index, twins):
        task = eps[i].options["task"]
        own = c.locate(policy.action_of(eps[i].turns[t].text))[2]
        alt = own if tw.self_twin else c.locate(policy.action_of(tw.turns[0].text))[2]
        own_right, alt_right = int(own == right[task, t]), int(alt == right[task, t])
        assert eps[i].utility - tw.utility == pytest.approx((own_right - alt_right) / 8)
        assert tw.self_twin or [x.text for x in tw.turns[1:]] == [x.text for x in eps[i].turns[t + 1:]]
    # the knob orders the noise, not the policy: the same values at every shuffle, and rho-bar falls as it grows
    shuffled = choice_lab_policy(replace(small, shuffle=1.0)).with_logits(weights)
    assert shuffled.value == policy.value and (shuffled.order != policy.order).any()
    low = coupling_rho(replace(small, shuffle=1.0), groups=4, n_boot=200, policy=shuffled)["rho_bar"]
    high = coupling_rho(replace(small, shuffle=0.0), groups=4, n_boot=200, policy=policy)["rho_bar"]
    assert high["lo"] > low["hi"]


def test_an_oracle_too_large_is_refused_before_anything_starts():
    big = ChoiceLabConfig(tasks=4096, horizon=32, options=8, attributes=12)
    too_large = r"too large for its exact oracle: 14,815,232 table entries .* > cap 4,000,000"
    with pytest.raises(ValueError, match=too_large):
        ChoiceLabSetting(world=big)
    with pytest.raises(ValueError, match="memory_size must be an int >= 1"):
        ChoiceLabSetting(memory_size=0)
    with pytest.raises(ValueError, match="0 <= shuffle <= 1 and temperature > 0"):
        ChoiceLabSetting(shuffle=1.5)
    assert ChoiceLabSetting(world=big, max_oracle=15_000_000).oracle_size == 14_815_232  # a higher cap admits it


def test_exact_advantages_learn_faster_than_grpo_at_their_best_step_sizes():
    """The lab discriminates credit: on a small setting (a few updates of small batches), each method's step size is
    picked on a tuning seed from a grid, and on fresh seeds exact advantages reach a larger area under the exact-value
    curve than GRPO, seed by seed."""
    setting = ChoiceLabSetting(world=replace(ChoiceLabConfig(), tasks=64))
    cfg = bench_learn.LearnConfig(env="ChoiceLab-v0", choice_setting=setting, updates=6, groups=4, group_size=4)

    def area(method, lr, seed):
        v = np.array(bench_learn.train_one(method, seed, cfg, lr=lr).values)
        return float(((v[1:] + v[:-1]) / 2).mean())

    grids = {"grpo": (8.0, 32.0), "exact-advantage": (128.0, 512.0)}
    best = {m: max(grid, key=lambda lr: area(m, lr, 1000)) for m, grid in grids.items()}
    for seed in (0, 1):
        assert area("exact-advantage", best["exact-advantage"], seed) > area("grpo", best["grpo"], seed)


def test_flags_compose_the_setting_and_the_commands_refuse_an_oracle_too_large(capsys):
    p = argparse.ArgumentParser()
    policies.add_setting_args(p)
    a = p.parse_args(["--tasks", "8", "--horizon", "5", "--shuffle", "0.25", "--memory-size", "4"])
    s = choice_setting_from_args(a)
    assert s.world == ChoiceLabConfig(tasks=8, horizon=5) and (s.shuffle, s.memory_size, s.temperature) == (0.25, 4, 1)
    for command in (cli.lab_main, bench_learn.main):  # twice audit, twice bench learn
        with pytest.raises(SystemExit):
            command(["--env", "ChoiceLab-v0", "--tasks", "3000"])
        assert "too large for its exact oracle: 13,107,000 table entries" in capsys.readouterr().err
