"""Truncate an episode after a number of turns."""

from __future__ import annotations

from typing import Any

from twice_envs.wrappers.base import ForkableWrapper


class TurnLimit(ForkableWrapper):
    """Set ``truncated=True`` once the episode has taken ``max_turns`` actions.

    The count is the episode's own turn counter, so a fork at turn ``t`` has
    ``max_turns - t`` turns left, the same as the episode it came from.
    """

    def __init__(self, env: Any, max_turns: int) -> None:
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be a positive int, got {max_turns!r}")
        super().__init__(env)
        self.max_turns = max_turns

    def step(self, action: str):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if not terminated and self.env.turn >= self.max_turns:
            truncated = True
        return obs, reward, terminated, truncated, info

    def _rewrap(self, env: Any) -> "TurnLimit":
        return TurnLimit(env, self.max_turns)
