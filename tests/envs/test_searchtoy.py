"""SearchToy-v0: the env contract and its dynamics."""

import pytest

import twice_envs
from twice_envs.envs.searchtoy.env import (
    INVALID,
    SearchToyConfig,
    outcome,
    parse_action,
    transition,
)


@pytest.mark.parametrize("kwargs", [{}, {"reward": "graded", "hops": 2, "horizon": 4}])
def test_check_env(kwargs):
    env = twice_envs.make("SearchToy-v0", **kwargs)
    report = twice_envs.check_env(env, extra_actions=["search q0", "answer", "search q99", "search"])
    assert not report.skipped and "fork independence" in report.passed, report


def test_dynamics_by_hand():
    env = twice_envs.make("SearchToy-v0")  # 3 facts, 8 queries, q0..q3 useful (q3 finds fact 0)
    env.reset(seed=0)
    obs, r, term, trunc, info = env.step("search q1")
    assert obs == "Result: fact 1." and info["found"] == 0b010 and r == 0 and not term
    obs, *_ = env.step("search q5")
    assert obs == "Result: nothing relevant."
    obs, *_ = env.step("search q6")
    assert obs == "Result: nothing relevant."  # same evidence from a different query
    assert env.step("search q3")[4]["found"] == 0b011
    obs, r, term, trunc, info = env.step("  SEARCH q2 ")
    assert info["found"] == 0b111
    obs, r, term, trunc, info = env.step("answer")
    assert term and r == 1.0 and obs == "Answered with 3 of 3 facts."


def test_horizon_ends_as_answered_and_bad_actions_waste_a_turn():
    env = twice_envs.make("SearchToy-v0", horizon=3, reward="graded")
    env.reset(seed=0)
    obs, r, term, trunc, info = env.step("look around")
    assert info["invalid"] and "Invalid action" in obs and not term
    env.step("search q0")
    obs, r, term, trunc, info = env.step("search q9")  # q9 does not exist: invalid, last turn
    assert info["invalid"] and term and r == pytest.approx(1 / 3)


def test_pure_dynamics_and_config_errors():
    c = SearchToyConfig(hops=2, queries=5, useful=3)
    assert [parse_action(c, t) for t in ("search q4", "search q5", "answer", "answer now", "q1")] == [4, INVALID, 5, INVALID, INVALID]
    assert transition(c, 0, 2) == 0b01 and transition(c, 0, 3) == 0 and transition(c, 0b01, 1) == 0b11
    assert outcome(c, 0b01) == 0.0 and outcome(c, 0b11) == 1.0
    with pytest.raises(ValueError, match="useful"):
        SearchToyConfig(hops=3, useful=2)
    with pytest.raises(ValueError, match="reward"):
        SearchToyConfig(reward="f1")
