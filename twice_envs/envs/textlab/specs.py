"""TextLab env ids (entry points are strings: nothing heavy is imported here)."""

from __future__ import annotations

from twice_envs.registry import register

register(
    "TextLab-v0",
    "twice_envs.envs.textlab.env:TextLabEnv",
    description="credit lab: SearchToy's world with multi-line text turns (the action is a turn's last line)",
    override=True,
)
