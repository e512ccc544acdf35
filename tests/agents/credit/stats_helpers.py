"""Shared statistics for the credit tests: per-decision-type bias checks on CreditToy."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np


def decision_types(episodes, index):
    """The type of a decision: the toy history before it and the action taken."""
    return [tuple(int(x.text) for x in episodes[i].turns[: t + 1]) for i, t in index]


def bias_z_scores(values, exact, types, min_count: int = 40, min_nonzero: int = 10):
    """z = (mean - exact) / standard error for every decision type with enough samples.

    A type whose exact advantage is 0 and whose estimates are all exactly 0 scores 0; a
    type with fewer than ``min_nonzero`` non-zero estimates is left out (its mean is a
    rare-event count, far from normal).
    """
    groups = defaultdict(list)
    truth = {}
    for v, a, k in zip(values, exact, types):
        groups[k].append(v)
        truth[k] = a
    zs = []
    for k, vs in groups.items():
        vs = np.asarray(vs, dtype=np.float64)
        if len(vs) < min_count:
            continue
        if abs(truth[k]) < 1e-9 and not vs.any():
            zs.append(0.0)
            continue
        if np.count_nonzero(vs) < min_nonzero:
            continue
        se = vs.std(ddof=1) / math.sqrt(len(vs))
        if se == 0:
            zs.append(0.0 if abs(vs.mean() - truth[k]) < 1e-12 else math.inf)
        else:
            zs.append((vs.mean() - truth[k]) / se)
    return np.asarray(zs)


def chi2_upper_z(zs) -> float:
    """Wilson-Hilferty normal score of sum(z^2) under chi-square(k): ~N(0, 1) when unbiased."""
    k = len(zs)
    x = float(np.sum(np.square(zs)))
    return ((x / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
