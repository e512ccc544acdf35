"""Exact A*: a diagnostic credit method whose update uses the exact advantage itself.

In the credit lab every turn's true advantage ``A*(s_t, y_t) = Q(s_t, y_t) - V(s_t)`` is known by
dynamic programming. ``exact-advantage`` ("Exact A*") hands it to the update unchanged (utility units,
no normalisation; the step size absorbs the scale), so a learning comparison can show how fast a policy
learns when credit is perfect: the ceiling that every estimator's credit approaches, and the test of
whether a lab can rank credit methods at all (at their best step sizes, exact advantages must learn
faster than GRPO there).

It needs ``exact_advantages`` (:data:`~.registry.NEEDS`): the caller's function from a policy and its
episodes to per-turn exact advantages, which only the lab's step functions supply
(the lab's :class:`~.registry.Runners`). :func:`~.registry.check_env` refuses any env whose
class does not declare ``has_exact_values`` before a rollout; it spends no auxiliary tokens.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from twice_envs.agents.credit.registry import CreditContext, CreditResult, Request, Rollout, register_credit
from twice_envs.agents.types import EpisodeRecord


def exact_plan(episodes: Sequence[EpisodeRecord], ctx: CreditContext) -> list[Request]:
    """Ask for the exact advantages of the batch."""
    return [Request("exact_advantages")]


@register_credit("exact-advantage", display="Exact A*", needs=("exact_advantages",), benches=("learn",),
                 plan=exact_plan,
                 description="diagnostic: the exact advantage A*(s_t, y_t) of every turn (labs with exact values)")
def exact_advantage_step(episodes: Sequence[EpisodeRecord], rollouts: Sequence[Rollout],
                         ctx: CreditContext) -> CreditResult:
    """Every turn's exact advantage under the policy that sampled the episodes."""
    return CreditResult([np.asarray(a, dtype=np.float64) for a in rollouts[0].result])
