"""Branch probabilities under an auxiliary-token budget.

Twice branches decision ``t`` with probability

    q_t = min(1, max(q_min, lambda * sqrt(eta_t / c_t)))

(the square-root rule: it minimises the variance of the inverse-weighted estimator
for a fixed expected cost), where ``eta_t`` is the predicted probability that a twin
disagrees with the factual episode and ``c_t`` the cost of a twin in tokens. One
``lambda`` per batch is found by bisection so that the expected auxiliary tokens
``sum_t q_t c_t`` equal ``beta`` times the batch's policy tokens.

The same solver serves the ablations: uniform branching (score 1) and mixed-outcome
targeting (score ``2 p (1 - p)``) only change the score multiplied by ``lambda``.

What a twin costs (the ``c_t`` above) is worked out here too: the published proxy (the factual
turn and the tokens after it), the expected cost net of self-twins, and the tokens the budget
charges once the twins have run (:func:`accounted_tokens`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

#: Bisection steps for lambda (the published setting).
BISECTION_STEPS = 40


def expected_cost(q: np.ndarray, costs: np.ndarray) -> float:
    """Expected auxiliary tokens ``sum_t q_t c_t``."""
    return float(np.dot(q, costs))


def probabilities_for_budget(
    scores: Sequence[float],
    costs: Sequence[float],
    budget: float,
    *,
    q_min: float = 0.05,
    steps: int = BISECTION_STEPS,
) -> tuple[np.ndarray, float]:
    """``q = clip(lambda * score, q_min, 1)`` with ``lambda`` bisected to spend ``budget``.

    Returns ``(q, lambda)``. When even ``q = 1`` everywhere spends less than the budget,
    every decision is branched; when ``q_min`` everywhere already overspends, every
    decision gets ``q_min`` (the floor wins over the budget).
    """
    s = np.maximum(np.asarray(scores, dtype=np.float64), 0.0)
    c = np.maximum(np.asarray(costs, dtype=np.float64), 0.0)
    if s.size == 0:
        return np.zeros(0), 0.0

    def q_of(lam: float) -> np.ndarray:
        return np.clip(lam * s, q_min, 1.0)

    if expected_cost(np.ones_like(s), c) <= budget:
        return np.ones_like(s), float("inf")
    if expected_cost(q_of(0.0), c) >= budget:
        return q_of(0.0), 0.0
    positive = s[s > 0]
    if positive.size == 0:  # every score is zero: nothing to scale
        return q_of(0.0), 0.0
    lo, hi = 0.0, 1.0 / positive.min()  # at hi every decision with a positive score has q = 1
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        if expected_cost(q_of(mid), c) < budget:
            lo = mid
        else:
            hi = mid
    lam = 0.5 * (lo + hi)
    return q_of(lam), lam


def sqrt_rule(
    eta: Sequence[float], costs: Sequence[float], budget: float, *, q_min: float = 0.05, steps: int = BISECTION_STEPS
) -> tuple[np.ndarray, float]:
    """The square-root rule ``q_t = min(1, max(q_min, lambda sqrt(eta_t / c_t)))``."""
    eta = np.clip(np.asarray(eta, dtype=np.float64), 0.0, 1.0)
    c = np.maximum(np.asarray(costs, dtype=np.float64), 1.0)
    return probabilities_for_budget(np.sqrt(eta / c), c, budget, q_min=q_min, steps=steps)


def uniform_rule(costs: Sequence[float], budget: float, *, q_min: float = 0.05) -> tuple[np.ndarray, float]:
    """One branch probability for every decision, spending ``budget`` in expectation."""
    c = np.asarray(costs, dtype=np.float64)
    return probabilities_for_budget(np.ones_like(c), c, budget, q_min=q_min)


def mixed_outcome_rule(
    success: Sequence[float], costs: Sequence[float], budget: float, *, q_min: float = 0.05
) -> tuple[np.ndarray, float]:
    """Mixed-outcome targeting: ``q_t`` proportional to ``2 p_t (1 - p_t)``, ``p_t`` the
    predicted success of decision ``t``'s prefix; the cost enters only the budget."""
    p = np.clip(np.asarray(success, dtype=np.float64), 0.0, 1.0)
    return probabilities_for_budget(2.0 * p * (1.0 - p), costs, budget, q_min=q_min)


# --------------------------------------------------------------------------- what a twin costs
#
# ``config`` below is Twice's settings (:class:`~twice_envs.agents.credit.twice.TwiceConfig`: ``pairs``,
# ``star``, ``coupled``); ``plan`` a :class:`~twice_envs.agents.credit.twice.BranchPlan`.


def branch_costs(episodes: Sequence, index: Sequence[tuple[int, int]]) -> np.ndarray:
    """``c_t``: the factual turn's length plus the tokens generated after it (at least 1): the published
    proxy for a twin's alternative turn and continuation."""
    return np.array([max(1, episodes[i].remaining_tokens(t)) for i, t in index], dtype=np.float64)


def turn_costs(episodes: Sequence, index: Sequence[tuple[int, int]]) -> np.ndarray:
    """``len_t``: the factual turn's tokens (a self-twin's alternative turn repeats it)."""
    return np.array([episodes[i].turns[t].num_tokens for i, t in index], dtype=np.float64)


def twins_per_decision(config) -> int:
    """Episodes run per branched decision, each costing about ``c_t``: ``J K`` twins and,
    for coupled pairs, ``J - 1`` replicas of the factual turn (one per pair beyond the
    factual episode; independent counterfactuals all pair with the factual episode)."""
    return config.pairs * config.star + (config.pairs - 1 if config.coupled else 0)


def expected_twin_costs(costs: np.ndarray, lens: np.ndarray, p_self: np.ndarray, config) -> np.ndarray:
    """Expected tokens per branched decision: ``J K`` twins of ``p_t len_t + (1 - p_t) c_t`` each (a self-twin
    costs its alternative turn, any other twin ``c_t``) and, for coupled pairs, ``J - 1`` replicas of ``c_t``
    each, run unless all ``K`` twins of their pair are self-twins (probability ``p_t^K``). With ``p_t = 0`` it
    is ``c_t`` x :func:`twins_per_decision`."""
    c, lens, p = (np.asarray(x, dtype=np.float64) for x in (costs, lens, p_self))
    replicas = (config.pairs - 1 if config.coupled else 0) * c * (1.0 - p**config.star)
    return config.pairs * config.star * (c - p * (c - lens)) + replicas


def accounted_tokens(plan, config, records: Sequence = ()) -> float:
    """Auxiliary tokens as the budget counts them. Every branched decision is charged its twin cost
    ``r c_t`` (``r``: the plan's ``cost_ratio``) for each twin and replica it runs, the twins the evidence coin
    skips included (as published), except that a self-twin among ``records`` (the twins run, ``twin_of`` and
    ``pair`` naming their decision and pair) is charged its alternative turn ``len_t`` only, and a replica whose
    pair's twins are all self-twins nothing: the budget self-twins free. Its expectation over the branch coins
    and the alternatives is the planned ``sum_t q_t E[cost_t]`` (:func:`expected_twin_costs`), which the
    bisection sets to ``beta`` x policy tokens; the tokens truly generated are reported beside it."""
    c = np.asarray(plan.costs, dtype=np.float64) * plan.cost_ratio
    full = float(np.dot(np.asarray(plan.branched, dtype=np.float64), c)) * twins_per_decision(config)
    row_of = {d: r for r, d in enumerate(plan.index)}
    lens = np.ones(len(plan.index)) if plan.turn_costs is None else plan.turn_costs
    freed, all_self = 0.0, {}
    for rec in records:
        r = row_of[tuple(int(v) for v in rec.twin_of)]
        if rec.self_twin:
            freed += c[r] - lens[r]
        all_self[(r, rec.pair)] = all_self.get((r, rec.pair), True) and bool(rec.self_twin)
    if config.coupled:
        freed += sum(c[r] for (r, j), s in all_self.items() if j > 0 and s)
    return full - freed


def twin_cost_sample(plan, records: Sequence, kept: Sequence[bool]) -> tuple[float, float]:
    """``(generated, proxy)``: the tokens truly generated by the twins and replicas among ``records`` that
    were continued (``kept``, their evidence coin; replicas: True) and are not self-twins, and the sum of
    their published proxies ``c_t``: one update's evidence for the twin cost ratio
    (:attr:`~twice_envs.agents.credit.predictor.PredictorState.twin_cost_ratio`). A twin the evidence coin
    stopped is left out: it is charged in full, as published, so its savings are not recycled."""
    row_of = {d: r for r, d in enumerate(plan.index)}
    gen = proxy = 0.0
    for rec, k in zip(records, kept):
        if rec.twin_of is None or rec.self_twin or not k:
            continue
        gen += rec.num_generated_tokens
        proxy += float(plan.costs[row_of[tuple(int(v) for v in rec.twin_of)]])
    return gen, proxy


def budget_stats(twins, plan, config) -> dict:
    """The budget's figures for one batch (``twins``: a :class:`~twice_envs.agents.rollout.twins.Twins`):
    target, planned (``sum_t q_t E[cost_t]``), accounted (self-twins
    charged their alternative turn, skipped twins in full: :func:`accounted_tokens`) and generated tokens,
    the tokens the realised self-twins freed (accounted as if none were a self-twin, minus accounted) and
    the plan's twin cost ratio."""
    accounted = accounted_tokens(plan, config, twins.records)
    full = float(np.dot(np.asarray(plan.branched, dtype=np.float64), plan.costs)) * plan.cost_ratio
    return {"aux_target": float(plan.budget),
            "aux_planned": float(np.dot(plan.q, plan.unit_costs(config))),
            "aux_accounted": accounted,
            "aux_generated": int(twins.aux_tokens),
            "aux_self_freed": full * twins_per_decision(config) - accounted,
            "twin_cost_ratio": float(plan.cost_ratio)}
