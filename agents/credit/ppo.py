"""PPO credit with a learned critic (turn-level GAE), alone and with Twice's twin terms.

The critic gives ``V(s_t)``, the value of the state before turn ``t`` (the context the
policy saw when it generated turn ``t``); the state after the last turn is terminal,
``V(s_T) = 0``. With the turns' rewards ``r_t``:

    delta_t = r_t + gamma V(s_{t+1}) - V(s_t)
    A_t     = delta_t + gamma lam A_{t+1}          (A_T = 0)
    R_t     = A_t + V(s_t)                         (the critic's regression target)

With ``gamma = lam = 1`` (the recipe's setting) ``A_t = G_t - V(s_t)``, ``G_t`` being the
return from turn ``t`` on, and ``R_t = G_t``. The batch's advantages are then whitened
(minus their mean, over their standard deviation), and the critic takes one fit toward
``R_t``. ``V`` is read *before* the fit, so a turn's own return never leaks into its
baseline.

``ppo-twice`` adds Twice's twin terms ``omega A_hat_t / sigma_hat`` at the branched turns
(:func:`~twice_envs.agents.credit.twice.add_twin_terms`) to the whitened PPO advantage;
both are on a unit scale, as GRPO's term is in Twice.

Where the recipe is silent, our reading:

* **Turns, not tokens.** The recipe's GAE runs over tokens with the reward on the last
  one; with ``gamma = lam = 1`` every token of a turn gets the same ``G - V`` anyway,
  so we compute one advantage per turn and read ``V`` once per turn, at the last token
  before the turn's first generated token. Observation tokens never enter the loss
  (:mod:`twice_envs.agents.training.loss` masks them), so they need no advantage.
* **Rewards.** ``r_t`` are the env's turn rewards. Where an episode's ``utility`` differs
  from their sum (a graded or post-processed outcome), the difference is added to the
  last turn's reward, so ``G_0`` is the utility every other method credits.
* **Whitening.** verl whitens the GAE advantages over the batch's response tokens; we
  whiten over the batch's turns (each turn one entry, whatever its length).
* **Statistics.** The explained variance ``1 - Var(R - V) / Var(R)`` is that of the
  values read before the fit; the critic's own fit reports its value loss.
* **Critic step size.** The lab's tabular critic moves each visited state's value a step
  ``alpha`` towards the mean target of its visits (:attr:`PPOConfig.critic_alpha`); the LLM
  critic's learning rate depends on the model and lives in the training settings
  (``TrainConfig.critic_lr``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from twice_envs.agents.credit import twice
from twice_envs.agents.credit.registry import CreditContext, CreditResult, Request, Rollout, register_credit
from twice_envs.agents.credit.vineppo import whiten
from twice_envs.agents.types import EpisodeRecord


@dataclass(frozen=True)
class PPOConfig:
    """PPO credit settings (defaults: the recipe's)."""

    gamma: float = 1.0
    """Discount of GAE (the recipe: 1)."""
    lam: float = 1.0
    """GAE's lambda (the recipe: 1, the Monte Carlo return minus the critic's value)."""
    whiten: bool = True
    """Whiten the advantages over the batch's turns (verl whitens over the batch's tokens)."""
    critic_alpha: float = 0.5
    """Step size of the lab's tabular critic: ``V <- V + alpha (mean target - V)`` per visited state.
    0.5 makes the mean age of the batches behind an estimate ``(1 - alpha) / alpha`` = one update:
    the policy changes every update, so older batches describe another policy, and within that lag
    the estimate averages as many batches as it can (its variance is ``alpha / (2 - alpha)`` = 1/3 of
    one batch mean's). The LLM critic's rate is ``TrainConfig.critic_lr``."""


def turn_rewards(episode: EpisodeRecord) -> np.ndarray:
    """The turns' env rewards, with ``utility - sum(rewards)`` added to the last turn (so the return
    from the first turn is the episode's utility)."""
    r = np.array([t.reward for t in episode.turns], dtype=np.float64)
    if r.size:
        r[-1] += float(episode.utility) - float(r.sum())
    return r


def gae(rewards: Sequence[float], values: Sequence[float], gamma: float = 1.0,
        lam: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """``(advantages, returns)`` of one episode by generalised advantage estimation.

    ``values[t]`` is ``V(s_t)`` before turn ``t``; the value after the last turn is 0.
    ``returns = advantages + values`` (the critic's targets)."""
    r = np.asarray(rewards, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if r.shape != v.shape:
        raise ValueError(f"{r.size} rewards but {v.size} values")
    adv = np.zeros_like(r)
    acc = 0.0
    for t in range(r.size - 1, -1, -1):
        v_next = v[t + 1] if t + 1 < r.size else 0.0
        acc = r[t] + gamma * v_next - v[t] + gamma * lam * acc
        adv[t] = acc
    return adv, adv + v


def explained_variance(values: np.ndarray, targets: np.ndarray) -> float:
    """``1 - Var(targets - values) / Var(targets)`` (NaN when the targets do not vary)."""
    var = float(np.var(targets))
    return float(1.0 - np.var(targets - values) / var) if var > 0 else float("nan")


def ppo_advantages(episodes: Sequence[EpisodeRecord], critic,
                   config: PPOConfig = PPOConfig()) -> tuple[list[np.ndarray], dict]:
    """PPO's per-turn advantages (whitened when ``config.whiten``) and its statistics.

    Reads ``critic.values(episodes)`` first, computes GAE, then fits the critic once on the
    returns (``critic.fit(episodes, returns)``); its statistics join the explained variance of
    the values read before the fit."""
    values = [np.asarray(v, dtype=np.float64) for v in critic.values(episodes)]
    advs, rets = [], []
    for ep, v in zip(episodes, values):
        if len(v) != len(ep.turns):
            raise ValueError(f"the critic gave {len(v)} values for an episode with {len(ep.turns)} turns")
        a, r = gae(turn_rewards(ep), v, config.gamma, config.lam)
        advs.append(a)
        rets.append(r)
    flat_v = np.concatenate(values) if values else np.zeros(0)
    flat_r = np.concatenate(rets) if rets else np.zeros(0)
    stats = {"explained_variance": explained_variance(flat_v, flat_r),
             "value_mean": float(flat_v.mean()) if flat_v.size else float("nan"),
             "return_mean": float(flat_r.mean()) if flat_r.size else float("nan")}
    stats.update(critic.fit(episodes, rets) or {})
    return (whiten(advs) if config.whiten else advs), stats


@register_credit("ppo", display="PPO", description="GAE (gamma = lambda = 1) on a learned critic, whitened",
                 needs=("critic",), config=PPOConfig, benches=("learn",))
def ppo_step(episodes: Sequence[EpisodeRecord], rollouts: Sequence[Rollout], ctx: CreditContext) -> CreditResult:
    """:func:`ppo_advantages` with the caller's critic (``ctx.need("critic")``) and the run's :class:`PPOConfig`."""
    adv, stats = ppo_advantages(episodes, ctx.need("critic"), ctx.config or PPOConfig())
    return CreditResult(adv, 0, stats)


def ppo_twice_plan(episodes: Sequence[EpisodeRecord], ctx: CreditContext) -> list[Request]:
    """Twice's twins (:func:`~twice_envs.agents.credit.twice.plan_twin_terms`)."""
    return [twice.plan_twin_terms(episodes, ctx)]


@register_credit("ppo-twice", display="PPO + twin credit", needs=("critic", "twins"), config=twice.TwiceConfig,
                 benches=("learn",), plan=ppo_twice_plan,
                 description="PPO's whitened GAE advantage plus Twice's twin terms")
def ppo_twice_step(episodes: Sequence[EpisodeRecord], rollouts: Sequence[Rollout], ctx: CreditContext) -> CreditResult:
    """:func:`ppo_advantages` (:class:`PPOConfig`'s defaults) plus the twin terms of branched turns (the run's
    Twice settings); carries Twice's predictor state."""
    base, stats = ppo_advantages(episodes, ctx.need("critic"))
    res = twice.add_twin_terms(base, episodes, ctx, rollouts[0])
    res.stats.update(stats)
    return res
