"""``WebShop-v0``: the WebShop text environment (its ``simple`` text mode), in pure Python.

An episode: the shopper gets an instruction ("i need a sulfate free shampoo with scent:
lavender, and price lower than 30.00 dollars"), searches, opens products, picks options
and clicks ``Buy Now``; the purchase is scored by :mod:`.reward` and the episode ends.

Actions: ``search[query]`` (on a page with a search bar, non-empty query) and
``click[element]`` (an element of the current page: a button, a product id or an option
value); arguments are lower-cased. The env reads the model's raw turn: **the last
``search[...]`` or ``click[...]`` in the text counts** (brackets inside the argument may
nest; a bracket left open on the line does not count), so ``"Thought: ... Action:
click[red]"`` is ``click[red]``. Anything else is a no-op: reward 0,
``info["invalid"] = True``, and the observation says why, then shows the page again.

Observation: the page's visible text joined with `` [SEP] `` (see :mod:`.pages`).
``info["admissible_actions"]``: ``search[<query>]`` where there is a search bar, then
``click[...]`` for every clickable element.

State (all plain, immutable data): goal index, page kind, query, results (top 50
catalogue positions), page number, product, chosen options, sub page, and the rendered
page; ``fork`` is a snapshot of that tuple.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from twice_envs.core import Protocol, TextEnv
from twice_envs.envs.admissible import with_actions
from twice_envs.envs.webshop import pages
from twice_envs.envs.webshop.goals import SPLITS, Goal, product_price
from twice_envs.envs.webshop.resources import Resources, get_resources
from twice_envs.envs.webshop.reward import get_reward
from twice_envs.envs.webshop.search import TOP_K

INSTRUCTIONS = (
    "You are shopping in WebShop. Each turn, write one action: search[<query>] on the page with a search "
    "bar, or click[<element>] to click a button, a product id or an option value shown on the page. If your "
    "text holds several actions, the last one counts. Clicking Buy Now buys the product with the options you "
    "clicked and ends the episode; the score (0 to 1) says how well the purchase fits the instruction."
)

_ACTION = re.compile(r"\b(search|click)\[", re.IGNORECASE)
_BRACKET = re.compile(r"[\[\]\n]")
_RESET_OPTIONS = ("goal", "split", "index")
REWARDS = ("score", "success")
"""What a purchase can return (``WebShopEnv(reward=...)``)."""


def parse_action(text: str) -> Optional[tuple[str, str]]:
    """``(name, argument)`` of the last well-formed ``search[...]``/``click[...]`` in ``text``.

    The argument runs to the matching ``]`` (inner brackets nest) on the same line; it is
    stripped and lower-cased. None when there is no such action.

    Linear in ``len(text)``: one pass matches every bracket of a line with a stack, so an
    opener's closing bracket is looked up instead of scanned for (``"click[" * n`` would
    otherwise take quadratic time).
    """
    openers = list(_ACTION.finditer(text))
    if not openers:
        return None
    closing: dict[int, int] = {}  # position of a '[' -> position of its matching ']'
    stack: list[int] = []
    for m in _BRACKET.finditer(text):
        c, i = m.group(), m.start()
        if c == "[":
            stack.append(i)
        elif c == "]":
            if stack:
                closing[stack.pop()] = i
        else:  # a newline ends every open bracket
            stack.clear()
    for m in reversed(openers):
        end = closing.get(m.end() - 1)
        if end is not None:
            return m.group(1).lower(), text[m.end() : end].strip().lower()
    return None


class WebShopEnv(TextEnv):
    """The WebShop text environment (see the module docstring).

    Args:
        products_path: ``items_shuffle*.json``; None uses the embedded generated catalogue.
        attributes_path: ``items_ins_v2*.json`` (attributes and synthetic instructions).
        human_path: ``items_human_ins.json`` (human instructions).
        num_products: use the first N products of the file (or generate N products).
        goals: ``"auto"`` (human when ``human_path`` is given, else synthetic),
            ``"synthetic"`` or ``"human"``.
        split: the split a reset without a goal samples from: test, eval, train or all.
        price_seed: names the prices drawn inside price ranges and the goals' price caps.
        catalogue_seed: seed of the generated catalogue.
        show_attrs: show the item page's ``Attributes`` button (off in the original).
        show_admissible: end every observation with the admissible actions, each element
            written as the page shows it (``"\\n\\nAdmissible actions: search[<query>],
            click[Back to Search], click[B0V1096J0Q], ..."``), as prompts for LLM agents
            often list them; the done page has none and is left as is. Off by default
            (the original's text).
        search_anywhere: accept ``search[...]`` on every page, as the original's text env
            does; by default only on the page with the search bar.
        invalid_feedback: say why an action was invalid before the page text (otherwise
            the page is shown unchanged, as the original).
        max_query_chars: longer queries are invalid actions.
        reward: what a purchase returns: ``"score"`` (the graded purchase score in [0, 1], the
            original's reward) or ``"success"`` (1 when the score is 1, else 0: the success
            rule the reported success rate counts, which some RL recipes train on). The
            measures report both either way.
        max_turns: actions before truncation (default 15).
        cache_root: where built caches go (default: the twice_envs cache directory).
        render_mode: ``None`` or ``"ansi"`` (``render()`` gives the current page).
    """

    version = "1"
    default_max_turns = 15
    reset_options = _RESET_OPTIONS
    path_kwargs = ("cache_root",)

    def __init__(
        self,
        *,
        products_path: Optional[str] = None,
        attributes_path: Optional[str] = None,
        human_path: Optional[str] = None,
        num_products: Optional[int] = None,
        goals: str = "auto",
        split: str = "train",
        price_seed: int = 0,
        catalogue_seed: int = 0,
        show_attrs: bool = False,
        show_admissible: bool = False,
        search_anywhere: bool = False,
        invalid_feedback: bool = True,
        max_query_chars: int = 500,
        reward: str = "score",
        max_turns: Optional[int] = None,
        cache_root: Optional[str] = None,
        render_mode: Optional[str] = None,
    ) -> None:
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        if max_query_chars < 1:
            raise ValueError("max_query_chars must be >= 1")
        self.res: Resources = get_resources(
            products_path, attributes_path, human_path, num_products, goals, price_seed, catalogue_seed, cache_root
        )
        self.res.goals.check_usable(split, products_path, attributes_path, human_path)
        self.split = split
        self.price_seed = int(price_seed)
        self.show_attrs = bool(show_attrs)
        if not isinstance(show_admissible, bool):
            raise ValueError(f"show_admissible must be True or False, got {show_admissible!r}")
        self.show_admissible = show_admissible
        self.search_anywhere = bool(search_anywhere)
        self.invalid_feedback = bool(invalid_feedback)
        self.max_query_chars = int(max_query_chars)
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {', '.join(REWARDS)}, got {reward!r}")
        self.reward = reward
        self._state: tuple = ()

    # ------------------------------------------------------------------ contract
    def protocol(self) -> Protocol:
        return Protocol(instructions=INSTRUCTIONS, stop=("\nObservation:",), action_format="search[<query>] | click[<element>]")

    def _spawn(self) -> "WebShopEnv":
        """A fresh env with this one's configuration and shared read-only resources.

        Equivalent to ``make(self.spec.id, **self.spec.kwargs)`` (the resources would come
        from the per-process cache anyway) without re-validating kwargs, which is most of
        a fork's cost.
        """
        if self.spec is None:
            return super()._spawn()
        child = object.__new__(type(self))
        child.__dict__.update(self.__dict__)
        child._traj, child._schedule, child._snapshots = None, None, []
        child._done, child._last_info, child._state = False, {}, ()
        child._np_random, child._np_random_seed = None, None  # reseeded by the restore or replay
        return child

    def _snapshot(self) -> Any:
        return self._state

    def _restore(self, state: Any) -> None:
        self._state = state
        self._goal = self.res.goals[state[0]]

    def close(self) -> None:
        """Release what this env holds (the record and ``goal`` stay readable).

        The snapshots (a rendered page per turn) are dropped, and so is the env's
        reference to the shared catalogue (with its record file map) and search index: a
        closed env kept alive pins none of them. They stay cached in the process for the
        next ``make`` (``resources.clear_process_cache()`` forgets them).
        """
        self.res = None
        self._snapshots = []
        super().close()

    @property
    def goal(self) -> Goal:
        """The current episode's goal."""
        return self._goal

    # state layout: (goal, kind, query, results, page_no, item, options, sub, obs, clicks, has_search, done_info)
    def _set(self, goal_idx, kind, query="", results=(), page_no=1, item=-1, options=(), sub="", done_info=None):
        instruction = self._goal.instruction_text
        cat = self.res.catalogue
        if kind == "search":
            obs, clicks = pages.render_search(instruction)
        elif kind == "results":
            obs, clicks = pages.render_results(instruction, cat, results, page_no)
        elif kind == "item":
            obs, clicks = pages.render_item(instruction, cat[item], self.show_attrs)
        elif kind == "sub":
            obs, clicks = pages.render_sub(instruction, cat[item], sub)
        else:
            obs, clicks = pages.render_done(cat[item].asin, options, dict(done_info)["reward"])
        self._state = (
            goal_idx, kind, query, tuple(results), page_no, item, tuple(options), sub, obs, tuple(clicks),
            kind == "search" or self.search_anywhere, done_info,
        )
        return obs

    def _info(self) -> dict:
        s = self._state
        clicks = pages.clickable_map(list(s[9]))
        info = {
            "admissible_actions": pages.admissible(s[10], clicks),
            "page": s[1],
            "goal": s[0],
            "instruction": self._goal.instruction_text,
        }
        if s[11] is not None:
            details = dict(s[11])
            details["options"] = [list(o) for o in details["options"]]
            info["reward_details"] = details
        return info

    def measures(self, info: dict, total_reward: float) -> dict[str, float]:
        """Success (the purchase scores 1, WebShop's success rate) and the score (the purchase's graded
        score, whichever ``reward`` the env returns)."""
        details = info.get("reward_details")
        score = float(details["reward"]) if details else 0.0
        return {"success": float(score >= 1.0 - 1e-9), "score": score}

    def _reset(self, options: dict) -> tuple[str, dict]:
        goals = self.res.goals
        if "goal" in options:
            g = options["goal"]
            if not isinstance(g, int) or isinstance(g, bool) or not 0 <= g < len(goals):
                raise ValueError(f"options['goal'] must be an int in 0..{len(goals) - 1} ({len(goals)} goals), got {g!r}")
            idx = g
        elif "index" in options:
            r = goals.split_range(options.get("split", self.split))
            k = options["index"]
            if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k < len(r):
                raise ValueError(f"options['index'] must be an int in 0..{len(r) - 1} for this split, got {k!r}")
            idx = r.start + k
        else:
            idx = goals.sample(self.np_random, options.get("split", self.split))
        self._goal = goals[idx]
        obs = self._set(idx, "search")
        return self._shown(obs), self._info()

    def _shown(self, obs: str) -> str:
        """The observation as the agent sees it (with the admissible actions when asked)."""
        if not self.show_admissible:
            return obs
        acts = pages.admissible(self._state[10], pages.clickable_map(list(self._state[9])), as_shown=True)
        return with_actions(obs, acts) if acts else obs

    # ------------------------------------------------------------------ dynamics
    def _invalid(self, reason: str) -> tuple[str, float, bool, dict]:
        page = self._state[8]
        obs = f"Invalid action: {reason}{pages.SEP}{page}" if self.invalid_feedback else page
        info = self._info()
        info["invalid"] = True
        info["error"] = reason
        return obs, 0.0, False, info

    def _step(self, action: str) -> tuple[str, float, bool, dict]:
        obs, reward, terminated, info = self._act(action)
        return self._shown(obs), reward, terminated, info

    def _act(self, action: str) -> tuple[str, float, bool, dict]:
        parsed = parse_action(action)
        if parsed is None:
            return self._invalid("no action found; write search[<query>] or click[<element>]")
        name, arg = parsed
        goal_idx, kind, query, results, page_no, item, options, sub, _, clicks, has_search, _ = self._state
        if name == "search":
            if not has_search:
                return self._invalid("there is no search bar on this page; click[back to search] first")
            if not arg:
                return self._invalid("the search query is empty")
            if len(arg) > self.max_query_chars:
                return self._invalid(f"the search query is longer than {self.max_query_chars} characters")
            # the original splits keywords on spaces and joins them again
            hits = self.res.index.search(arg, TOP_K)
            obs = self._set(goal_idx, "results", arg, hits, 1)
            return obs, 0.0, False, self._info()
        cmap = pages.clickable_map(list(clicks))
        target = cmap.get(arg)
        if target is None or arg == "search":
            shown = arg if len(arg) <= 80 else arg[:77] + "..."
            return self._invalid(f"'{shown}' is not a clickable element of this page")
        if arg == "buy now":
            return self._buy(goal_idx, item, options)
        if arg == "back to search":
            return self._set(goal_idx, "search"), 0.0, False, self._info()
        if arg == "next >" and kind == "results":
            return self._set(goal_idx, "results", query, results, page_no + 1), 0.0, False, self._info()
        if arg == "< prev" and kind == "results":
            return self._set(goal_idx, "results", query, results, page_no - 1), 0.0, False, self._info()
        if arg == "< prev" and kind == "sub":
            return self._set(goal_idx, "item", query, results, page_no, item, options), 0.0, False, self._info()
        if arg == "< prev" and kind == "item":
            return self._set(goal_idx, "results", query, results, page_no), 0.0, False, self._info()
        if arg in ("description", "features", "reviews", "attributes"):
            return self._set(goal_idx, "sub", query, results, page_no, item, options, arg.capitalize()), 0.0, False, self._info()
        if target.kind == "product":
            obs = self._set(goal_idx, "item", query, results, page_no, int(target.payload), options)
            return obs, 0.0, False, self._info()
        if target.kind == "option":
            chosen = dict(options)
            chosen[str(target.payload)] = arg
            obs = self._set(goal_idx, "item", query, results, page_no, item, tuple(chosen.items()))
            return obs, 0.0, False, self._info()
        return self._invalid(f"'{arg}' does nothing on this page")  # pragma: no cover - every element is routed above

    def _buy(self, goal_idx: int, item: int, options: tuple) -> tuple[str, float, bool, dict]:
        product = self.res.catalogue[item]
        goal = self._goal
        details = get_reward(
            product,
            product_price(product, self.price_seed),
            [v for _, v in options],
            goal_query=goal.query,
            goal_product_category=goal.product_category,
            goal_name=goal.name,
            goal_attributes=goal.attributes,
            goal_options=goal.options_for_reward(),
            price_upper=goal.price_upper,
        )
        done = details.to_json()
        done["purchased"] = product.asin
        done["target"] = goal.asin
        done["options"] = tuple(options)
        # stored as a tuple of pairs: the state stays immutable, so snapshots can share it
        obs = self._set(goal_idx, "done", item=item, options=options, done_info=tuple(done.items()))
        reward = details.reward if self.reward == "score" else float(details.reward >= 1.0 - 1e-9)
        return obs, reward, True, self._info()
