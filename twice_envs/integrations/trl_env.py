"""A twice env for TRL's env-owned API: ``GRPOTrainer(environment_factory=Env("SearchQA-v0"))``.

TRL (checked with 1.16) calls the factory with no arguments, once per rollout, and for each row of
a batch calls ``reset(**row)``: the returned text is appended to the row's last user message. The
public methods of the class become the model's tools (their type hints and ``Args:`` docstrings are
the schema), and ``get_reward()`` scores each finished rollout. :func:`Env` makes that class for a
registered env id:

    from twice_envs.integrations.trl import Env, seed_dataset
    trainer = GRPOTrainer(model=..., args=GRPOConfig(num_generations=4, ...),
                          environment_factory=Env("SearchQA-v0", reward="cost_f1"),
                          train_dataset=seed_dataset(256))

TRL repeats each row ``num_generations`` times and does not tell ``reset`` which copies belong
together, so the row names the start state: a ``seed`` column (an int), optionally with an
``options`` column (the env's reset options), or a ``task`` column (``{"seed": s, "options": {...}}``,
as a dict or as the JSON text ``trl.task_prompt`` writes). Every generation of a row then starts
from the same first observation and digest. A row with neither is refused: a start state drawn at
random would give every generation of a group a different task.

The tools: SearchQA envs get ``search(query)`` and ``answer(text)``; every other env one
``act(action)`` that takes a turn in the env's own action format (the first observation states it).
A tool returns the env's next observation; a call after the episode ended is refused with a message
the model sees. ``get_reward()`` is the episode's return so far (0 when no tool was called).
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Optional

import twice_envs
from twice_envs._deps import require
from twice_envs.core import TextEnv

class RowError(ValueError):
    """A dataset row that does not name a start state (the column is named)."""


def start_of(row: dict) -> tuple[int, dict]:
    """The ``(seed, options)`` a dataset row names, or :class:`RowError` naming the column."""
    task = row.get("task")
    if task is not None:
        if isinstance(task, str):
            try:
                task = json.loads(task)
            except ValueError:
                raise RowError(f"column 'task' must be JSON text or a dict with 'seed', got {task[:80]!r}") from None
        if not isinstance(task, dict) or "seed" not in task:
            raise RowError(f"column 'task' must hold {{'seed': int, 'options': {{...}}}}, got {task!r:.80}")
        seed, options, where = task["seed"], task.get("options"), "task['seed']"
    elif row.get("seed") is not None:
        seed, options, where = row["seed"], row.get("options"), "seed"
    else:
        raise RowError("a row must name its start state in a 'seed' column (with optional 'options') or a 'task' "
                       f"column, so that every generation of the row plays the same episode; got columns "
                       f"{sorted(row)}")
    item = getattr(seed, "item", None)  # numpy and torch integers from a dataset
    seed = item() if callable(item) and not isinstance(seed, (int, bool)) else seed
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 64:
        raise RowError(f"column {where} must be an int in 0..2**64-1, got {seed!r}")
    if options is not None and not isinstance(options, dict):
        raise RowError(f"column 'options' must be a dict of reset options, got {type(options).__name__}")
    return seed, {k: v for k, v in (options or {}).items() if v is not None}  # datasets fills absent keys with None


class TwiceTRLEnv:
    """One rollout's env for TRL: ``reset(**row)``, the tools of a subclass, ``get_reward()``.

    Subclasses made by :func:`Env` set :attr:`env_id` and :attr:`env_kwargs`. The env is made on the
    first reset and reused by later ones (TRL pools instances across batches).
    """

    env_id: str = ""
    env_kwargs: dict = {}

    def __init__(self) -> None:
        self._env: Optional[TextEnv] = None
        self._return = 0.0

    @property
    def env(self) -> Optional[TextEnv]:
        """The twice env (``None`` before the first reset): its trajectory, digest and noise keys."""
        return self._env

    def reset(self, **row: Any) -> str:
        """Start the episode the row names (:func:`start_of`) and return its first observation."""
        seed, options = start_of(row)
        if self._env is None:
            self._env = twice_envs.make(self.env_id, **self.env_kwargs)
        text, _ = self._env.reset(seed=seed, options=options or None)
        self._return = 0.0
        return text

    def get_reward(self) -> float:
        """The episode's return so far (the sum of its step rewards)."""
        return self._return

    def _turn(self, text: str) -> str:
        env = self._env
        if env is None or env._traj is None:
            raise RuntimeError("the env has no episode: TRL calls reset(**row) before any tool")
        if env.done:
            raise RuntimeError(f"the episode is over after {env.trajectory.num_turns} turns: no more tool calls")
        observation, reward, _, _, _ = env.step(text)
        self._return += float(reward)
        return observation


class ActEnv(TwiceTRLEnv):
    """The tool set of any env: one ``act`` in the env's own action format."""

    def act(self, action: str) -> str:
        """Take one turn in the environment.

        Args:
            action: The action, written in the format the task description states.

        Returns:
            The environment's next observation.
        """
        return self._turn(action)


class SearchQAEnv(TwiceTRLEnv):
    """The tool set of the SearchQA envs: ``search`` and ``answer``."""

    def search(self, query: str) -> str:
        """Search the corpus and read the top passages.

        Args:
            query: What to search for.

        Returns:
            The top passages, between <information> and </information>.
        """
        return self._turn(f"<search> {query} </search>")

    def answer(self, text: str) -> str:
        """Give the final answer; this ends the episode.

        Args:
            text: The answer, with no explanation.

        Returns:
            The environment's last observation.
        """
        return self._turn(f"<answer> {text} </answer>")


#: The tool set of each env family, looked up by the id's name before ``-v``; others get :class:`ActEnv`.
TOOL_SETS: dict[str, type[TwiceTRLEnv]] = {}


def register_tools(family: str, cls: type[TwiceTRLEnv]) -> None:
    """Give the envs whose id is ``family-vN`` the tools of ``cls`` (a :class:`TwiceTRLEnv` subclass)."""
    TOOL_SETS[family] = cls


register_tools("SearchQA", SearchQAEnv)


def Env(env_id: str, **env_kwargs: Any) -> Callable[[], TwiceTRLEnv]:  # noqa: N802 -- a class factory, used as one
    """The ``environment_factory`` for ``env_id``: a :class:`TwiceTRLEnv` subclass, ``env_kwargs`` bound.

    The env is made once here, so an unknown id or kwarg fails before training starts.
    """
    twice_envs.make(env_id, **env_kwargs).close()
    family = env_id.rsplit("-v", 1)[0]
    base = TOOL_SETS.get(family, ActEnv)
    name = re.sub(r"\W", "_", env_id)
    return type(name, (base,), {"env_id": env_id, "env_kwargs": dict(env_kwargs), "__module__": __name__,
                                "__doc__": f"{env_id} for TRL's environment_factory ({base.__name__}'s tools)."})


def seed_dataset(n: int, *, start: int = 0, split: Optional[str] = None, prompt: str = ""):
    """A ``datasets.Dataset`` of ``n`` rows, one start state each: TRL's sampler repeats a row once per
    generation, so each group of ``num_generations`` plays one episode start.

    Rows carry ``prompt`` (a user message holding ``prompt``, to which ``reset`` appends the first
    observation), ``seed`` (``start..start+n-1``) and, with ``split``, ``options`` = ``{"split", "index"}``.
    """
    datasets = require("datasets", "trl", "seed_dataset")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    seeds = list(range(start, start + n))
    columns: dict[str, list] = {"prompt": [[{"role": "user", "content": prompt}] for _ in seeds], "seed": seeds}
    if split is not None:
        columns["options"] = [{"split": split, "index": s} for s in seeds]
    return datasets.Dataset.from_dict(columns)
