"""A toy credit method registered at test time: its own settings class and flag, two phases, one need.

``toy-test`` asks for one value rollout from every turn boundary (its plan), then credits each turn with
``scale x (V(s_{t+1}) - V(s_t))`` (its credit phase): VinePPO's raw credit with K = 1, times its one setting.
Nothing outside the tests names it; every command that lists methods must find it through the registry.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from twice_envs.agents.credit.registry import CreditResult, Request, register_credit, unregister_credit
from twice_envs.agents.credit.vineppo import vine_credit

NAME = "toy-test"


@dataclass(frozen=True)
class ToyConfig:
    """The toy's settings."""

    scale: float = 1.0
    """Multiplier of the toy's credit (a test setting)."""


def toy_plan(episodes, ctx):
    """One value rollout from every turn boundary."""
    return [Request("values", {"k": 1})]


def toy_credit(episodes, rollouts, ctx):
    """``scale x (V(s_{t+1}) - V(s_t))`` from the plan's value rollouts."""
    values = rollouts[0].result
    scale = (ctx.config or ToyConfig()).scale
    return CreditResult([scale * np.asarray(a) for a in vine_credit(episodes, values.records)], values.aux_tokens)


@contextlib.contextmanager
def registered():
    """``toy-test`` registered for the duration of the block."""
    register_credit(NAME, display="Toy", description="scale x the one-rollout value difference (a test method)",
                    needs=("values",), config=ToyConfig, plan=toy_plan)(toy_credit)
    try:
        yield NAME
    finally:
        unregister_credit(NAME)
