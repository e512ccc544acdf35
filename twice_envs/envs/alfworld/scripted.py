"""Scripted ALFWorld agents with a mistake rate, for warm-start transcripts and baselines.

``scripted_turns(env, rng, skill)`` plays an expert's command with probability ``skill``
and a random admissible command otherwise, so transcripts mix good and bad decisions and
their outcomes vary. The expert is the engine's planner (optimal, but it knows where every
object is) or, in a share ``handcoded`` of the episodes, ALFWorld's hand-coded expert
(which searches receptacles one by one, as an agent that sees only the text must). With
``tagged=True`` the command is written in the env's turn format (``<action>...</action>``),
as a model imitating it should write it.
"""

from __future__ import annotations

import numpy as np

from twice_envs.envs.alfworld.expert import ALFWorldExpert, HandcodedExpert, as_turn

#: One expert of each kind per process: each keeps its own engine and follows each env's history.
_EXPERTS: dict[str, object] = {}
#: The expert kind of each env's current episode, by ``id(env)`` (drawn at turn 0).
_EPISODE_EXPERT: dict[int, str] = {}


def scripted_turns(env, rng: np.random.Generator, skill: float = 1.0, tagged: bool = False,
                   handcoded: float = 0.0) -> str:
    """An expert's command with probability ``skill``, else a random admissible one; the expert
    of an episode is the hand-coded one with probability ``handcoded`` (drawn at its first turn),
    else the planner."""
    if env.turn == 0 or id(env) not in _EPISODE_EXPERT:
        _EPISODE_EXPERT[id(env)] = "handcoded" if handcoded > 0 and rng.random() < handcoded else "planner"
    command = _command(env, rng, skill, _EPISODE_EXPERT[id(env)])
    return as_turn(command) if tagged else command


def _expert(kind: str):
    if kind not in _EXPERTS:
        _EXPERTS[kind] = HandcodedExpert() if kind == "handcoded" else ALFWorldExpert(timeout_s=5.0)
    return _EXPERTS[kind]


def _command(env, rng: np.random.Generator, skill: float, kind: str = "planner") -> str:
    actions = list(env.last_info.get("admissible_actions") or [])
    if actions and rng.random() >= skill:
        return str(actions[int(rng.integers(len(actions)))])
    try:
        return _expert(kind).act(env)
    except Exception:  # planner timeout, no plan, or the hand-coded expert gave up: a random command
        return str(actions[int(rng.integers(len(actions)))]) if actions else "look"
