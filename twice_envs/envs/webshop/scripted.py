"""Reference agents for WebShop: a scripted shopper and a random one.

Both read only what an agent sees (the observation and ``info``), never the goal. Both write
a click as the page shows the element (``click[B0V1096J0Q]``, ``click[Buy Now]``), not as
``admissible_actions`` lists it (lower case): the env lower-cases arguments, and a model
trained on these transcripts can then copy the element from the page.

* :class:`ScriptedAgent`: search the instruction text; open the first result; click every
  option value that the instruction names (the longest first, so ``navy blue`` wins over
  ``blue``; one value per option group as far as the page shows it); buy.
* :class:`RandomAgent`: search the instruction text, then click uniformly at random
  among the admissible actions (seeded).

``scripted_turns`` mixes the two for warm-start transcripts; ``reassigned_ids`` (the
transcript augmenter of ``twice models build-tiny``) writes copies of them with the product
ids swapped for other catalogue ids.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from twice_envs.envs.admissible import without_actions
from twice_envs.envs.mistakes import Mistake, marked_like
from twice_envs.envs.webshop.pages import SEP


def _clicks(info: dict) -> list[str]:
    return [a[6:-1] for a in info.get("admissible_actions", []) if a.startswith("click[")]


def _option_values(info: dict) -> list[str]:
    """Clickable option values: they follow ``buy now`` in the item page's clickables."""
    clicks = _clicks(info)
    if "buy now" not in clicks:
        return []
    return clicks[clicks.index("buy now") + 1 :]


def _click(obs: str, element: str) -> str:
    """``click[element]`` with ``element`` written as the page shows it (its case), where the page shows it."""
    for seg in without_actions(obs).split(SEP):
        if seg.lower() == element:
            return f"click[{seg}]"
    return f"click[{element}]"


def _mentions(text: str, value: str) -> bool:
    return re.search(r"(?<![\w])" + re.escape(value) + r"(?![\w])", text) is not None


@dataclass
class ScriptedAgent:
    """Search the instruction, open the first result, click the named options, buy."""

    _chosen: list[str] = field(default_factory=list)

    def reset(self) -> None:
        self._chosen = []

    def act(self, obs: str, info: dict) -> str:
        instruction = info.get("instruction", "").lower()
        page = info.get("page")
        if page == "search":
            self._chosen = []
            return f"search[{instruction}]"
        clicks = _clicks(info)
        if page == "results":
            products = [c for c in clicks if c not in ("back to search", "next >", "< prev")]
            return _click(obs, products[0] if products else "back to search")
        if page == "sub":
            return _click(obs, "< prev")
        if page == "item":
            wanted = sorted((v for v in _option_values(info) if _mentions(instruction, v)), key=len, reverse=True)
            for v in wanted:
                # a shorter value inside a chosen longer one ("blue" in "navy blue") is the same mention
                if v not in self._chosen and not any(_mentions(c, v) for c in self._chosen):
                    self._chosen.append(v)
                    return _click(obs, v)
            return _click(obs, "buy now")
        return _click(obs, "back to search")


@dataclass
class RandomAgent:
    """Search the instruction, then click uniformly at random (seeded)."""

    seed: int = 0
    rng: Optional[np.random.Generator] = None

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def reset(self) -> None:
        pass

    def act(self, obs: str, info: dict) -> str:
        if info.get("page") == "search":
            return f"search[{info.get('instruction', '').lower()}]"
        clicks = _clicks(info)
        if not clicks:
            return _click(obs, "back to search")
        return _click(obs, clicks[int(self.rng.integers(len(clicks)))])


def evaluate(env, agent, seeds, options: Optional[dict] = None) -> dict:
    """Mean reward and success rate (reward 1) of ``agent`` over one episode per seed."""
    rewards = []
    for s in seeds:
        agent.reset()
        obs, info = env.reset(seed=int(s), options=options)
        total, done = 0.0, False
        while not done:
            obs, r, term, trunc, info = env.step(agent.act(obs, info))
            total += r
            done = term or trunc
        rewards.append(total)
    arr = np.asarray(rewards)
    return {"episodes": len(arr), "mean_reward": float(arr.mean()), "success_rate": float((arr >= 1.0 - 1e-9).mean())}


#: The shopper of each env being scripted by :func:`scripted_turns`, by ``id(env)`` (reset at turn 0).
_SHOPPERS: dict[int, ScriptedAgent] = {}


def scripted_turns(env, rng: np.random.Generator, skill: float = 1.0) -> str:
    """The next turn of a shopper with mistake rate ``1 - skill``: the scripted shopper's action with
    probability ``skill``, else a random click, marked as a :class:`~twice_envs.envs.mistakes.Mistake`
    (searches are never replaced).

    The ``f(env, rng, skill)`` form the tiny model's transcript writer takes.
    """
    obs, info = env.trajectory.observations[-1], env.last_info
    if env.turn == 0:
        _SHOPPERS[id(env)] = ScriptedAgent()
    agent = _SHOPPERS.setdefault(id(env), ScriptedAgent())
    if rng.random() < skill or info.get("page") == "search":
        return agent.act(obs, info)
    rand = RandomAgent(seed=int(rng.integers(1 << 31)))
    return Mistake(rand.act(obs, info))


def catalogue_ids(env) -> list[str]:
    """The product ids of ``env``'s catalogue (whole tokens of a tiny model: pages show them, clicks copy them)."""
    catalogue = env.unwrapped.res.catalogue
    return [catalogue[i].asin for i in range(len(catalogue))]


#: A word that may be a product id (ids are checked against the catalogue before one is swapped).
_ID_LIKE = re.compile(r"\b[A-Za-z0-9]{10}\b")


def reassigned_ids(env, episodes: list, copies: int, rng: np.random.Generator) -> list:
    """``copies`` variants of each scripted episode ``(first_obs, [(action, obs), ...])`` in which the
    product ids are swapped, one to one and the same way in every text of the episode, for ids
    drawn at random from ``env``'s catalogue (an id keeps the case it is written in).

    The play stays right (each click names the product it named, under its new id), but an id
    no longer goes with its product: a model trained on the copies must copy the ids from the
    page instead of recalling which id the products of a search had in training.
    """
    pool = catalogue_ids(env)
    known = {a.upper() for a in pool}
    out = []
    for first_obs, turns in episodes:
        texts = [first_obs] + [t for pair in turns for t in pair]
        used = sorted({w.upper() for t in texts for w in _ID_LIKE.findall(t) if w.upper() in known})
        for _ in range(copies):
            drawn = rng.choice(len(pool), size=len(used), replace=False)
            table = {old: pool[int(j)] for old, j in zip(used, drawn)}

            def swap(text: str) -> str:
                def one(m: re.Match) -> str:
                    new = table.get(m[0].upper())
                    if new is None:
                        return m[0]
                    return new.lower() if m[0].islower() else new

                return _ID_LIKE.sub(one, text)

            out.append((swap(first_obs), [(marked_like(a, swap(a)), swap(o)) for a, o in turns]))
    return out


__all__ = ["RandomAgent", "ScriptedAgent", "evaluate", "reassigned_ids", "scripted_turns"]
