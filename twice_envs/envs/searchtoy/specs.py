"""SearchToy env ids (entry points are strings: nothing heavy is imported here)."""

from __future__ import annotations

from twice_envs.registry import register

register(
    "SearchToy-v0",
    "twice_envs.envs.searchtoy.env:SearchToyEnv",
    description="credit lab: multi-hop search MDP with exact values (3 facts, 8 queries, 4 useful, horizon 10)",
    override=True,
)
