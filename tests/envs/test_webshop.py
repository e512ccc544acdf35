"""WebShop-v0: the contract checker, resets, goals, splits, bad input, forks."""

from __future__ import annotations

import math
from collections import Counter

import pytest

import twice_envs
from tests.envs._webshop_data import write_shop
from twice_envs.envs.webshop.env import parse_action
from twice_envs.envs.webshop.goals import GoalSet, price_cap


@pytest.fixture(scope="module")
def env():
    return twice_envs.make("WebShop-v0")


def test_check_env(env):
    report = twice_envs.check_env(env, num_episodes=3, num_steps=8)
    assert "fork == replay at every checked turn (snapshot path)" in report.passed


def test_check_env_on_file_data_with_human_goals(tmp_path):
    kw = write_shop(tmp_path)
    env = twice_envs.make("WebShop-v0", human_path=str(tmp_path / "human.json"), split="all", **kw)
    twice_envs.check_env(env, num_episodes=2, num_steps=6, subprocess_check=False)


def test_default_catalogue_and_splits(env):
    goals = env.res.goals
    assert len(env.res.catalogue) == 500 and len(goals) >= 2000
    assert goals.split_range("test") == range(0, 500)
    assert goals.split_range("eval") == range(500, 1500)
    assert goals.split_range("train") == range(1500, len(goals))
    with pytest.raises(ValueError):
        goals.split_range("dev")


def test_small_goal_sets_split_ten_percent(tmp_path):
    env = twice_envs.make("WebShop-v0", **write_shop(tmp_path))
    goals = env.res.goals
    assert len(goals) == 5
    assert [list(goals.split_range(s)) for s in ("test", "eval", "train")] == [[0], [1], [2, 3, 4]]


def test_reset_is_seeded_and_samples_the_split(env):
    a = [env.reset(seed=s)[1]["goal"] for s in range(30)]
    b = [env.reset(seed=s)[1]["goal"] for s in range(30)]
    assert a == b and len(set(a)) > 10
    assert all(g >= 1500 for g in a)  # default split: train
    t = twice_envs.make("WebShopTest-v0")
    assert all(t.reset(seed=s)[1]["goal"] < 500 for s in range(30))


def test_reset_options(env):
    _, info = env.reset(seed=1, options={"goal": 17})
    assert info["goal"] == 17 and env.goal.index == 17
    _, info = env.reset(seed=1, options={"split": "eval", "index": 3})
    assert info["goal"] == 503
    for bad in ({"goal": -1}, {"goal": 10**6}, {"goal": "3"}, {"index": 999999}, {"goal": True}, {"task": 3}):
        with pytest.raises(ValueError):
            env.reset(seed=1, options=bad)


def test_goals_follow_the_original_construction(env):
    goals = env.res.goals
    g = goals[0]
    p = env.res.catalogue[g.product_index]
    assert g.asin == p.asin and g.name == p.title and g.attributes == p.instruction_attributes
    names = [n for n, _ in g.goal_options]
    assert names == sorted(names) == sorted(n for n, _ in p.options)
    opts = ", and ".join(f"{k}: {v}" for k, v in g.goal_options)
    assert g.instruction_text.startswith(p.instruction + (" with " + opts if opts else ""))
    assert g.instruction_text.endswith(f", and price lower than {g.price_upper:.2f} dollars")
    # every product option combination is a goal, exactly once
    per_product = {}
    for i in range(len(goals)):
        per_product.setdefault(goals[i].product_index, set()).add(goals[i].goal_options)
    for idx, combos in per_product.items():
        n = 1
        for _, values in env.res.catalogue[idx].options:
            n *= len(values)
        assert len(combos) == n


def test_price_caps():
    # the larger of two distinct draws from the first four tens above the price (20, 30, 40, 50 here)
    n = 3000
    caps = Counter(price_cap(12.0, s, "x") for s in range(n))
    assert set(caps) == {30.0, 40.0, 50.0}
    # P(larger = k-th of four) = (k - 1) / 6; each share within 4 standard errors
    for cap, p in ((30.0, 1 / 6), (40.0, 2 / 6), (50.0, 3 / 6)):
        assert abs(caps[cap] / n - p) < 4 * math.sqrt(p * (1 - p) / n), (cap, caps)
    # the key (the goal) draws too, not only the seed
    assert {price_cap(12.0, 0, k) for k in range(60)} == {30.0, 40.0, 50.0}
    assert price_cap(985.0, 0, "x") is None  # one candidate (990): no cap clause
    assert [price_cap(975.0, s, "x") for s in range(20)] == [990.0] * 20  # two candidates: always the larger


def test_price_seed_changes_caps_not_goal_identity():
    a = twice_envs.make("WebShop-v0", price_seed=0).res.goals
    b = twice_envs.make("WebShop-v0", price_seed=1).res.goals
    assert [a[i].asin for i in range(50)] == [b[i].asin for i in range(50)]
    assert [a[i].price_upper for i in range(50)] != [b[i].price_upper for i in range(50)]


def test_human_goals(tmp_path):
    kw = write_shop(tmp_path)
    env = twice_envs.make("WebShop-v0", human_path=str(tmp_path / "human.json"), **kw)
    goals = env.res.goals
    assert goals.kind == "human" and len(goals) == 2  # the instruction without attributes is skipped
    texts = sorted(goals[i].instruction_text.split(", and price")[0] for i in range(2))
    assert texts == ["a steel hammer", "i want a red shampoo for dry hair"]  # trailing period stripped
    g = next(goals[i] for i in range(2) if goals[i].asin == "B0TESTAAA1")
    env.reset(seed=0, options={"goal": g.index})
    for a in ("search[red shampoo]", "click[b0testaaa1]", "click[red]"):
        env.step(a)
    _, r, term, _, info = env.step("click[buy now]")
    assert term and r == 1.0 and info["reward_details"]["option_matches"] == 1


def test_parse_action():
    assert parse_action("click[Buy Now]") == ("click", "buy now")
    assert parse_action("Thought: I should search[x] first.\nAction: click[ Red ]") == ("click", "red")
    assert parse_action("search[12\" x [2] frame]") == ("search", '12" x [2] frame')
    assert parse_action("click[red] and then click[blue") == ("click", "red")
    assert parse_action("Search[Shoes]") == ("search", "shoes")
    assert parse_action("clicked[red]") is None and parse_action("nothing") is None
    assert parse_action("click[a\n]") is None


def test_invalid_actions_are_no_ops(env):
    obs0, _ = env.reset(seed=3)
    cases = [
        ("hello", "no action found"),
        ("search[]", "empty"),
        ("search[   ]", "empty"),
        ("search[" + "x" * 600 + "]", "longer than"),
        ("click[buy now]", "not a clickable"),
        ("click[search]", "not a clickable"),
    ]
    for action, why in cases:
        obs, r, term, trunc, info = env.step(action)
        assert info["invalid"] and r == 0.0 and not term and why in info["error"]
        assert obs.startswith("Invalid action: ") and obs.endswith(obs0)
    env.step("search[shampoo]")
    obs, r, term, trunc, info = env.step("search[shoes]")
    assert info["invalid"] and "no search bar" in info["error"]
    quiet = twice_envs.make("WebShop-v0", invalid_feedback=False)
    obs0, _ = quiet.reset(seed=3)
    assert quiet.step("click[nothing]")[0] == obs0


def test_search_anywhere_option():
    env = twice_envs.make("WebShop-v0", search_anywhere=True)
    env.reset(seed=0)
    _, _, _, _, info = env.step("search[shampoo]")
    assert info["admissible_actions"][0] == "search[<query>]"
    _, _, _, _, info = env.step("search[lipstick]")
    assert not info["invalid"] and info["page"] == "results"


def test_truncation_after_max_turns():
    env = twice_envs.make("WebShop-v0", max_turns=3)
    env.reset(seed=0)
    for i in range(3):
        _, _, term, trunc, _ = env.step("click[nothing]")
    assert trunc and not term


def test_snapshot_is_immutable_plain_data(env):
    env.reset(seed=5)
    env.step("search[shampoo]")
    snap = env._snapshot()

    def frozen(x):
        if isinstance(x, (str, int, float, bool, type(None))):
            return True
        if isinstance(x, tuple):
            return all(frozen(y) for y in x)
        return hasattr(x, "__dataclass_params__") and x.__dataclass_params__.frozen

    assert frozen(snap)
    f = env.fork(1)
    f.step("click[back to search]")
    assert env._snapshot() == snap


def test_goalset_rejects_bad_kind(env):
    with pytest.raises(ValueError):
        GoalSet(env.res.catalogue, "robot", 0)
    with pytest.raises(IndexError):
        env.res.goals[len(env.res.goals)]


def test_sampler_follows_goal_weights(tmp_path):
    env = twice_envs.make("WebShop-v0", split="all", **write_shop(tmp_path))
    goals = env.res.goals
    # one attribute shared by 4 goals of product A (weight 1/4 each), one by the single goal of B
    assert sorted(goals.weights.tolist()) == [0.25, 0.25, 0.25, 0.25, 1.0]
    b = next(i for i in range(5) if goals[i].asin == "B0TESTBBB2")
    picks = [env.reset(seed=s)[1]["goal"] for s in range(1000)]
    assert 0.44 < picks.count(b) / 1000 < 0.56  # weight 1 of a total 2


def test_data_without_usable_goals_fails_at_make_and_says_why(tmp_path):
    from twice_envs.errors import DataFormatError

    kw = write_shop(tmp_path / "a", attributes={})
    with pytest.raises(DataFormatError, match=r"items\.json: no usable goals: none of the 3 products has an instruction.*none in .*ins\.json"):
        twice_envs.make("WebShop-v0", **kw)
    kw = write_shop(tmp_path / "b")
    del kw["attributes_path"]
    with pytest.raises(DataFormatError, match=r"items\.json: no usable goals.*pass attributes_path"):
        twice_envs.make("WebShop-v0", **kw)
    kw = write_shop(tmp_path / "c", human={"B0NOTHERE0": [{"instruction": "x", "instruction_attributes": ["y"]}]})
    with pytest.raises(DataFormatError, match=r"human\.json: no usable goals: no human instruction"):
        twice_envs.make("WebShop-v0", human_path=str(tmp_path / "c" / "human.json"), **kw)
    from tests.envs._webshop_data import ATTRIBUTES

    one = {"B0TESTBBB2": ATTRIBUTES["B0TESTBBB2"]}  # one synthetic goal: too few for a test split
    kw = write_shop(tmp_path / "d", attributes=one)
    assert len(twice_envs.make("WebShop-v0", split="train", **kw).res.goals) == 1
    with pytest.raises(DataFormatError, match=r"split 'test' has no goals.*use split='all'"):
        twice_envs.make("WebShop-v0", split="test", **kw)


@pytest.mark.parametrize("shape", ["click[", "search[[", "click[]", "[", "click[a\n"])
def test_parse_action_takes_linear_time(shape):
    from tests.envs._timing import growth

    assert growth(parse_action, shape) < 20  # 8x the input: linear ~8, quadratic ~64
