"""Statistics for scoring credit against a true advantage, with bootstrap confidence intervals.

Pure functions on arrays: ``credit`` is an estimator's credit per decision and
``oracle`` the true (or oracle-estimated) advantage ``A*`` of the same decisions.

* Point figures: :func:`wrong_sign_rate` (as published: zero credit is never wrong),
  :func:`wrong_sign_nonzero` (among non-zero credits), :func:`zero_credit_share`, :func:`pearson`,
  :func:`mse`, :func:`mse_ratio`.
* :func:`one_pair_ceiling`: the best any unbiased credit built from ``J`` outcome pairs
  with 0/1 outcomes can do. Such a credit ``D`` in ``{-1, 0, 1}`` with ``E[D | s] = A*``
  has ``E[D^2 | s] = P(D != 0) >= |A*|``, so ``Var(D | s) >= |A*| - A*^2``; the mean of
  ``J`` independent pairs divides that by ``J``. Hence ``MSE >= (E|A*| - E A*^2) / J`` and
  ``Pearson <= sqrt(Var A* / (Var A* + (E|A*| - E A*^2) / J))``.
* :func:`per_decision_rho`: the correlation of ``(U, U')`` *within* a decision, which is
  what sets a twin's variance (``Var D = Var U + Var U' - 2 rho sd sd``); the pooled
  correlation across decisions also counts that good states give high ``U`` and ``U'``
  alike, and overstates it.
* :func:`bootstrap_ci`: percentile bootstrap with a fixed seed, resampling decisions or
  whole groups (an episode's decisions are not independent; resampling groups keeps
  them together). :func:`compare` gives a difference between two estimators (paired:
  the same decisions) or two samples (unpaired: e.g. two methods' seeds) with its CI.
* Success rates: :func:`wilson` (a binomial proportion's interval), :func:`paired_change`
  (a change over paired 0/1 outcomes), :func:`episodes_for_difference` and
  :func:`pairs_resolution` (how many episodes a given resolution needs).
* Few paired figures (a training measure compared update by update): :func:`paired_mean`, the
  mean difference with its Student t interval (:func:`t_quantile`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

#: Decisions with ``|A*|`` at least this count for the wrong-sign rate (published setting).
THRESHOLD = 0.05
#: Bootstrap resamples (percentile CIs are stable to about +-0.005 at 2,000).
N_BOOT = 2000


# --------------------------------------------------------------------------- point figures


def _arrays(*xs) -> list[np.ndarray]:
    out = [np.asarray(x, dtype=np.float64).ravel() for x in xs]
    if len({len(x) for x in out}) > 1:
        raise ValueError(f"arrays must have equal lengths, got {[len(x) for x in out]}")
    return out


def wrong_sign_rate(credit, oracle, threshold: float = THRESHOLD) -> float:
    """Share of decisions with ``|A*| >= threshold`` whose credit has strictly the opposite sign
    (zero credit is not wrong-signed; see :func:`zero_credit_share`). NaN when none qualify."""
    c, a = _arrays(credit, oracle)
    big = np.abs(a) >= threshold
    return float(np.mean(np.sign(c[big]) == -np.sign(a[big]))) if big.any() else float("nan")


def wrong_sign_nonzero(credit, oracle, threshold: float = THRESHOLD) -> float:
    """:func:`wrong_sign_rate` among the decisions whose credit is not exactly zero: how often a
    credit that says something says the wrong thing (NaN when none qualify)."""
    c, a = _arrays(credit, oracle)
    sel = (np.abs(a) >= threshold) & (c != 0)
    return float(np.mean(np.sign(c[sel]) == -np.sign(a[sel]))) if sel.any() else float("nan")


def zero_credit_share(credit, oracle, threshold: float = THRESHOLD) -> float:
    """Share of decisions with ``|A*| >= threshold`` that get exactly zero credit (NaN when none)."""
    c, a = _arrays(credit, oracle)
    big = np.abs(a) >= threshold
    return float(np.mean(c[big] == 0)) if big.any() else float("nan")


def pearson(x, y) -> float:
    """Pearson correlation; NaN with fewer than two points or a constant side."""
    a, b = _arrays(x, y)
    if len(a) < 2 or a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def mse(credit, oracle) -> float:
    """Mean squared error of the credit against ``A*`` (NaN when empty)."""
    c, a = _arrays(credit, oracle)
    return float(np.mean((c - a) ** 2)) if len(c) else float("nan")


def mse_ratio(credit, oracle, reference) -> float:
    """``MSE(credit) / MSE(reference)`` on the same decisions (the audit uses GRPO as reference)."""
    ref = mse(reference, oracle)
    return mse(credit, oracle) / ref if ref > 0 else float("nan")


@dataclass(frozen=True)
class Ceiling:
    """The best unbiased credit from ``pairs`` 0/1-outcome pairs per decision can reach."""

    pearson: float
    """Upper bound on the Pearson correlation with ``A*``."""
    mse: float
    """Lower bound on the MSE against ``A*``."""
    pairs: int
    """``J``, the independent pairs averaged per decision."""


def one_pair_ceiling(oracle, pairs: int = 1) -> Ceiling:
    """Bounds for unbiased credit from ``pairs`` outcome pairs with 0/1 outcomes (see the module)."""
    if pairs < 1:
        raise ValueError(f"pairs must be >= 1, got {pairs}")
    (a,) = _arrays(oracle)
    if not len(a):
        return Ceiling(float("nan"), float("nan"), pairs)
    floor = max(float(np.mean(np.abs(a)) - np.mean(a**2)), 0.0) / pairs
    var = float(a.var())
    r = float(np.sqrt(var / (var + floor))) if var + floor > 0 else float("nan")
    return Ceiling(r, floor, pairs)


def per_decision_rho(u, u_twin, mean_u, mean_twin) -> float:
    """``rho-bar``: the correlation of ``(U, U')`` within decisions.

    Each pair is centred on its own decision's means, ``E[U | s_t, y_t] = V(s_{t+1})`` and
    ``E[U' | s_t] = V(s_t)`` (exact in the lab, oracle estimates elsewhere), and the
    centred pairs are pooled: ``sum(c c') / sqrt(sum c^2 sum c'^2)``. It equals the
    decision-weighted conditional correlation when the conditional variances are alike;
    unlike the pooled Pearson of ``(U, U')`` it does not count between-state correlation.
    """
    x, y, mx, my = _arrays(u, u_twin, mean_u, mean_twin)
    cx, cy = x - mx, y - my
    den = float(np.sqrt(np.sum(cx**2) * np.sum(cy**2)))
    return float(np.sum(cx * cy) / den) if den > 0 else float("nan")


# --------------------------------------------------------------------------- bootstrap


@dataclass(frozen=True)
class Estimate:
    """A figure with its bootstrap confidence interval."""

    value: float
    """The figure on the full sample."""
    lo: float
    """Lower end of the CI."""
    hi: float
    """Upper end of the CI."""

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.lo:.3f}, {self.hi:.3f}]"

    def as_dict(self) -> dict:
        return {"value": self.value, "lo": self.lo, "hi": self.hi}


def resample_indices(n: int, n_boot: int, *, groups: Optional[Sequence] = None, seed: int = 0):
    """``n_boot`` index arrays into ``n`` rows: rows drawn with replacement, or whole groups
    (every row of a drawn group, so a group drawn twice appears twice)."""
    rng = np.random.default_rng(seed)
    if groups is None:
        for _ in range(n_boot):
            yield rng.integers(0, n, n)
        return
    g = np.asarray(groups)
    if len(g) != n:
        raise ValueError(f"groups must label every row ({n}), got {len(g)}")
    members = [np.flatnonzero(g == k) for k in np.unique(g)]
    for _ in range(n_boot):
        pick = rng.integers(0, len(members), len(members))
        yield np.concatenate([members[k] for k in pick])


def _percentiles(values: Sequence[float], level: float) -> tuple[float, float]:
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if not len(v):
        return float("nan"), float("nan")
    alpha = (1.0 - level) / 2.0
    return float(np.quantile(v, alpha)), float(np.quantile(v, 1.0 - alpha))


def bootstrap_ci(
    stat: Callable[..., float],
    *arrays,
    groups: Optional[Sequence] = None,
    n_boot: int = N_BOOT,
    level: float = 0.95,
    seed: int = 0,
    indices: Optional[Sequence[np.ndarray]] = None,
) -> Estimate:
    """Percentile bootstrap CI of ``stat(*arrays)``, resampling rows (or ``groups``) jointly.

    Resamples where the statistic is undefined (NaN) are left out of the percentiles.
    ``indices`` (from :func:`resample_indices`) reuses one set of resamples for many figures.
    """
    arrs = [np.asarray(a) for a in arrays]
    n = len(arrs[0])
    if any(len(a) != n for a in arrs):
        raise ValueError("arrays must have equal lengths")
    value = float(stat(*arrs))
    if n == 0:
        return Estimate(value, float("nan"), float("nan"))
    draws = indices if indices is not None else resample_indices(n, n_boot, groups=groups, seed=seed)
    boots = [stat(*(a[idx] for a in arrs)) for idx in draws]
    lo, hi = _percentiles(boots, level)
    return Estimate(value, lo, hi)


@dataclass(frozen=True)
class Comparison:
    """``stat(a) - stat(b)`` with its bootstrap CI."""

    a: float
    """The figure for the first sample."""
    b: float
    """The figure for the second sample."""
    diff: Estimate
    """``a - b`` and its CI."""

    @property
    def significant(self) -> bool:
        """The CI of the difference excludes 0."""
        return bool(self.diff.lo > 0 or self.diff.hi < 0)

    def as_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "diff": self.diff.as_dict(), "significant": self.significant}


def compare(
    stat: Callable[..., float],
    a: Sequence,
    b: Sequence,
    *,
    paired: bool = True,
    groups: Optional[Sequence] = None,
    n_boot: int = N_BOOT,
    level: float = 0.95,
    seed: int = 0,
    indices: Optional[Sequence[np.ndarray]] = None,
) -> Comparison:
    """Difference ``stat(*a) - stat(*b)`` with a percentile bootstrap CI.

    ``a`` and ``b`` are tuples of arrays (the arguments of ``stat``). ``paired``: both
    are measured on the same rows (two estimators on the same decisions), which are
    resampled together (by ``groups`` if given); otherwise each sample is resampled on
    its own (e.g. two methods' independent seeds). ``indices`` (paired only) reuses resamples.
    """
    a = [np.asarray(x) for x in a]
    b = [np.asarray(x) for x in b]
    va, vb = float(stat(*a)), float(stat(*b))
    if paired:
        n = len(a[0])
        if any(len(x) != n for x in a + b):
            raise ValueError("paired samples must have equal lengths")
        draws = indices if indices is not None else resample_indices(n, n_boot, groups=groups, seed=seed)
        diffs = [stat(*(x[i] for x in a)) - stat(*(x[i] for x in b)) for i in draws]
    else:
        ia = resample_indices(len(a[0]), n_boot, seed=seed)
        ib = resample_indices(len(b[0]), n_boot, seed=seed + 1)
        diffs = [stat(*(x[i] for x in a)) - stat(*(x[j] for x in b)) for i, j in zip(ia, ib)]
    lo, hi = _percentiles(diffs, level)
    return Comparison(va, vb, Estimate(va - vb, lo, hi))


# --------------------------------------------------------------------------- success rates


def wilson(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion."""
    if n <= 0:
        return (float("nan"), float("nan"))
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def episodes_for_difference(p: float, diff: float = 0.05, z: float = 1.96) -> int:
    """Held-out episodes per method for a 95% interval of a difference of two success rates near ``p``
    to have half-width ``diff`` (so a ``diff``-point gap excludes 0)."""
    p = min(max(p, 0.05), 0.95)
    return int(math.ceil(2 * p * (1 - p) * (z / diff) ** 2))


def paired_change(after: Sequence[int], before: Sequence[int], z: float = 1.96) -> dict:
    """Mean change of success over paired held-out episodes (the same task and sampling noise before
    and after training) with a 95% normal interval of the mean of the per-episode differences."""
    if len(after) != len(before) or not after:
        raise ValueError(f"paired outcomes must have the same nonzero length, got {len(after)} and {len(before)}")
    d = np.asarray(after, float) - np.asarray(before, float)
    half = z * float(d.std(ddof=1)) / math.sqrt(len(d)) if len(d) > 1 else float("inf")
    return {"change": float(d.mean()), "change_ci": [float(d.mean()) - half, float(d.mean()) + half],
            "improves": bool(d.mean() - half > 0), "n": len(d)}


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t distribution with ``df`` degrees of freedom (``0.5 < p < 1``).

    The density is integrated by Simpson's rule and the quantile found by bisection: accurate to
    about 1e-7, which is all an interval needs (``t_quantile(0.975, 14)`` = 2.1448)."""
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"need 0.5 < p < 1 and df >= 1, got p={p}, df={df}")
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def upper_from_zero(t: float, steps: int = 4000) -> float:  # P(0 < T < t)
        h = t / steps
        f = [math.exp(log_c - (df + 1) / 2 * math.log1p((i * h) ** 2 / df)) for i in range(steps + 1)]
        return h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))

    lo, hi = 0.0, 1.0
    while 0.5 + upper_from_zero(hi) < p:
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 0.5 + upper_from_zero(mid) < p else (lo, mid)
    return (lo + hi) / 2


def paired_mean(differences: Sequence[float], level: float = 0.95) -> dict:
    """Mean of paired differences (one per update, say) with its Student t interval over them:
    ``{"mean", "ci", "n", "significant"}``. For a few pairs, where a normal interval is too short."""
    d = np.asarray(differences, dtype=np.float64)
    if len(d) < 2:
        raise ValueError(f"a t interval needs two differences or more, got {len(d)}")
    half = t_quantile(0.5 + level / 2, len(d) - 1) * float(d.std(ddof=1)) / math.sqrt(len(d))
    mean = float(d.mean())
    return {"mean": mean, "ci": [mean - half, mean + half], "n": len(d),
            "significant": bool(mean - half > 0 or mean + half < 0)}


def pairs_resolution(pairs: dict, diff: float = 0.05, z: float = 1.96) -> tuple[float, int, int]:
    """``(largest half-width, episodes per method, episodes needed)`` of the between-method paired
    intervals: the episodes each method would need for every pair's interval to have half-width
    ``diff``, from the observed spread of the differences (half-width falls as one over the root of n).

    Each half-width is at least that of 5% discordant pairs, as :func:`episodes_for_difference`
    floors the rate: when few episodes disagree (every method at 0 or 1) the observed spread says
    too little."""
    n = min(x["n"] for x in pairs.values())
    half = max(max((x["change_ci"][1] - x["change_ci"][0]) / 2 for x in pairs.values()), z * math.sqrt(0.05 / n))
    return half, n, int(math.ceil(n * (half / diff) ** 2))
