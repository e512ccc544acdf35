"""CreditToy env ids (entry points are strings: nothing heavy is imported here)."""

from __future__ import annotations

from twice_envs.registry import register

register(
    "CreditToy-v0",
    "twice_envs.envs.credittoy.env:CreditToyEnv",
    description="credit lab: three choices of four actions, exact advantages",
    override=True,
)
