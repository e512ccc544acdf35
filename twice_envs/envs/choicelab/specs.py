"""ChoiceLab env ids (entry points are strings: nothing heavy is imported here)."""

from __future__ import annotations

from twice_envs.registry import register

register(
    "ChoiceLab-v0",
    "twice_envs.envs.choicelab.env:ChoiceLabEnv",
    description="credit lab: 256 tasks of 16 choices among 8 items of 4 attribute words; exact values",
    override=True,
)
