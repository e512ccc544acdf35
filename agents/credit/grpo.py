"""GRPO credit: the group-normalised episode return, broadcast to every turn.

A group is the ``G`` episodes of one task (``EpisodeRecord.group``). Episode ``i`` of
group ``g`` gets ``(U_i - mean_g) / (std_g + eps)``; every turn of the episode gets
that value.

``grpo-2x`` ("GRPO (2x)") is the same step registered with ``rollouts=2``: every caller
samples ``2 G`` episodes per task for it, so its baseline mean and std come from the larger
group and it spends twice GRPO's factual tokens (the compute-matched row of the comparison).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from twice_envs.agents.credit.registry import (
    CreditContext,
    CreditResult,
    Rollout,
    register_credit,
)
from twice_envs.agents.types import EpisodeRecord


def group_baseline(utilities: Sequence[float], groups: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per-episode group mean and (population) standard deviation of the utility."""
    u = np.asarray(utilities, dtype=np.float64)
    g = np.asarray(groups)
    mean = np.zeros_like(u)
    std = np.zeros_like(u)
    for key in np.unique(g):
        sel = g == key
        mean[sel] = u[sel].mean()
        std[sel] = u[sel].std()
    return mean, std


def episode_advantages(
    utilities: Sequence[float], groups: Sequence[int], *, normalize: bool = True, eps: float = 1e-6
) -> np.ndarray:
    """``(U - mean_g) / (std_g + eps)`` per episode (``U - mean_g`` with ``normalize=False``).

    A group whose utilities all tie gets 0 for every episode.
    """
    u = np.asarray(utilities, dtype=np.float64)
    mean, std = group_baseline(u, groups)
    centred = u - mean
    return centred / (std + eps) if normalize else centred


def broadcast(per_episode: Sequence[float], episodes: Sequence[EpisodeRecord]) -> list[np.ndarray]:
    """One array per episode with its value repeated for each turn."""
    return [np.full(len(ep.turns), float(a)) for a, ep in zip(per_episode, episodes)]


def grpo_credit(episodes: Sequence[EpisodeRecord], *, normalize: bool = True) -> list[np.ndarray]:
    """GRPO advantages: one array of per-turn advantages per episode."""
    adv = episode_advantages([ep.utility for ep in episodes], [ep.group for ep in episodes], normalize=normalize)
    return broadcast(adv, episodes)


@register_credit("grpo", display="GRPO", description="group-normalised episode return", benches=("learn", "games"))
def grpo_step(episodes: Sequence[EpisodeRecord], rollouts: Sequence[Rollout], ctx: CreditContext) -> CreditResult:
    """GRPO needs nothing besides the episodes."""
    return CreditResult(grpo_credit(episodes))


@register_credit("grpo-2x", display="GRPO (2x)", rollouts=2, benches=("learn", "games"),
                 description="group-normalised episode return over twice the group size (2G factual rollouts)")
def grpo_2x_step(episodes: Sequence[EpisodeRecord], rollouts: Sequence[Rollout], ctx: CreditContext) -> CreditResult:
    """GRPO's step; the callers hand it ``2 G`` episodes per task (its ``rollouts`` is 2)."""
    return CreditResult(grpo_credit(episodes))
