"""Page rendering: the original's text observation and the clickable elements of each page.

The original renders an HTML page and reads its visible text nodes, strips each and joins
them with `` [SEP] ``. We produce the same text directly. Text-node rules kept from its
HTML parser: a node that is only spaces/tabs renders as an empty segment, one that is
only whitespace with a newline disappears, an empty field makes no node.

Pages (``kind``): ``search``, ``results``, ``item``, ``sub`` (Description, Features,
Reviews, Attributes) and ``done``. Clickables are keyed by their lower-cased text, in
page order: buttons, then product links, then option values; a later element with the
same text replaces an earlier one (as the original's text -> element map).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

from twice_envs.envs.webshop.catalogue import Catalogue, Product

SEP = " [SEP] "
RESULTS_PER_PAGE = 10
BACK_TO_SEARCH = "Back to Search"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
BUY_NOW = "Buy Now"
SUB_PAGES = ("Description", "Features", "Reviews", "Attributes")
_ASCII_WS = " \t\n\r\f"


@dataclass(frozen=True)
class Clickable:
    """An element a ``click[...]`` can hit.

    Attributes:
        kind: ``button``, ``product`` (payload: catalogue position) or ``option``
            (payload: option name).
        label: the button's text, or the product's asin, or the option value.
        payload: see ``kind``.
    """

    kind: str
    label: str
    payload: object = None


def _node(text: str) -> list[str]:
    """The segment(s) one rendered text node contributes."""
    if text == "":
        return []
    if text.strip(_ASCII_WS) == "":
        return [] if "\n" in text else [""]
    return [text.strip()]


def _header(instruction: str) -> list[str]:
    return ["Instruction:", *_node(instruction), BACK_TO_SEARCH]


def render_search(instruction: str) -> tuple[str, list[tuple[str, Clickable]]]:
    segs = ["WebShop", "Instruction:", *_node(instruction), "Search"]
    return SEP.join(segs), [("search", Clickable("button", "Search"))]


def render_results(
    instruction: str, catalogue: Catalogue, results: Sequence[int], page: int
) -> tuple[str, list[tuple[str, Clickable]]]:
    segs = _header(instruction)
    segs.append(f"Page {page} (Total results: {len(results)})")
    clicks = [("back to search", Clickable("button", BACK_TO_SEARCH))]
    if page > 1:
        segs.append(PREV_PAGE)
        clicks.append(("< prev", Clickable("button", PREV_PAGE)))
    segs.append(NEXT_PAGE)
    clicks.append(("next >", Clickable("button", NEXT_PAGE)))
    start = (page - 1) * RESULTS_PER_PAGE
    for idx in results[max(start, 0) : max(start, 0) + RESULTS_PER_PAGE] if page >= 1 else ():
        p = catalogue[idx]
        segs += _node(p.asin) + _node(p.title) + _node(p.price_tag)
        clicks.append((p.asin.lower(), Clickable("product", p.asin, idx)))
    return SEP.join(segs), clicks


def render_item(
    instruction: str, product: Product, show_attrs: bool = False
) -> tuple[str, list[tuple[str, Clickable]]]:
    segs = _header(instruction) + [PREV_PAGE]
    for name, values in product.options:
        segs += _node(name)
        for v in values:
            segs += _node(v)
    segs += _node(product.title)
    segs.append(f"Price: {product.price_tag}".strip())
    segs.append("Rating: N.A.")
    buttons = ["Description", "Features", "Reviews"] + (["Attributes"] if show_attrs else []) + [BUY_NOW]
    segs += buttons
    clicks = [("back to search", Clickable("button", BACK_TO_SEARCH)), ("< prev", Clickable("button", PREV_PAGE))]
    clicks += [(b.lower(), Clickable("button", b)) for b in buttons]
    for name, values in product.options:
        for v in values:
            clicks.append((v, Clickable("option", v, name)))
    return SEP.join(segs), clicks


def render_sub(instruction: str, product: Product, sub: str) -> tuple[str, list[tuple[str, Clickable]]]:
    segs = _header(instruction) + [PREV_PAGE]
    if sub == "Description":
        segs += _node(product.description)
    elif sub == "Features":
        for b in product.bullets:
            segs += _node(" " + b)
    elif sub == "Attributes":
        for a in product.attributes:
            segs += _node(" " + a)
        segs += _node(product.category) + _node(product.query) + _node(product.product_category)
    # Reviews: the original shop loads no reviews, so the page has none.
    clicks = [("back to search", Clickable("button", BACK_TO_SEARCH)), ("< prev", Clickable("button", PREV_PAGE))]
    return SEP.join(segs), clicks


def options_json(options: Sequence[tuple[str, str]]) -> str:
    """The purchased options as the done page prints them (sorted keys, HTML-safe escapes)."""
    text = json.dumps(dict(options), sort_keys=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("'", "\\u0027")


def render_done(asin: str, options: Sequence[tuple[str, str]], reward: float) -> tuple[str, list[tuple[str, Clickable]]]:
    segs = ["Thank you for shopping with us!", "Your code:", "None", "(Paste it in your MTurk interface.)", "Purchased",
            "asin", *_node(asin), "options", options_json(options)]
    for label in ("attrs", "category", "query", "product category"):
        segs += [label, "None"]
    segs += ["Target", "asin", "options", "attrs", "price upper", "instuction text", "category", "product category",
             "query", "Goal", "None", "Reward", "Your score (min 0.0, max 1.0)", str(float(reward)), "Reward Details",
             "None"]
    return SEP.join(segs), []


def clickable_map(clicks: list[tuple[str, Clickable]]) -> dict[str, Clickable]:
    """Text -> element; a later element with the same text replaces the earlier one, keeping its place."""
    out: dict[str, Clickable] = {}
    for key, c in clicks:
        out[key] = c
    return out


def admissible(has_search_bar: bool, clicks: dict[str, Clickable], *, as_shown: bool = False) -> list[str]:
    """``info["admissible_actions"]``: ``search[<query>]`` where there is a search bar, then clicks
    (lower case, as the env reads them; ``as_shown``: each element written as the page shows it)."""
    acts = ["search[<query>]"] if has_search_bar else []
    acts += [f"click[{c.label if as_shown else k}]" for k, c in clicks.items() if k != "search"]
    return acts

