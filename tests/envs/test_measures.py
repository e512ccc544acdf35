"""Each env names its own measures of a finished episode (what training progress and evaluations report)."""

import pytest

import twice_envs


def test_each_env_reports_its_own_measures_headline_first():
    qa = twice_envs.make("SearchQA-v0").unwrapped
    assert qa.measures({"em": 1.0, "f1": 0.5}, 1.0) == {"em": 1.0, "f1": 0.5}
    assert qa.measures({}, 0.0) == {"em": 0.0, "f1": 0.0}  # never answered
    shop = twice_envs.make("WebShop-v0").unwrapped
    assert shop.measures({}, 1.0) == {"success": 1.0, "score": 1.0}
    assert shop.measures({}, 0.6) == {"success": 0.0, "score": pytest.approx(0.6)}
    assert twice_envs.make("CreditToy-v0").unwrapped.measures({}, 0.25) == {"return": 0.25}


def test_alfworld_success_is_the_goal_holding():
    pytest.importorskip("alfworld")
    env = twice_envs.make("ALFWorld-v0").unwrapped
    assert env.measures({"won": True}, 10.0) == {"success": 1.0}
    assert list(env.measures({"won": False}, 0.0)) == ["success"]
