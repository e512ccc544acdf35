"""Each env names its own measures of a finished episode (what training progress and evaluations report)."""

import pytest

import twice_envs


def test_each_env_reports_its_own_measures_headline_first():
    qa = twice_envs.make("SearchQA-v0").unwrapped
    assert qa.measures({"em": 1.0, "f1": 0.5}, 1.0) == {"em": 1.0, "f1": 0.5}
    assert qa.measures({}, 0.0) == {"em": 0.0, "f1": 0.0}  # never answered
    shop = twice_envs.make("WebShop-v0").unwrapped
    assert shop.measures({"reward_details": {"reward": 1.0}}, 1.0) == {"success": 1.0, "score": 1.0}
    assert shop.measures({"reward_details": {"reward": 0.6}}, 0.6) == {"success": 0.0, "score": pytest.approx(0.6)}
    assert shop.measures({}, 0.0) == {"success": 0.0, "score": 0.0}  # never bought
    assert twice_envs.make("CreditToy-v0").unwrapped.measures({}, 0.25) == {"return": 0.25}


def test_alfworld_success_is_the_goal_holding():
    pytest.importorskip("alfworld")
    env = twice_envs.make("ALFWorld-v0").unwrapped
    assert env.measures({"won": True}, 10.0) == {"success": 1.0}
    assert list(env.measures({"won": False}, 0.0)) == ["success"]


def _first_result_bought(reward: str, seed: int):
    """Search the instruction, open the first result and buy it."""
    env = twice_envs.make("WebShop-v0", reward=reward, show_admissible=True)
    _, info = env.reset(seed=seed)
    env.step(f"search[{info['instruction']}]")
    _, _, _, _, info = env.step(f"click[{info_product(env)}]")
    _, r, term, _, info = env.step("click[buy now]")
    assert term
    return r, env.unwrapped.measures(info, r)


def info_product(env):
    acts = env.unwrapped._info()["admissible_actions"]
    return next(a[len("click["):-1] for a in acts if a.startswith("click[") and a[6:-1] not in
                ("back to search", "next >", "< prev"))


def test_webshop_trains_on_the_score_or_on_success_and_measures_both_alike():
    partial = None
    for seed in range(40):
        r, m = _first_result_bought("score", seed)
        assert m["score"] == pytest.approx(r)
        if 0 < r < 1:
            partial = seed
            break
    assert partial is not None, "no partial purchase among 40 goals"
    r_success, m_success = _first_result_bought("success", partial)
    assert r_success == 0.0  # a partial match is not a success
    assert m_success == m  # the measures do not depend on the reward the env returns
    with pytest.raises(ValueError, match="reward must be one of score, success"):
        twice_envs.make("WebShop-v0", reward="graded")
