"""VinePPO credit: Monte Carlo values at every turn boundary, from forks.

``V(s_t)`` is the mean utility of ``K`` independent rollouts from a fork of the
factual episode at turn ``t`` (fresh noise from turn ``t`` on, so each is a sample of
the policy's return from ``s_t``). The state after the last turn is terminal:
``V(s_T) = U``. Credit of turn ``t`` is ``V(s_{t+1}) - V(s_t)``.

Training scale: VinePPO trains with PPO, whose advantages are whitened over the batch
before the loss; :func:`vineppo_step` does the same (every turn's credit minus the batch
mean, over the batch standard deviation; :func:`whiten`), so its step size is on the
same unit scale as GRPO's normalised advantages. :func:`vine_credit` is the raw credit
in utility units (the audit scores both).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from twice_envs.agents.credit.registry import (
    CreditContext,
    CreditResult,
    Request,
    Rollout,
    register_credit,
)
from twice_envs.agents.types import EpisodeRecord

#: Published rollouts per state.
K_ROLLOUTS = 2


@dataclass(frozen=True)
class VineConfig:
    """VinePPO's settings."""

    per_state: int = K_ROLLOUTS
    """Value rollouts per state K (published: 2)."""

    def __post_init__(self) -> None:
        if isinstance(self.per_state, bool) or not isinstance(self.per_state, int) or self.per_state < 1:
            raise ValueError(f"vineppo per_state must be an integer >= 1, got {self.per_state!r}")


def value_states(episodes: Sequence[EpisodeRecord]) -> list[tuple[int, int]]:
    """The states whose value is estimated: ``(episode, t)`` for every turn ``t``."""
    return [(i, t) for i, ep in enumerate(episodes) for t in range(len(ep.turns))]


def state_values(
    episodes: Sequence[EpisodeRecord], value_rollouts: Sequence[EpisodeRecord]
) -> list[np.ndarray]:
    """``V(s_0..s_T)`` per episode (length ``T + 1``); rollouts name their state by ``twin_of``."""
    sums = [np.zeros(len(ep.turns) + 1) for ep in episodes]
    counts = [np.zeros(len(ep.turns) + 1) for ep in episodes]
    for r in value_rollouts:
        i, t = r.twin_of
        u = episodes[i].utility if r.self_twin else r.utility
        sums[i][t] += u
        counts[i][t] += 1
    values = []
    for i, ep in enumerate(episodes):
        v = np.where(counts[i] > 0, sums[i] / np.maximum(counts[i], 1), np.nan)
        v[len(ep.turns)] = ep.utility
        if np.isnan(v).any():
            missing = [t for t in range(len(ep.turns)) if np.isnan(v[t])]
            raise ValueError(f"episode {i} has no value rollouts for turns {missing}")
        values.append(v)
    return values


def vine_credit(episodes: Sequence[EpisodeRecord], value_rollouts: Sequence[EpisodeRecord]) -> list[np.ndarray]:
    """``V(s_{t+1}) - V(s_t)`` per turn, one array per episode."""
    return [np.diff(v) for v in state_values(episodes, value_rollouts)]


#: Added to the standard deviation when whitening (the usual PPO setting).
WHITEN_EPS = 1e-8


def whiten(advantages: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Per-turn advantages minus their batch mean, over their batch standard deviation (+ eps)."""
    flat = np.concatenate([np.asarray(a, dtype=np.float64) for a in advantages]) if advantages else np.zeros(0)
    if flat.size == 0:
        return [np.asarray(a, dtype=np.float64) for a in advantages]
    mu, sd = float(flat.mean()), float(flat.std())
    return [(np.asarray(a, dtype=np.float64) - mu) / (sd + WHITEN_EPS) for a in advantages]


def vineppo_plan(episodes: Sequence[EpisodeRecord], ctx: CreditContext) -> list[Request]:
    """``per_state`` value rollouts from every turn boundary."""
    return [Request("values", {"k": (ctx.config or VineConfig()).per_state})]


@register_credit("vineppo", display="VinePPO", description="Monte Carlo values from forks",
                 needs=("values",), config=VineConfig, benches=("learn",), plan=vineppo_plan)
def vineppo_step(episodes: Sequence[EpisodeRecord], rollouts: Sequence[Rollout], ctx: CreditContext) -> CreditResult:
    """:func:`vine_credit` from the value rollouts, whitened."""
    vals = rollouts[0].result
    return CreditResult(whiten(vine_credit(episodes, vals.records)), vals.aux_tokens)
