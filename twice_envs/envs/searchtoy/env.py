"""SearchToy-v0: find every fact by searching, then answer; small enough for exact values.

The world has ``hops`` facts and ``queries`` search queries ``q0 .. q{queries-1}``.
Query ``j < useful`` retrieves fact ``j % hops``; the others retrieve nothing. Each
turn the agent either searches (``search q3``) or answers (``answer``). Answering, or
reaching ``horizon`` turns, ends the episode with its only reward: 1 when every fact
was found (``reward="binary"``) or the share of facts found (``reward="graded"``).

Observations are evidence, not labels: every useless query shows the same text, and a
fact found twice shows the same text as the first time, so different actions often
give the same observation (as in a real search env). An unparseable action wastes the
turn with ``info["invalid"] = True``.

The dynamics are the pure functions :func:`parse_action`, :func:`transition` and
:func:`outcome`, which the credit lab's dynamic programme reuses to compute exact
values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from twice_envs.core import Protocol, TextEnv

#: Action index of ``answer`` is ``queries``; an unparseable action is ``INVALID``.
INVALID = -1
REWARDS = ("binary", "graded")


@dataclass(frozen=True)
class SearchToyConfig:
    """The world of a SearchToy env: ``SearchToy-v0``'s and ``TextLab-v0``'s kwargs.

    It is the one definition of the world: the credit lab's settings hold one (as their ``world``)
    rather than copy its fields.
    """

    hops: int = 3
    """Facts to find."""
    queries: int = 8
    """Search queries available."""
    useful: int = 4
    """Queries that retrieve a fact (query ``j < useful`` finds fact ``j % hops``)."""
    horizon: int = 10
    """Turns after which the episode ends as if answered."""
    reward: str = "binary"
    """``binary``: 1 when every fact was found; ``graded``: the share found."""

    def __post_init__(self) -> None:
        if not 1 <= self.hops <= 10:
            raise ValueError(f"hops must be in 1..10, got {self.hops}")
        if not 1 <= self.useful <= self.queries:
            raise ValueError(f"need 1 <= useful <= queries, got useful={self.useful}, queries={self.queries}")
        if self.useful < self.hops:
            raise ValueError(f"useful ({self.useful}) < hops ({self.hops}): some fact could never be found")
        if self.horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {self.horizon}")
        if self.reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {self.reward!r}")

    @property
    def num_actions(self) -> int:
        """Queries plus ``answer``."""
        return self.queries + 1

    def action_text(self, a: int) -> str:
        return "answer" if a == self.queries else f"search q{a}"


def parse_action(config: SearchToyConfig, text: str) -> int:
    """The action index of ``text`` (``INVALID`` when it is not ``search qJ`` or ``answer``)."""
    words = text.strip().lower().split()
    if words == ["answer"]:
        return config.queries
    if len(words) == 2 and words[0] == "search" and words[1][:1] == "q" and words[1][1:].isdigit():
        j = int(words[1][1:])
        if j < config.queries:
            return j
    return INVALID


def transition(config: SearchToyConfig, found: int, action: int) -> int:
    """The found-facts bitmask after ``action``."""
    if 0 <= action < config.useful:
        return found | (1 << (action % config.hops))
    return found


def outcome(config: SearchToyConfig, found: int) -> float:
    """The reward of ending with the facts ``found`` (a bitmask)."""
    n = bin(found).count("1")
    if config.reward == "graded":
        return n / config.hops
    return 1.0 if n == config.hops else 0.0


class SearchToyEnv(TextEnv):
    """Search for ``hops`` facts, then answer (see the module)."""

    version = "1"
    has_gold_answer = True
    #: The credit lab holds an exact oracle for its policies here (SearchToy's and TextLab's).
    has_exact_values = True

    def __init__(self, *, hops: int = 3, queries: int = 8, useful: int = 4, horizon: int = 10,
                 reward: str = "binary", max_turns: Optional[int] = None,
                 render_mode: Optional[str] = None) -> None:
        self.config = SearchToyConfig(hops, queries, useful, horizon, reward)
        super().__init__(max_turns=max_turns if max_turns is not None else horizon, render_mode=render_mode)

    def protocol(self) -> Protocol:
        c = self.config
        return Protocol(
            instructions=(f"Find {c.hops} facts with 'search qJ' (J in 0..{c.queries - 1}), then 'answer'. "
                          f"At most {c.horizon} turns."),
            stop=("\n",),
            action_format="search qJ | answer",
        )

    def _info(self) -> dict:
        c = self.config
        return {"admissible_actions": [c.action_text(a) for a in range(c.num_actions)],
                "found": self.found, "history": list(self.history)}

    def _reset(self, options: dict) -> tuple[str, dict]:
        self.found = 0
        self.history: list[int] = []
        return self.protocol().instructions, self._info()

    def parse(self, action: str) -> int:
        """The action index of an action string (``INVALID`` when it is none)."""
        return parse_action(self.config, action)

    def gold_answers(self) -> tuple[str, ...]:
        """The text of the answer action (``answer``): the only action that answers."""
        return (self.config.action_text(self.config.queries),)

    def invalid_observation(self, action: str) -> str:
        """What the agent sees after an action :meth:`parse` rejected."""
        return f"Invalid action {action.strip()[:20]!r}: write 'search qJ' or 'answer'. Turn wasted."

    def _step(self, action: str) -> tuple[str, float, bool, dict]:
        c = self.config
        a = self.parse(action)
        self.history.append(a)
        if a == INVALID:
            obs = self.invalid_observation(action)
        elif a == c.queries:
            obs = f"Answered with {bin(self.found).count('1')} of {c.hops} facts."
        else:
            self.found = transition(c, self.found, a)
            obs = f"Result: fact {a % c.hops}." if a < c.useful else "Result: nothing relevant."
        done = a == c.queries or len(self.history) >= c.horizon
        reward = outcome(c, self.found) if done else 0.0
        info = self._info()
        if a == INVALID:
            info["invalid"] = True
        return obs, reward, done, info

    def _snapshot(self):
        return (self.found, tuple(self.history))

    def _restore(self, state) -> None:
        self.found, self.history = state[0], list(state[1])
