"""Golden tests: the observation of every WebShop page type and its admissible actions."""

from __future__ import annotations

import pytest

import twice_envs
from tests.envs._webshop_data import write_shop

INS = "i need a sulfate free shampoo with color: red, and size: small, and price lower than 30.00 dollars"
HEAD = f"Instruction: [SEP] {INS} [SEP] Back to Search"
ITEM = (
    f"{HEAD} [SEP] < Prev [SEP] color [SEP] navy | blue [SEP] red [SEP] size [SEP] small [SEP] large [SEP] "
    "Acme Lavender Shampoo Bottle [SEP] Price: $10.0 to $20.0 [SEP] Rating: N.A. [SEP] Description [SEP] "
    "Features [SEP] Reviews [SEP] Buy Now"
)
ITEM_ACTIONS = [
    "click[back to search]", "click[< prev]", "click[description]", "click[features]", "click[reviews]",
    "click[buy now]", "click[navy | blue]", "click[red]", "click[small]", "click[large]",
]
RESULTS_1 = (
    f"{HEAD} [SEP] Page 1 (Total results: 2) [SEP] Next > [SEP] B0TESTAAA1 [SEP] Acme Lavender Shampoo Bottle "
    "[SEP] $10.0 to $20.0 [SEP] B0TESTBBB2 [SEP] Zen Shampoo Refill [SEP] $5.5"
)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    kw = write_shop(tmp_path_factory.mktemp("shop"))
    return twice_envs.make("WebShop-v0", **kw)


def test_goal_text_is_pinned(env):
    env.reset(seed=0, options={"goal": 0})
    assert env.goal.instruction_text == INS
    assert env.goal.goal_options == (("color", "red"), ("size", "small"))


def test_every_page_type(env):
    obs, info = env.reset(seed=0, options={"goal": 0})
    assert obs == f"WebShop [SEP] Instruction: [SEP] {INS} [SEP] Search"
    assert info["admissible_actions"] == ["search[<query>]"] and info["page"] == "search"

    steps = [
        ("search[Shampoo]", RESULTS_1, ["click[back to search]", "click[next >]", "click[b0testaaa1]", "click[b0testbbb2]"]),
        ("click[next >]", f"{HEAD} [SEP] Page 2 (Total results: 2) [SEP] < Prev [SEP] Next >",
         ["click[back to search]", "click[< prev]", "click[next >]"]),
        ("click[< prev]", RESULTS_1, None),
        ("click[b0testaaa1]", ITEM, ITEM_ACTIONS),
        ("click[description]", f"{HEAD} [SEP] < Prev [SEP] A gentle shampoo for every day.",
         ["click[back to search]", "click[< prev]"]),
        ("click[< prev]", ITEM, ITEM_ACTIONS),
        ("click[features]", f"{HEAD} [SEP] < Prev [SEP] sulfate free formula [SEP] for dry hair", None),
        ("click[< prev]", ITEM, None),
        ("click[reviews]", f"{HEAD} [SEP] < Prev", None),
        ("click[< prev]", ITEM, None),
        ("click[< prev]", RESULTS_1, None),
        ("click[back to search]", f"WebShop [SEP] Instruction: [SEP] {INS} [SEP] Search", ["search[<query>]"]),
    ]
    for action, want_obs, want_actions in steps:
        obs, r, term, trunc, info = env.step(action)
        assert obs == want_obs, action
        assert r == 0.0 and not term and not info["invalid"]
        if want_actions is not None:
            assert info["admissible_actions"] == want_actions, action


def test_done_page_and_options(env):
    env.reset(seed=0, options={"goal": 0})
    for a in ("search[shampoo]", "click[b0testaaa1]", "click[navy | blue]", "click[large]"):
        env.step(a)
    obs, r, term, trunc, info = env.step("click[buy now]")
    assert term and info["admissible_actions"] == [] and info["page"] == "done"
    assert obs == (
        "Thank you for shopping with us! [SEP] Your code: [SEP] None [SEP] (Paste it in your MTurk interface.) "
        "[SEP] Purchased [SEP] asin [SEP] B0TESTAAA1 [SEP] options [SEP] {\"color\": \"navy | blue\", \"size\": "
        "\"large\"} [SEP] attrs [SEP] None [SEP] category [SEP] None [SEP] query [SEP] None [SEP] product category "
        "[SEP] None [SEP] Target [SEP] asin [SEP] options [SEP] attrs [SEP] price upper [SEP] instuction text [SEP] "
        "category [SEP] product category [SEP] query [SEP] Goal [SEP] None [SEP] Reward [SEP] Your score (min 0.0, "
        "max 1.0) [SEP] 0.5 [SEP] Reward Details [SEP] None"
    )
    # 1 attribute + 0 of 2 options + price, over 1 + 2 + 1
    assert r == 0.5
    d = info["reward_details"]
    assert (d["attribute_matches"], d["option_matches"], d["price_ok"], d["r_type"]) == (1, 0, True, 1.0)


def test_show_admissible_lists_each_element_as_the_page_shows_it(tmp_path):
    env = twice_envs.make("WebShop-v0", show_admissible=True, **write_shop(tmp_path))
    obs, info = env.reset(seed=0, options={"goal": 0})
    assert obs == f"WebShop [SEP] Instruction: [SEP] {INS} [SEP] Search\n\nAdmissible actions: search[<query>]."
    obs, *_ = env.step("search[Shampoo]")
    assert obs == (f"{RESULTS_1}\n\nAdmissible actions: click[Back to Search], click[Next >], "
                   "click[B0TESTAAA1], click[B0TESTBBB2].")
    obs, _, _, _, info = env.step("click[B0TESTAAA1]")
    shown = ("click[Back to Search], click[< Prev], click[Description], click[Features], click[Reviews], "
             "click[Buy Now], click[navy | blue], click[red], click[small], click[large]")
    assert obs == f"{ITEM}\n\nAdmissible actions: {shown}."
    # the same actions as info lists them (lower case, as the env reads them)
    assert [a.lower() for a in shown.split(", ")] == info["admissible_actions"] == ITEM_ACTIONS
    obs, *_ = env.step("click[nothing]")  # an invalid action shows the page and its list again
    assert obs == f"Invalid action: 'nothing' is not a clickable element of this page [SEP] {ITEM}\n\nAdmissible actions: {shown}."
    obs, _, term, _, _ = env.step("click[Buy Now]")
    assert term and "Admissible" not in obs  # the done page has no actions
    assert twice_envs.replay(env.trajectory, trusted=True).trajectory.observations == env.trajectory.observations
    with pytest.raises(ValueError, match="show_admissible"):
        twice_envs.make("WebShop-v0", show_admissible=1, **write_shop(tmp_path))


def test_attributes_page(tmp_path):
    env = twice_envs.make("WebShop-v0", show_attrs=True, **write_shop(tmp_path))
    env.reset(seed=0, options={"goal": 0})
    env.step("search[shampoo]")
    _, _, _, _, info = env.step("click[b0testaaa1]")
    assert "click[attributes]" in info["admissible_actions"]
    obs, *_ = env.step("click[attributes]")
    assert obs == f"{HEAD} [SEP] < Prev [SEP] sulfate free [SEP] dry hair [SEP] beauty [SEP] shampoo [SEP] Beauty › Hair Care › Shampoo"


def test_text_node_rules():
    from twice_envs.envs.webshop.pages import _node

    assert _node("") == []
    assert _node("   ") == [""]  # spaces only: an empty segment
    assert _node(" \n ") == []  # whitespace with a newline: no segment
    assert _node("  a b  ") == ["a b"]
