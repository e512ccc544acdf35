"""Twice: twin credit with branch and evidence coins and inverse-probability weights.

For decision ``t`` of a factual episode with utility ``U``, a *twin* re-runs the
episode from ``s_t`` with an alternative turn (sampled on noise branch ``k >= 1``)
and the factual episode's downstream noise, giving ``U'``. ``D_t = U - U'`` has
expectation ``A(s_t, y_t)`` whatever the coupling quality; good coupling only
shrinks its variance (to ``1 - rho`` times that of an independent counterfactual).

Coins, drawn per decision and per twin:

* branch coin ``B_t ~ Bern(q_t)`` (``q_t`` from :mod:`.budget`);
* evidence coin ``S_t ~ Bern(q_same^{e_t})``, ``e_t = 1`` when the alternative turn
  got the same observation as the factual one (a same-evidence twin often ties, so
  most of them are not continued);

and the twin credit ``A_hat_t = B_t S_t D_t / (q_t q_same^{e_t})`` is unbiased for
``A(s_t, y_t)`` for any ``q_t > 0``. With ``J`` alternatives the credit is their mean.

The advantage used by the loss is ``A_t = A_traj + omega * A_hat_t / sigma_hat``
where ``A_traj`` is GRPO's group-normalised return and ``sigma_hat`` is one scale for
the whole batch: the standard deviation of the factual utilities of the batch,
floored at ``sigma_min``. Dividing every twin credit by the same positive number keeps
the direction of the twin-credit gradient unbiased (up to a batch constant) while
putting it on the scale of GRPO's unit-variance term; a per-decision or per-group
scale would re-weight decisions against each other and a floor keeps an all-tie
batch from blowing a rare non-zero twin up.

A self-twin (alternative text == factual text) is the factual episode by the coupling
guarantee: ``D = 0``, nothing generated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from twice_envs.agents.credit import budget as budget_rules
from twice_envs.agents.credit.grpo import episode_advantages
from twice_envs.agents.credit.predictor import decision_index, group_success
from twice_envs.agents.types import EpisodeRecord


@dataclass
class TwiceConfig:
    """Twin-credit settings (defaults: the method's published settings)."""

    beta: float = 0.7
    """Auxiliary budget: expected twin tokens = beta x the batch's policy tokens."""
    pairs: int = 1
    """J: independent pairs per branched decision. Pair 0 is the factual episode and its
    twins; each further pair replays the factual turn on a fresh downstream noise seed
    and runs its twins on that same seed (a replica plus the twins)."""
    star: int = 1
    """K: alternatives per pair that share the pair's downstream noise (the star design;
    they share one factual side, so they are not independent pairs)."""
    omega: float = 1.0
    """Weight of the twin credit in ``A_t = A_traj + omega A_hat_t / sigma_hat``."""
    q_min: float = 0.05
    """Floor of the branch probability (keeps every inverse weight <= 1/q_min)."""
    q_same: float = 0.25
    """Probability of continuing a same-evidence twin (evidence coin)."""
    warmup_updates: int = 10
    """Updates during which every decision is branched with probability ``warmup_q``."""
    warmup_q: float = 0.3
    """Branch probability during the predictor's warm-up."""
    sigma_min: float = 0.1
    """Floor of the batch scale ``sigma_hat``."""
    coupled: bool = True
    """Twins read the factual noise after the branch (False: independent counterfactuals)."""
    key_mode: str = "line"
    """Noise keying of the sampler: line (default), flat, counter or ngram (ablations)."""
    branching: str = "sqrt"
    """How q is chosen: sqrt (square-root rule), uniform, or mixed (2 p (1 - p))."""
    skip_same_evidence: bool = False
    """Ablation: never continue a same-evidence twin and count it as D = 0 (biased)."""
    inverse_weights: bool = True
    """Divide by q_t q_same^e_t (False: the plain, biased B S D)."""
    self_twin_shortcut: bool = True
    """Self-twins cost nothing (False: charge them their full continuation)."""
    trajectory_term: bool = True
    """Include GRPO's A_traj in the advantage (False: twin credit only)."""


@dataclass
class BranchPlan:
    """Which decisions of a batch get twins, with what probability.

    Attributes:
        index: every decision ``(episode, turn)`` of the factual batch.
        costs: ``c_t``: tokens of the factual turn plus the episode's remaining tokens.
        eta: predicted discordance per decision (NaN during warm-up).
        q: branch probability per decision.
        branched: the branch coins ``B_t``.
        lam: the bisected lambda (NaN during warm-up).
        budget: the target expected auxiliary tokens.
    """

    index: list[tuple[int, int]]
    costs: np.ndarray
    eta: np.ndarray
    q: np.ndarray
    branched: np.ndarray
    lam: float = float("nan")
    budget: float = 0.0

    @property
    def branched_decisions(self) -> list[tuple[int, int]]:
        return [d for d, b in zip(self.index, self.branched) if b]


def branch_costs(episodes: Sequence[EpisodeRecord], index: Sequence[tuple[int, int]]) -> np.ndarray:
    """``c_t``: the factual turn's length plus the tokens generated after it (at least 1)."""
    return np.array([max(1, episodes[i].remaining_tokens(t)) for i, t in index], dtype=np.float64)


def policy_tokens(episodes: Sequence[EpisodeRecord]) -> int:
    """Tokens the policy generated in the factual batch."""
    return sum(ep.num_generated_tokens for ep in episodes)


def branch_probabilities(
    episodes: Sequence[EpisodeRecord],
    config: TwiceConfig,
    eta: Optional[np.ndarray],
    *,
    update: int,
    index: Optional[list[tuple[int, int]]] = None,
    cost_scale: float = 1.0,
) -> tuple[np.ndarray, float, np.ndarray, float]:
    """``(q, lambda, costs, budget)`` for every decision (see :class:`TwiceConfig`).

    ``cost_scale`` multiplies ``c_t`` when solving for the budget (the realised cost of a
    twin per token of ``c_t``, see :attr:`PredictorState.cost_scale`).
    """
    index = decision_index(episodes) if index is None else index
    costs = branch_costs(episodes, index)
    unit_costs = costs * twins_per_decision(config) * cost_scale
    target = config.beta * policy_tokens(episodes)
    if update < config.warmup_updates:
        return np.full(len(index), config.warmup_q), float("nan"), costs, target
    if config.branching == "uniform":
        q, lam = budget_rules.uniform_rule(unit_costs, target, q_min=config.q_min)
    elif config.branching == "mixed":
        p = group_success(episodes)
        q, lam = budget_rules.mixed_outcome_rule([p[i] for i, _ in index], unit_costs, target, q_min=config.q_min)
    elif config.branching == "sqrt":
        if eta is None:
            raise ValueError("the square-root rule needs predicted discordances eta")
        scores = np.sqrt(np.clip(eta, 0.0, 1.0) / unit_costs)
        q, lam = budget_rules.probabilities_for_budget(scores, unit_costs, target, q_min=config.q_min)
    else:
        raise ValueError(f"branching must be sqrt, uniform or mixed, got {config.branching!r}")
    return q, lam, costs, target


def twins_per_decision(config: TwiceConfig) -> int:
    """Episodes run per branched decision, each costing about ``c_t``: ``J K`` twins and
    ``J - 1`` replicas of the factual turn (one per pair beyond the factual episode)."""
    return config.pairs * config.star + config.pairs - 1


def plan_branches(
    episodes: Sequence[EpisodeRecord],
    config: TwiceConfig,
    eta: Optional[np.ndarray],
    rng: np.random.Generator,
    *,
    update: int,
    cost_scale: float = 1.0,
) -> BranchPlan:
    """Branch probabilities and the branch coins ``B_t ~ Bern(q_t)`` for a factual batch."""
    index = decision_index(episodes)
    q, lam, costs, target = branch_probabilities(episodes, config, eta, update=update, index=index,
                                                 cost_scale=cost_scale)
    coins = rng.random(len(index)) < q
    eta_arr = np.full(len(index), np.nan) if eta is None else np.asarray(eta, dtype=np.float64)
    return BranchPlan(index, costs, eta_arr, q, coins, lam, target)


def evidence_exponent(twin: EpisodeRecord) -> int:
    """``e_t``: 1 for a same-evidence twin that is not a self-twin."""
    return int(bool(twin.same_evidence) and not twin.self_twin)


def evidence_coins(
    same_evidence: Sequence[bool], config: TwiceConfig, rng: np.random.Generator
) -> np.ndarray:
    """``S ~ Bern(q_same^e)`` per twin (always 0 for same evidence under ``skip_same_evidence``)."""
    e = np.asarray(same_evidence, dtype=bool)
    keep_prob = np.where(e, 0.0 if config.skip_same_evidence else config.q_same, 1.0)
    draws = rng.random(len(e))
    return draws < keep_prob


@dataclass
class TwinCredit:
    """Per-decision twin credit of a batch, with the quantities behind it.

    Attributes:
        a_hat: ``A_hat_t`` per decision of the plan's index (0 where not branched).
        d: mean ``D_t`` over the decision's kept twins (NaN where none).
        pairs: ``(decision row, U, U', e, kept)`` for every twin.
    """

    a_hat: np.ndarray
    d: np.ndarray
    pairs: list[tuple[int, float, float, int, bool]] = field(default_factory=list)


def twin_credit(
    episodes: Sequence[EpisodeRecord],
    twins: Sequence[EpisodeRecord],
    plan: BranchPlan,
    kept: Sequence[bool],
    config: TwiceConfig,
) -> TwinCredit:
    """``A_hat_t = (1/JK) sum_jk B_t S_jk D_jk / (q_t q_same^{e_jk})`` for every decision.

    ``twins[m].twin_of = (episode, turn)`` names its decision; ``kept[m]`` is its
    evidence coin ``S`` (a twin not kept contributes 0, and its ``U'`` is unused).
    ``D = U_j - U'`` with ``U_j`` the twin's ``pair_utility`` (pairs ``j >= 1``) or the
    factual utility.
    """
    row_of = {d: r for r, d in enumerate(plan.index)}
    a_hat = np.zeros(len(plan.index))
    d_sum = np.zeros(len(plan.index))
    d_cnt = np.zeros(len(plan.index))
    pairs = []
    for twin, s in zip(twins, kept):
        if twin.twin_of is None:
            raise ValueError("a twin record must have twin_of = (episode, turn)")
        i, t = twin.twin_of
        r = row_of[(int(i), int(t))]
        if not plan.branched[r]:
            raise ValueError(f"twin of decision {(i, t)} whose branch coin was 0")
        u = episodes[i].utility if twin.pair_utility is None else twin.pair_utility
        u_twin = u if twin.self_twin else twin.utility
        e = evidence_exponent(twin)
        pairs.append((r, u, u_twin, e, bool(s)))
        if not s:
            continue
        d = u - u_twin
        weight = 1.0 / (plan.q[r] * config.q_same**e) if config.inverse_weights else 1.0
        a_hat[r] += weight * d / (config.pairs * config.star)
        d_sum[r] += d
        d_cnt[r] += 1
    d_mean = np.where(d_cnt > 0, d_sum / np.maximum(d_cnt, 1), np.nan)
    return TwinCredit(a_hat, d_mean, pairs)


def sigma_hat(utilities: Sequence[float], sigma_min: float = 0.1) -> float:
    """The batch scale: standard deviation of the factual utilities, at least ``sigma_min``."""
    u = np.asarray(utilities, dtype=np.float64)
    return max(float(u.std()) if u.size else 0.0, sigma_min)


def combine(
    episodes: Sequence[EpisodeRecord],
    index: Sequence[tuple[int, int]],
    a_hat: np.ndarray,
    config: TwiceConfig,
) -> list[np.ndarray]:
    """``A_t = A_traj + omega A_hat_t / sigma_hat`` as one array per episode."""
    util = [ep.utility for ep in episodes]
    a_traj = episode_advantages(util, [ep.group for ep in episodes])
    scale = sigma_hat(util, config.sigma_min)
    out = [np.full(len(ep.turns), a_traj[i] if config.trajectory_term else 0.0) for i, ep in enumerate(episodes)]
    for (i, t), a in zip(index, a_hat):
        out[i][t] += config.omega * a / scale
    return out


def twin_stats(credit: TwinCredit, plan: BranchPlan, twins: Sequence[EpisodeRecord]) -> dict:
    """Per-update diagnostics: twin correlation, self-twin and tie shares, branch probability."""
    kept = [(u, v) for (_, u, v, _, k), tw in zip(credit.pairs, twins) if k and not tw.self_twin]
    n = len(twins)
    out = {
        "twins": n,
        "self_twin_share": float(np.mean([tw.self_twin for tw in twins])) if n else float("nan"),
        "same_evidence_share": float(np.mean([evidence_exponent(tw) for tw in twins])) if n else float("nan"),
        "tie_share": float(np.mean([u == v for (_, u, v, _, _) in credit.pairs])) if n else float("nan"),
        "mean_q": float(np.mean(plan.q)) if len(plan.q) else float("nan"),
        "branched_share": float(np.mean(plan.branched)) if len(plan.branched) else float("nan"),
        "rho": pair_correlation(kept),
    }
    return out


def pair_correlation(pairs: Sequence[tuple[float, float]]) -> float:
    """Pearson correlation of ``(U, U')`` over twin pairs (NaN if either side is constant)."""
    if len(pairs) < 2:
        return float("nan")
    a = np.asarray(pairs, dtype=np.float64)
    if a[:, 0].std() == 0 or a[:, 1].std() == 0:
        return float("nan")
    return float(np.corrcoef(a[:, 0], a[:, 1])[0, 1])
