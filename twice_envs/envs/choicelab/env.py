"""ChoiceLab-v0: many tasks, each a long run of choices among items; the reward is the share chosen right.

The world (:class:`ChoiceLabConfig`) holds ``tasks`` tasks. A task is ``horizon`` choices; choice ``t`` of
task ``k`` offers ``options`` items, each described by ``per_option`` attribute words out of a vocabulary of
``attributes`` (``red``, ``round``, ...). A hidden preference gives every attribute a weight; the right item
of a choice is the one whose attributes weigh most. The agent answers each choice with ``choose N`` (``N``
an offered item's number); the observation repeats the chosen item's number (never whether it was right)
and shows the next offers. After the last choice the episode ends with its only reward, the share of
choices it got right. Nothing the agent does changes what it is offered next, so every episode of a task
meets the same choices, and only the share it gets right depends on it.

Every item of the world has its own number (``config.item(task, step, option)``), so a choice's item
names its task, its step and its place among the offers (:meth:`ChoiceLabConfig.locate`). A task is
picked at reset: ``options={"task": k}``, else drawn from the reset seed. An action that is not
``choose N`` (or a bare ``N``) with ``N`` among the current offers wastes the choice (it counts as wrong)
with ``info["invalid"] = True``; nothing raises.

The world is a pure function of the config (:func:`world`, cached), which the credit lab's dynamic
programme reuses for exact values (:mod:`twice_envs.agents.lab.choice_lab`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple, Optional

import numpy as np

from twice_envs.core import Protocol, TextEnv

#: The attribute words (the first ``attributes`` of them are the world's vocabulary).
ATTRIBUTES = ("red", "blue", "green", "small", "large", "round", "square", "soft", "hard", "light", "heavy",
              "cheap", "dear", "old", "new", "warm", "cold", "wet", "dry", "bright", "dark", "sweet", "sour",
              "loud", "quiet", "fast", "slow", "thin", "thick", "long", "short", "smooth")
#: A choice an unparseable action (or an item not on offer) made: it counts as wrong.
INVALID = -1
#: The largest world (entries of its ``tasks x horizon x options x attributes`` table) a config may describe.
MAX_WORLD = 16_000_000


@dataclass(frozen=True)
class ChoiceLabConfig:
    """The world of a ChoiceLab env."""

    tasks: int = 256
    """Tasks in the world (the task distribution is uniform over them)."""
    horizon: int = 16
    """Choices per task (the episode's turns)."""
    options: int = 8
    """Items offered per choice."""
    attributes: int = 32
    """Attribute words in the vocabulary (at most ``len(ATTRIBUTES)``)."""
    per_option: int = 4
    """Attribute words describing each item (distinct)."""
    seed: int = 0
    """Seed of the items' attributes and of the hidden preference."""

    def __post_init__(self) -> None:
        for name in ("tasks", "horizon", "options", "attributes", "per_option", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ValueError(f"ChoiceLab {name} must be an int, got {v!r}")
        if self.tasks < 1 or self.horizon < 1 or self.options < 2 or self.seed < 0:
            raise ValueError(f"ChoiceLab needs tasks >= 1, horizon >= 1, options >= 2 and seed >= 0; got tasks="
                             f"{self.tasks}, horizon={self.horizon}, options={self.options}, seed={self.seed}")
        if not 1 <= self.per_option <= self.attributes <= len(ATTRIBUTES):
            raise ValueError(f"ChoiceLab needs 1 <= per_option <= attributes <= {len(ATTRIBUTES)}; got per_option="
                             f"{self.per_option}, attributes={self.attributes}")
        if self.world_size > MAX_WORLD:
            raise ValueError(f"ChoiceLab world too large: {self.world_size:,} entries (tasks x horizon x options x "
                             f"attributes) > cap {MAX_WORLD:,}; lower tasks, horizon, options or attributes")

    @property
    def world_size(self) -> int:
        """Entries of the world's feature table (``tasks x horizon x options x attributes``)."""
        return self.tasks * self.horizon * self.options * self.attributes

    def item(self, task: int, step: int, option: int) -> int:
        """The number of the ``option``-th item offered at choice ``step`` of ``task``."""
        return (task * self.horizon + step) * self.options + option

    def locate(self, item: int) -> tuple[int, int, int]:
        """``(task, step, option)`` of an item number (the inverse of :meth:`item`)."""
        rest, option = divmod(int(item), self.options)
        task, step = divmod(rest, self.horizon)
        return task, step, option

    def action_text(self, item: int) -> str:
        return f"choose {item}"


class World(NamedTuple):
    """The world's tables (see :func:`world`)."""

    attrs: np.ndarray
    """``(tasks, horizon, options, per_option)``: each item's attribute ids, sorted."""
    features: np.ndarray
    """``(tasks, horizon, options, attributes)``: each item's attributes as a 0/1 vector."""
    preference: np.ndarray
    """``(attributes,)``: the hidden weight of every attribute."""
    right: np.ndarray
    """``(tasks, horizon)``: the right option of every choice (the one whose attributes weigh most)."""


@lru_cache(maxsize=8)
def world(config: ChoiceLabConfig) -> World:
    """The world of ``config`` (seeded, the same in every process; cached per config)."""
    c = config
    rng = np.random.default_rng([c.seed, 0xC401CE])
    attrs = np.sort(np.argsort(rng.random((c.tasks, c.horizon, c.options, c.attributes)), axis=-1)[..., :c.per_option],
                    axis=-1)
    features = np.zeros((c.tasks, c.horizon, c.options, c.attributes))
    np.put_along_axis(features, attrs, 1.0, axis=-1)
    preference = rng.standard_normal(c.attributes)
    right = np.argmax(features @ preference, axis=-1)
    for a in (attrs, features, preference, right):
        a.flags.writeable = False
    return World(attrs, features, preference, right)


def parse_choice(config: ChoiceLabConfig, text: str) -> int:
    """The item number of ``choose N`` (or a bare ``N``; ``#N`` also reads), else ``INVALID``."""
    words = text.strip().lower().split()
    if len(words) == 2 and words[0] == "choose":
        words = words[1:]
    if len(words) != 1:
        return INVALID
    w = words[0].removeprefix("#")
    if not (w.isascii() and w.isdigit()) or len(w) > 18:  # ASCII digits, short enough to convert
        return INVALID
    return int(w) if int(w) < config.tasks * config.horizon * config.options else INVALID


def outcome(config: ChoiceLabConfig, task: int, choices) -> float:
    """The reward of ``choices`` (option indices, ``INVALID`` for a wasted choice) on ``task``: the share right."""
    right = world(config).right[task]
    return sum(1 for t, a in enumerate(choices) if a == right[t]) / config.horizon


class ChoiceLabEnv(TextEnv):
    """Many tasks of ``horizon`` choices among items; the reward is the share chosen right (see the module)."""

    version = "1"
    reset_options = ("task",)
    #: The credit lab holds an exact oracle for its policy here (credit methods that use exact advantages run).
    has_exact_values = True

    def __init__(self, *, tasks: int = 256, horizon: int = 16, options: int = 8, attributes: int = 32,
                 per_option: int = 4, seed: int = 0, max_turns: Optional[int] = None,
                 render_mode: Optional[str] = None) -> None:
        self.config = ChoiceLabConfig(tasks, horizon, options, attributes, per_option, seed)
        self.world = world(self.config)
        super().__init__(max_turns=max_turns if max_turns is not None else horizon, render_mode=render_mode)

    def protocol(self) -> Protocol:
        c = self.config
        return Protocol(
            instructions=(f"Make {c.horizon} choices. Each time, pick the item the customer prefers among the "
                          f"{c.options} offered: reply 'choose N' with N the item's number. Your reward is the share "
                          "of choices you got right, given at the end."),
            stop=("\n",),
            action_format="choose N",
        )

    def offers(self) -> str:
        """The current choice as text: its step and every offered item's number and attributes."""
        c, t = self.config, len(self.choices)
        items = [f"#{c.item(self.task, t, o)} {' '.join(ATTRIBUTES[i] for i in self.world.attrs[self.task, t, o])}"
                 for o in range(c.options)]
        return f"Task {self.task}, choice {t + 1} of {c.horizon}: " + " | ".join(items)

    def _info(self) -> dict:
        c, t = self.config, len(self.choices)
        offered = [c.action_text(c.item(self.task, t, o)) for o in range(c.options)] if t < c.horizon else []
        return {"admissible_actions": offered, "task": self.task, "choices": list(self.choices)}

    def _reset(self, options: dict) -> tuple[str, dict]:
        task = options.get("task")
        if task is None:
            task = int(self.np_random.integers(self.config.tasks))
        elif isinstance(task, bool) or not isinstance(task, int) or not 0 <= task < self.config.tasks:
            raise ValueError(f"ChoiceLab reset option 'task' must be an int in 0..{self.config.tasks - 1}, "
                             f"got {task!r}")
        self.task = task
        self.choices: list[int] = []
        return self.protocol().instructions + "\n" + self.offers(), self._info()

    def parse(self, action: str) -> int:
        """The offered option an action picks (its index among the current offers), else ``INVALID``."""
        item = parse_choice(self.config, action)
        if item == INVALID:
            return INVALID
        task, step, option = self.config.locate(item)
        return option if (task, step) == (self.task, len(self.choices)) else INVALID

    def _step(self, action: str) -> tuple[str, float, bool, dict]:
        c = self.config
        a = self.parse(action)
        self.choices.append(a)
        done = len(self.choices) >= c.horizon
        reward = outcome(c, self.task, self.choices) if done else 0.0
        if a == INVALID:
            said = f"Invalid action {action.strip()[:30]!r}: reply 'choose N' with N an offered item. Choice wasted."
        else:
            said = f"You chose #{c.item(self.task, len(self.choices) - 1, a)}."
        nxt = f"Done: {round(reward * c.horizon)} of {c.horizon} choices right." if done else self.offers()
        obs = said + "\n" + nxt
        info = self._info()
        if a == INVALID:
            info["invalid"] = True
        return obs, reward, done, info

    def _snapshot(self):
        return (self.task, tuple(self.choices))

    def _restore(self, state) -> None:
        self.task, self.choices = state[0], list(state[1])
