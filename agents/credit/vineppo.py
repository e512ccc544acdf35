"""VinePPO credit: Monte Carlo values at every turn boundary, from forks.

``V(s_t)`` is the mean utility of ``K`` independent rollouts from a fork of the
factual episode at turn ``t`` (fresh noise from turn ``t`` on, so each is a sample of
the policy's return from ``s_t``). The state after the last turn is terminal:
``V(s_T) = U``. Credit of turn ``t`` is ``V(s_{t+1}) - V(s_t)``.

Budget: the published comparison runs VinePPO at 3.20x GRPO's generated tokens, on Search-R1
episodes of a few turns, where ``K = 2`` rollouts from every boundary cost about that. On longer
episodes every boundary costs more (about 7.7x on the labs' five-turn episodes), so
:class:`VineConfig` keeps the published budget and, where every boundary would exceed it, estimates
each boundary with one probability ``q`` (the same for all, drawn per boundary) planned on the
boundaries' predicted cost, ``K`` times the factual continuation's tokens (:func:`value_plan`): the
expected tokens then meet the budget. A turn between two estimated boundaries gets the difference of
their values, as every turn of that stretch (:func:`vine_credit`); before the first estimated
boundary, ``V(s_0)`` is the mean utility of the other episodes of the same task (they start from
``s_0``; free), and a task with one episode gives that stretch 0. ``budget=None`` estimates every
boundary, whatever it costs.

Training scale: VinePPO trains with PPO, whose advantages are whitened over the batch
before the loss; :func:`vineppo_step` does the same (every turn's credit minus the batch
mean, over the batch standard deviation; :func:`whiten`), so its step size is on the
same unit scale as GRPO's normalised advantages. :func:`vine_credit` is the raw credit
in utility units (the audit scores both).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from twice_envs.agents.credit.budget import branch_costs

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
#: Published generated tokens per update relative to GRPO's (the Tok. column).
PUBLISHED_BUDGET = 3.2


@dataclass(frozen=True)
class VineConfig:
    """VinePPO's settings."""

    per_state: int = K_ROLLOUTS
    """Value rollouts per state K (published: 2)."""
    budget: Optional[float] = PUBLISHED_BUDGET
    """Generated tokens per update, value rollouts included, over the factual batch's (published: 3.20);
    where ``K`` rollouts from every boundary would cost more, each boundary is estimated with one
    probability planned to meet it (:func:`value_plan`). None: every boundary."""

    def __post_init__(self) -> None:
        if isinstance(self.per_state, bool) or not isinstance(self.per_state, int) or self.per_state < 1:
            raise ValueError(f"vineppo per_state must be an integer >= 1, got {self.per_state!r}")
        b = self.budget
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, float)) or not np.isfinite(b) or b <= 1):
            raise ValueError(f"vineppo budget must be a number above 1 (tokens relative to the factual batch's) "
                             f"or None, got {b!r}")


def value_states(episodes: Sequence[EpisodeRecord]) -> list[tuple[int, int]]:
    """The states whose value is estimated: ``(episode, t)`` for every turn ``t``."""
    return [(i, t) for i, ep in enumerate(episodes) for t in range(len(ep.turns))]


def value_plan(episodes: Sequence[EpisodeRecord], config: VineConfig,
               rng: np.random.Generator) -> tuple[Optional[list[tuple[int, int]]], float]:
    """The boundaries to estimate and the probability ``q`` each was drawn with.

    Every boundary (``None``, ``q = 1``) when ``budget`` is None or ``K`` rollouts from every boundary are
    predicted to fit it; else each boundary independently with ``q = room / predicted``, ``room`` being
    ``(budget - 1)`` times the batch's generated tokens and ``predicted`` ``K`` times the sum over boundaries of
    the factual turn's and later turns' tokens (a rollout from ``s_t`` samples the same law as the factual
    continuation, so this predicts its length without bias)."""
    states = value_states(episodes)
    if config.budget is None or not states:
        return None, 1.0
    predicted = config.per_state * float(branch_costs(episodes, states).sum())
    room = (config.budget - 1.0) * sum(ep.num_generated_tokens for ep in episodes)
    if predicted <= room:
        return None, 1.0
    q = room / predicted
    drawn = rng.random(len(states)) < q
    return [s for s, d in zip(states, drawn) if d], q


def state_values(
    episodes: Sequence[EpisodeRecord], value_rollouts: Sequence[EpisodeRecord], *, partial: bool = False
) -> list[np.ndarray]:
    """``V(s_0..s_T)`` per episode (length ``T + 1``); rollouts name their state by ``twin_of``.

    A boundary without rollouts raises, or with ``partial`` is NaN (the terminal value is always ``U``)."""
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
        if np.isnan(v).any() and not partial:
            missing = [t for t in range(len(ep.turns)) if np.isnan(v[t])]
            raise ValueError(f"episode {i} has no value rollouts for turns {missing}")
        values.append(v)
    return values


def start_values(episodes: Sequence[EpisodeRecord]) -> np.ndarray:
    """Per episode, the mean utility of the other episodes of its task (``EpisodeRecord.group``): a free
    estimate of ``V(s_0)`` that shares none of its own luck; NaN for a task with one episode."""
    u = np.array([ep.utility for ep in episodes], dtype=np.float64)
    g = np.array([ep.group for ep in episodes])
    out = np.full(len(u), np.nan)
    for key in np.unique(g):
        sel = g == key
        n = int(sel.sum())
        if n > 1:
            out[sel] = (u[sel].sum() - u[sel]) / (n - 1)
    return out


def vine_credit(episodes: Sequence[EpisodeRecord], value_rollouts: Sequence[EpisodeRecord]) -> list[np.ndarray]:
    """Per turn, one array per episode: ``V(s_{t+1}) - V(s_t)`` where every boundary was estimated; else
    the value of the next estimated boundary (or ``U``) minus that of the last one at or before the turn
    (``V(s_0)`` unestimated: :func:`start_values`; none: 0)."""
    values = state_values(episodes, value_rollouts, partial=True)
    start = None
    out = []
    for i, v in enumerate(values):
        if np.isnan(v[0]):
            start = start_values(episodes) if start is None else start
            v = v.copy()
            v[0] = start[i]
        credit = np.zeros(len(v) - 1)
        lo = 0
        for hi in range(1, len(v)):
            if np.isnan(v[hi]):
                continue
            if not np.isnan(v[lo]):
                credit[lo:hi] = v[hi] - v[lo]
            lo = hi
        out.append(credit)
    return out


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
    """``per_state`` value rollouts from every turn boundary, or from those :func:`value_plan` draws."""
    config = ctx.config or VineConfig()
    states, _ = value_plan(episodes, config, ctx.rng)
    args = {"k": config.per_state}
    if states is not None:
        args["states"] = states
    return [Request("values", args)]


@register_credit("vineppo", display="VinePPO", description="Monte Carlo values from forks",
                 needs=("values",), config=VineConfig, benches=("learn",), plan=vineppo_plan)
def vineppo_step(episodes: Sequence[EpisodeRecord], rollouts: Sequence[Rollout], ctx: CreditContext) -> CreditResult:
    """:func:`vine_credit` from the value rollouts, whitened."""
    vals = rollouts[0].result
    return CreditResult(whiten(vine_credit(episodes, vals.records)), vals.aux_tokens)
