"""How an env describes its turns to an agent: the action :class:`Protocol` and the :class:`TextSpace`.

Both stay importable from :mod:`twice_envs.core` (and ``twice_envs``), whose env contract uses them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import gymnasium


@dataclass(frozen=True)
class Protocol:
    """How an agent talks to an env.

    Attributes:
        instructions: text that explains the action format (already part of the first
            observation where the env's protocol says so).
        stop: strings that end an agent's turn; generation stops after the first one.
        action_format: a one-line summary of a well-formed action.
    """

    instructions: str
    stop: tuple[str, ...] = ()
    action_format: str = ""


class TextSpace(gymnasium.spaces.Text):
    """Any Python string up to ``max_length`` characters (all of Unicode, not a charset)."""

    def __init__(self, max_length: int = 1 << 20, seed: Optional[int] = None) -> None:
        super().__init__(max_length=max_length, min_length=0, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"TextSpace(max_length={self.max_length})"
