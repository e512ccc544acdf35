"""SearchToy lab policy: exact values by dynamic programming, checked by hand and by sampling."""

import dataclasses
import math

import numpy as np
import pytest

from twice_envs.agents.lab import toy
from twice_envs.agents.lab.search_toy import SearchToySetting, search_toy_policy
from twice_envs.agents.lab.text_policy import text_lab_policy
from twice_envs.agents.lab.text_setting import TextLabSetting
from twice_envs.envs.searchtoy.env import SearchToyConfig


def test_exact_value_by_hand():
    # one fact, two queries (q0 finds it), horizon 2: actions q0, q1, answer (a=2)
    s = SearchToySetting(SearchToyConfig(hops=1, queries=2, useful=1, horizon=2), wording=0.0, skill=0.0,
                         answer_slope=0.0, answer_bias=0.0)
    p = search_toy_policy(s)  # uniform: 1/3 each
    # turn 0: q0 -> found; then any action ends (answer or horizon) with 1 -> 1/3
    #         q1 -> not found; turn 1: only q0 finds it, and the horizon ends there -> 1/3 * 1/3
    #         answer -> 0
    assert p.value == pytest.approx(1 / 3 + 1 / 9)
    assert p.episode_advantages([0, 2]).tolist() == pytest.approx([1 - 4 / 9, 0.0])
    assert p.episode_advantages([1, 0]).tolist() == pytest.approx([1 / 3 - 4 / 9, 1 - 1 / 3])
    assert p.expected_turns() == pytest.approx(1 + 2 / 3)


def test_default_setting_and_sampled_outcomes_match_the_exact_value():
    p = search_toy_policy()
    eps, _ = toy.toy_rollouts(p, 300, 5, noise_seed=4)
    u = np.array([e.utility for e in eps])
    se = u.std() / math.sqrt(len(u))
    assert abs(u.mean() - p.value) < 4 * se
    turns = np.array([len(e.turns) for e in eps])
    assert abs(turns.mean() - p.expected_turns()) < 4 * turns.std() / math.sqrt(len(turns))
    assert 0.4 < p.value < 0.6 and 4 < p.expected_turns() < 6  # the documented regime


def test_exact_advantages_are_the_mean_of_coupled_twin_differences():
    # D = U - U' of coupled twins is unbiased for A*: pooled over many decisions
    p = search_toy_policy()
    eps, envs = toy.toy_rollouts(p, 150, 5, noise_seed=5)
    index = [(i, t) for i, e in enumerate(eps) for t in range(len(e.turns))]
    exact = np.concatenate(toy.exact_advantages(p, eps))
    tw = toy.toy_twins(p, eps, envs, index)
    d = np.array([eps[i].utility - w.utility for (i, _), w in zip(index, tw)])
    assert abs((d - exact).mean()) < 4 * (d - exact).std() / math.sqrt(len(d))
    assert np.corrcoef(d, exact)[0, 1] > 0.4


def test_policy_depends_on_facts_found_and_wording():
    p = search_toy_policy()
    c = p.config
    none, all_found = p.table[0, c.num_actions], p.table[(1 << c.hops) - 1, c.num_actions]
    assert all_found[c.queries] > 0.5 > none[c.queries]
    assert not np.allclose(p.table[0, 0], p.table[0, 1])  # previous action changes the logits
    flat = search_toy_policy(SearchToySetting(wording=0.0))
    assert np.allclose(flat.table[0, 0], flat.table[0, 1])
    assert SearchToyConfig().num_actions == 9


def test_the_lab_settings_hold_the_env_world_rather_than_copy_its_fields():
    world = SearchToyConfig(hops=2, queries=5, useful=3, horizon=4, reward="graded")
    setting = SearchToySetting(world, wording=0.5)
    assert search_toy_policy(setting).env_kwargs == dataclasses.asdict(world)
    text = TextLabSetting(setting, memory=0.5)
    assert text.world is world and text_lab_policy(text).env_kwargs == dataclasses.asdict(world)
    world_fields = {f.name for f in dataclasses.fields(SearchToyConfig)}
    search_fields = {f.name for f in dataclasses.fields(SearchToySetting)}
    assert not world_fields & search_fields  # one definition of the world: the env's
    assert not (world_fields | search_fields) & {f.name for f in dataclasses.fields(TextLabSetting)}
    with pytest.raises(ValueError, match="SearchToySetting.world must be a SearchToyConfig, got dict"):
        SearchToySetting({"hops": 2})
    with pytest.raises(ValueError, match="TextLabSetting.search must be a SearchToySetting, got SearchToyConfig"):
        TextLabSetting(world)
