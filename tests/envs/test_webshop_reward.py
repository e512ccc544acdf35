"""The purchase reward: every branch of the formula, with hand-computed values."""

from __future__ import annotations

import pytest

from twice_envs.envs.webshop.catalogue import Product
from twice_envs.envs.webshop.reward import (
    attribute_matches,
    get_reward,
    normalize_color,
    option_matches,
    token_set_ratio,
    type_reward,
)

PC = "Beauty › Hair Care › Shampoo"


def product(title="Acme Lavender Shampoo Bottle", query="shampoo", pc=PC, attributes=("sulfate free", "dry hair"),
            description="A gentle shampoo.", bullets=("argan oil inside",)) -> Product:
    return Product("B0X", title, description, tuple(bullets), "$10.0", (10.0,), (), tuple(attributes), "beauty",
                   query, pc, None, ())


def reward(p, price=10.0, chosen=("red", "large"), *, name="Acme Lavender Shampoo Bottle", query="shampoo", pc=PC,
           attrs=("sulfate free", "dry hair"), options=None, cap=20.0):
    options = {"color": "red", "size": "large"} if options is None else options
    return get_reward(p, price, chosen, goal_query=query, goal_product_category=pc, goal_name=name,
                      goal_attributes=attrs, goal_options=options, price_upper=cap)


def test_full_match():
    d = reward(product())
    assert d.reward == 1.0 and d.r_type == 1.0
    assert (d.attribute_matches, d.option_matches, d.price_ok) == (2, 2, True)


def test_missing_option():
    d = reward(product(), chosen=("red",))
    assert d.option_matches == 1 and d.reward == pytest.approx(4 / 5)


def test_wrong_option_value():
    d = reward(product(), chosen=("black", "small"))
    assert d.option_matches == 0 and d.reward == pytest.approx(3 / 5)


def test_over_price():
    d = reward(product(), price=25.0)
    assert not d.price_ok and d.reward == pytest.approx(4 / 5)
    assert reward(product(), price=20.0).price_ok  # the cap itself is allowed


def test_missing_attribute_and_substring_match():
    # "argan oil" is not an attribute but appears in a bullet point; "tea tree" appears nowhere
    d = reward(product(), attrs=("argan oil", "tea tree"))
    assert d.attribute_matches == 1 and d.reward == pytest.approx(4 / 5)


def test_fuzzy_attribute_match():
    p = product(attributes=("essential oil", "natural ingredients"))
    assert attribute_matches(p, ["essential oils", "natural ingredients", "tea tree"]) == 2


def test_r_type_half():
    # other query, one shared breadcrumb level, title score 1/6 (> 0.1, <= 0.2)
    p = product(title="Acme Comb", query="comb", pc="Beauty › Combs")
    name = "Acme Shampoo Bottle Pump Refill Pack"
    t = type_reward(p, "shampoo", PC, name)
    assert (t.query_match, t.category_match) == (False, False)
    assert t.title_score == pytest.approx(1 / 6) and t.r_type == 0.5
    assert reward(p, name=name).reward == pytest.approx(0.5 * 5 / 5)  # everything else matches


def test_r_type_tenth():
    # 1 of 11 goal nouns shared: title score 1/11 < 0.1 overrides the query match
    p = product(title="Acme Comb")
    name = "Acme Shampoo Bottle Pump Refill Pack Lavender Oil Hair Scalp Wash"
    t = type_reward(p, "shampoo", PC, name)
    assert t.query_match and t.title_score == pytest.approx(1 / 11) and t.r_type == 0.1


def test_r_type_zero():
    p = product(title="Steel Hammer")
    t = type_reward(p, "shampoo", PC, "Acme Shampoo")
    assert t.title_score == 0.0 and t.r_type == 0.0
    assert reward(p, name="Acme Shampoo").reward == 0.0


def test_r_type_one_by_title_alone():
    p = product(title="Acme Shampoo", query="comb", pc="Tools › Combs")
    t = type_reward(p, "shampoo", PC, "Acme Shampoo Bottle")
    assert not t.query_match and not t.category_match and t.title_score > 0.2 and t.r_type == 1.0


def test_goal_name_without_nouns_scores_point_two():
    t = type_reward(product(title="Acme"), "other", "X › Y", "the best")
    assert t.title_score == 0.2 and t.r_type == 0.5


def test_options_human_and_synthetic():
    # human goals: plain option texts, colour-normalised, fuzzy
    assert option_matches(["pack of 12", "grey", "xl"], ["grey", "XL", "pack of 12"]) == 3
    assert option_matches(["pack of 12", "blue", "xl"], ["grey", "XL", "pack of 12"]) == 2
    assert option_matches(["pack of 12", "powder snow", "xl"], ["cool powder snow", "XL", "pack of 12"]) == 3
    assert option_matches(["navy blue"], ["dark blue"]) == 1  # both normalise to "blue"
    # synthetic goals compare with the "name value" text, so a subset of its tokens matches
    assert option_matches(["large"], {"size": "x-large"}) == 1
    assert option_matches(["small"], {"size": "x-large"}) == 0
    assert option_matches([], {"size": "large"}) == 0


def test_color_normalisation_and_fuzzy_rounding():
    assert normalize_color("rose gold") == "gold"  # alphabetical: gold before rose
    assert normalize_color("navy | blue") == "blue"
    assert normalize_color("unscented") == "unscented"
    assert token_set_ratio("Essential Oils!", "essential oils") == 100
    assert token_set_ratio("", "x") == 0
