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
