"""IGPO credit: information-gain turn rewards plus the outcome, group-normalised and discounted.

IGPO (Wang et al., "Information Gain-based Policy Optimization", ICLR 2026) gives every
turn of a multi-turn episode a reward of its own. With the task's gold answer
``a = (a_1 .. a_L)`` (tokens) and ``o_<=t`` the history up to and including turn ``t``'s
observation, the policy's probability of the answer is the length-normalised geometric mean

    p_t = pi(a | q, o_<=t) = exp((1 / L) sum_j log pi(a_j | q, o_<=t, a_<j)),

``p_0`` being the probability before the first turn (the task alone). For an episode of
``T`` turns (``t = 1 .. T`` below, turn ``t`` is ``episode.turns[t - 1]``):

    r_t = w (p_t - p_{t-1})        1 <= t < T     (information gain)
    r_T = U                                       (the outcome)

``U`` is the episode's utility (the env's rewards summed: EM, F1, ...). Every turn reward of
the ``G`` episodes of one task is z-normalised jointly, over all turns of all of them:

    r~_t = (r_t - mean_g) / (std_g + eps)

and turned into an advantage by a discounted cumulative sum over the episode's later turns:

    A_t = sum_{k >= t} gamma^(k - t) r~_k.

Every token of turn ``t`` gets ``A_t``. The probabilities come from the caller
(:attr:`~twice_envs.agents.credit.registry.CreditContext.answer_probs`, need ``gold_answer``):
``T + 1`` of them per episode, ``p_0 .. p_T``; ``p_T`` (after the last turn) is not used, since
the last turn's reward is the outcome.

``twice-igpo`` ("Twice + IGPO") adds Twice's twin terms
(:func:`~twice_envs.agents.credit.twice.add_twin_terms`, coupled twins on the square-root budget)
to IGPO's advantage.

Where the paper is silent, our reading:

* the weight ``w`` of the information-gain rewards is 1 (the paper adds them to the outcome
  unweighted; :attr:`IGPOConfig.ig_weight` changes it);
* ``gamma`` is 1 (an undiscounted sum of the normalised rewards from the turn on:
  :attr:`IGPOConfig.gamma`);
* the outcome of an episode that ended without an answer (turn limit) is its utility like any
  other (0 unless the env's rewards say otherwise), given at its last turn;
* a group's statistics are those of the population (``std`` with ``ddof = 0``, as GRPO's here);
  a group whose rewards all tie gets 0 advantages, and so does a one-turn one-episode group;
* with several accepted answers the caller chooses which one is scored (the LLM's: the first,
  see :mod:`twice_envs.agents.training.gold_answer`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from twice_envs.agents.credit.gigpo import discounted_returns
from twice_envs.agents.credit.registry import CreditContext, CreditResult, Request, Rollout, register_credit
from twice_envs.agents.credit.twice import TwiceConfig, add_twin_terms, plan_twin_terms
from twice_envs.agents.types import EpisodeRecord


@dataclass(frozen=True)
class IGPOConfig:
    """IGPO's settings (the registered methods use the defaults)."""

    gamma: float = 1.0
    """Discount of the cumulative sum ``A_t = sum_{k >= t} gamma^(k - t) r~_k`` of normalised turn rewards."""
    ig_weight: float = 1.0
    """Weight ``w`` of the information-gain rewards of the non-final turns (the outcome's weight is 1)."""
    eps: float = 1e-6
    """Added to a group's standard deviation before dividing by it."""


def information_gain(probs: Sequence[float]) -> np.ndarray:
    """``p_t - p_{t-1}`` for ``t = 1 .. T - 1`` from ``p_0 .. p_T`` (``T + 1`` probabilities of an episode of
    ``T`` turns): the information gains of its ``T - 1`` non-final turns, in turn order. ``p_T`` is not used."""
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 1 or p.size < 2:
        raise ValueError(f"need T + 1 >= 2 probabilities (before the first turn and after each turn), got {p.size}")
    return p[1:-1] - p[:-2]


def turn_rewards(episode: EpisodeRecord, probs: Sequence[float], config: IGPOConfig = IGPOConfig()) -> np.ndarray:
    """IGPO's reward of every turn of ``episode``: ``w IG_t`` for the non-final turns, the utility at the last."""
    T = len(episode.turns)
    if len(probs) != T + 1:
        raise ValueError(f"an episode of {T} turns needs {T + 1} answer probabilities, got {len(probs)}")
    if T == 0:
        return np.zeros(0)
    return np.append(config.ig_weight * information_gain(probs), float(episode.utility))


def normalize_groups(rewards: Sequence[np.ndarray], groups: Sequence[int], eps: float = 1e-6) -> list[np.ndarray]:
    """Every reward z-normalised with the mean and (population) standard deviation of all turn rewards of
    its group's episodes; a group whose rewards all tie gets 0."""
    rewards = [np.asarray(r, dtype=np.float64) for r in rewards]
    out = [np.zeros_like(r) for r in rewards]
    g = np.asarray(groups)
    for key in np.unique(g):
        members = np.flatnonzero(g == key)
        pool = np.concatenate([rewards[i] for i in members]) if members.size else np.zeros(0)
        if pool.size < 2:
            continue
        mean, std = pool.mean(), pool.std()
        for i in members:
            out[i] = (rewards[i] - mean) / (std + eps) if std > 0 else np.zeros_like(rewards[i])
    return out


def igpo_credit(episodes: Sequence[EpisodeRecord], probs: Sequence[Sequence[float]],
                config: IGPOConfig = IGPOConfig()) -> list[np.ndarray]:
    """IGPO's per-turn advantages: turn rewards (:func:`turn_rewards`), normalised per group
    (:func:`normalize_groups`), discounted cumulative sums (``gamma``)."""
    if len(probs) != len(episodes):
        raise ValueError(f"{len(episodes)} episodes but {len(probs)} arrays of answer probabilities")
    rewards = [turn_rewards(ep, p, config) for ep, p in zip(episodes, probs)]
    norm = normalize_groups(rewards, [ep.group for ep in episodes], config.eps)
    return [discounted_returns(r, config.gamma) for r in norm]


def _stats(episodes: Sequence[EpisodeRecord], probs: Sequence[Sequence[float]]) -> dict:
    gains = [information_gain(p) for ep, p in zip(episodes, probs) if len(ep.turns) > 1]
    flat = np.concatenate(gains) if gains else np.zeros(0)
    return {"answer_prob_start": float(np.mean([p[0] for p in probs])) if len(probs) else float("nan"),
            "info_gain_mean": float(flat.mean()) if flat.size else float("nan"),
            "info_gain_abs_mean": float(np.abs(flat).mean()) if flat.size else float("nan")}


def igpo_plan(episodes: Sequence[EpisodeRecord], ctx: CreditContext) -> list[Request]:
    """The gold answer's probabilities under the policy."""
    return [Request("answer_probs")]


@register_credit("igpo", display="IGPO", needs=("answer_probs",), config=IGPOConfig, benches=("learn",),
                 plan=igpo_plan, description="information-gain turn rewards (the policy's probability of the gold "
                 "answer) plus the outcome, group-normalised and summed over later turns")
def igpo_step(episodes: Sequence[EpisodeRecord], rollouts: Sequence[Rollout], ctx: CreditContext) -> CreditResult:
    """IGPO with the run's :class:`IGPOConfig`; the answer probabilities come from the plan's request."""
    probs = rollouts[0].result
    return CreditResult(igpo_credit(episodes, probs, ctx.config or IGPOConfig()), stats=_stats(episodes, probs))


def twice_igpo_plan(episodes: Sequence[EpisodeRecord], ctx: CreditContext) -> list[Request]:
    """The gold answer's probabilities, then Twice's twins (:func:`~twice_envs.agents.credit.twice.plan_twin_terms`)."""
    return [Request("answer_probs"), plan_twin_terms(episodes, ctx)]


@register_credit("twice-igpo", display="Twice + IGPO", needs=("answer_probs", "twins"), config=TwiceConfig,
                 benches=("learn",), plan=twice_igpo_plan,
                 description="IGPO's advantage plus Twice's twin terms (coupled twins, budget rule)")
def twice_igpo_step(episodes: Sequence[EpisodeRecord], rollouts: Sequence[Rollout],
                    ctx: CreditContext) -> CreditResult:
    """IGPO's advantage (:class:`IGPOConfig`'s defaults) plus the twin terms of
    :func:`~twice_envs.agents.credit.twice.add_twin_terms` (settings: the run's Twice settings; its
    predictor state is kept in the result)."""
    probs = rollouts[0].result
    res = add_twin_terms(igpo_credit(episodes, probs), episodes, ctx, rollouts[1])
    res.stats.update(_stats(episodes, probs))
    return res
