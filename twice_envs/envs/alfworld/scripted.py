"""Scripted ALFWorld agents with a mistake rate, for warm-start transcripts and baselines.

``scripted_turns(env, rng, skill)`` plays the engine planner's command with probability
``skill`` and a random admissible command otherwise, so transcripts mix good and bad
decisions and their outcomes vary. With ``tagged=True`` the command is written in the
env's turn format (``<action>...</action>``), as a model imitating it should write it.
"""

from __future__ import annotations

import numpy as np

from twice_envs.envs.alfworld.expert import ALFWorldExpert, as_turn

#: One planner per process: it keeps its own engine and follows each env's history.
_PLANNER: list[ALFWorldExpert] = []


def scripted_turns(env, rng: np.random.Generator, skill: float = 1.0, tagged: bool = False) -> str:
    """The planner's command with probability ``skill``, else a random admissible one."""
    command = _command(env, rng, skill)
    return as_turn(command) if tagged else command


def _command(env, rng: np.random.Generator, skill: float) -> str:
    actions = list(env.last_info.get("admissible_actions") or [])
    if actions and rng.random() >= skill:
        return str(actions[int(rng.integers(len(actions)))])
    if not _PLANNER:
        _PLANNER.append(ALFWorldExpert(timeout_s=5.0))
    try:
        return _PLANNER[0].act(env)
    except Exception:  # planner timeout or no plan: fall back to a random command
        return str(actions[int(rng.integers(len(actions)))]) if actions else "look"
