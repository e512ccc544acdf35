"""The list of admissible actions that envs made with ``show_admissible=True`` end their
observations with (ALFWorld, WebShop): one format, so a model reads the same list on every env."""

from __future__ import annotations

from typing import Sequence

#: What starts the list.
HEADER = "\n\nAdmissible actions: "


def with_actions(obs: str, actions: Sequence[str]) -> str:
    """``obs`` ending with the list of ``actions``."""
    return f"{obs}{HEADER}{', '.join(actions)}."


def without_actions(obs: str) -> str:
    """The observation without the list of admissible actions, if it ends with one."""
    return obs.split(HEADER, 1)[0]


__all__ = ["HEADER", "with_actions", "without_actions"]
