"""The purchase reward, equivalent to the original's ``get_reward``.

::

    reward = r_type * (matched attributes + matched options + [price <= price cap])
                    / (goal attributes + goal options + 1)

* ``r_type`` (is it the right kind of product?): 1.0 when the purchased product has the
  goal's query, or shares at least two breadcrumb levels of ``product_category``, or more
  than 20% of the goal name's nouns appear in the purchased name; else 0.5. Then a title
  score (share of the goal's nouns found) below 0.1 gives 0.1, and a title score of 0 gives
  0 (a goal name without nouns scores 0.2). Nouns: :mod:`.nouns`.
* An attribute matches when a purchased attribute has a fuzzy token-set ratio above 85
  with it, or it is a substring of the purchased title, bullet points or description.
* An option matches when, after colour normalisation, a purchased option value has a
  token-set ratio above 85 with it. Synthetic goals hold options as ``name: value`` pairs
  and compare against the text of the pair, as the original does (so ``large`` matches
  ``size: x-large``); human goals hold plain option texts.

Fuzzy scores use rapidfuzz with the original's preprocessing (non-ASCII dropped,
non-alphanumerics to spaces, lower case) and its integer rounding (``round(score) > 85``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence, Union

from twice_envs._deps import require
from twice_envs.envs.webshop.catalogue import Product
from twice_envs.envs.webshop.nouns import nouns

#: Colour words, checked in alphabetical order: an option value containing one becomes it.
COLORS: tuple[str, ...] = tuple(
    sorted(
        {
            "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black", "blue", "blush",
            "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel", "champagne", "charcoal", "cheetah",
            "chestnut", "chocolate", "christmas", "coffee", "cognac", "copper", "coral", "cranberry", "cream",
            "crystal", "dark", "denim", "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite", "grape",
            "graphite", "grass", "gray", "green", "grey", "heather", "indigo", "ivory", "ivy", "khaki", "lavender",
            "lemon", "leopard", "light", "lilac", "lime", "magenta", "maroon", "mauve", "merlot", "midnight", "mint",
            "mocha", "multicolor", "mushroom", "mustard", "natural", "navy", "nude", "olive", "orange", "peach",
            "pewter", "pink", "plum", "purple", "rainbow", "red", "rose", "royal", "rust", "sand", "sapphire",
            "seashell", "silver", "skull", "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal",
            "tiger", "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
        }
    )
)

#: Goal options: ``{name: value}`` (synthetic goals) or a list of texts (human goals).
GoalOptions = Union[dict, Sequence[str]]

_NON_ALNUM = re.compile(r"[^a-zA-Z0-9]+")


def normalize_color(text: str) -> str:
    """The first colour word (alphabetically) contained in ``text``, else ``text``."""
    for c in COLORS:
        if c in text:
            return c
    return text


def _prep(text: str) -> str:
    # the original's fuzzy preprocessing with force_ascii: ASCII only, alphanumerics, lower case
    return _NON_ALNUM.sub(" ", text.encode("ascii", "ignore").decode()).strip().lower()


def token_set_ratio(a: str, b: str) -> int:
    """Token-set similarity 0..100, rounded to an int as the original's scorer returns it."""
    fuzz = require("rapidfuzz.fuzz", "webshop", "the WebShop reward")
    pa, pb = _prep(a), _prep(b)
    if not pa or not pb:
        return 0
    return int(round(fuzz.token_set_ratio(pa, pb, processor=None)))


@dataclass(frozen=True)
class TypeReward:
    r_type: float
    query_match: bool
    category_match: bool
    title_score: float


def type_reward(purchased: Product, goal_query: str, goal_product_category: str, goal_name: str) -> TypeReward:
    """``r_type`` with its parts (see the module docstring)."""
    query_match = purchased.query == goal_query
    got = {x.strip() for x in purchased.product_category.split("›")}
    want = {x.strip() for x in goal_product_category.split("›")}
    category_match = len(got & want) >= 2
    p_nouns = set(nouns(purchased.title))
    g_nouns = nouns(goal_name)  # a list: repeated nouns count in the denominator, as the original
    if not g_nouns:
        title_score = 0.2
    else:
        title_score = len(p_nouns & set(g_nouns)) / len(g_nouns)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return TypeReward(r_type, query_match, category_match, title_score)


def attribute_matches(purchased: Product, goal_attributes: Sequence[str]) -> int:
    """How many goal attributes the purchased product has."""
    n = 0
    title = purchased.title.lower()
    bullets = " ".join(purchased.bullets).lower()
    desc = purchased.description.lower()
    for g in goal_attributes:
        if any(token_set_ratio(p, g) > 85 for p in purchased.attributes):
            n += 1
        elif g in title or g in bullets or g in desc:
            n += 1
    return n


def _pair_text(name: str, value: str) -> str:
    # The original passes synthetic goal options as (name, value) pairs: its colour check is
    # then pair membership (an exact colour word), and the fuzzy scorer reads the pair's text.
    for c in COLORS:
        if c == name or c == value:
            return c
    return f"{name} {value}"


def _goal_option_texts(goal_options: GoalOptions) -> list[str]:
    if isinstance(goal_options, dict):
        return [_pair_text(k, v) for k, v in goal_options.items()]
    return [normalize_color(o) for o in goal_options]


def option_matches(purchased_values: Sequence[str], goal_options: GoalOptions) -> int:
    """How many goal options the purchased option values satisfy."""
    bought = [normalize_color(v) for v in purchased_values]
    n = 0
    for g in _goal_option_texts(goal_options):
        if any(token_set_ratio(p, g) > 85 for p in bought):
            n += 1
    return n


@dataclass(frozen=True)
class RewardDetails:
    """The parts of a purchase reward (what ``info["reward_details"]`` shows)."""

    reward: float
    r_type: float
    query_match: bool
    category_match: bool
    title_score: float
    attribute_matches: int
    num_attributes: int
    option_matches: int
    num_options: int
    price_ok: bool

    def to_json(self) -> dict:
        return dict(self.__dict__)


def get_reward(
    purchased: Product,
    price: float,
    chosen_options: Sequence[str],
    *,
    goal_query: str,
    goal_product_category: str,
    goal_name: str,
    goal_attributes: Sequence[str],
    goal_options: GoalOptions,
    price_upper: float,
) -> RewardDetails:
    """The reward for buying ``purchased`` at ``price`` with ``chosen_options`` (values)."""
    t = type_reward(purchased, goal_query, goal_product_category, goal_name)
    price_ok = bool(price <= price_upper) if price_upper > 0 else False
    n_att = attribute_matches(purchased, goal_attributes)
    n_opt = option_matches(list(chosen_options), goal_options)
    total = (n_att + n_opt + int(price_ok)) / (len(goal_attributes) + len(goal_options) + 1)
    return RewardDetails(
        total * t.r_type, t.r_type, t.query_match, t.category_match, t.title_score, n_att, len(goal_attributes),
        n_opt, len(goal_options), price_ok,
    )
