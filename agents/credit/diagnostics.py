"""Per-update diagnostics of twin credit: correlations of the pairs, shares of self-twins, same-evidence
twins and ties, and the size of the twin term (logged in every update's metrics)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from twice_envs.agents.stats import per_decision_rho
from twice_envs.agents.types import EpisodeRecord

#: Quantiles of the twin term ``omega A_hat / sigma_hat`` logged per update.
TERM_QUANTILES = (0.5, 0.9, 0.99)


def twin_stats(credit, plan, twins: Sequence[EpisodeRecord], *, omega: float = 1.0, scale: float = 1.0) -> dict:
    """Per-update diagnostics of a batch's twin credit ``credit`` (a :class:`~.twice.TwinCredit`) under its
    branch plan ``plan`` (a :class:`~.twice.BranchPlan`): twin correlations, self-twin, same-evidence and tie
    shares, branch probability, and the size of the twin term ``omega A_hat / sigma_hat`` over the branched
    decisions (quantiles of its absolute value, and its maximum)."""
    kept = [(u, v) for (_, u, v, _, k), tw in zip(credit.pairs, twins) if k and not tw.self_twin]
    n = len(twins)
    out = {
        "twins": n,
        "self_twin_share": float(np.mean([tw.self_twin for tw in twins])) if n else float("nan"),
        "same_evidence_share": (float(np.mean([bool(tw.same_evidence) and not tw.self_twin for tw in twins]))
                                if n else float("nan")),
        "tie_share": float(np.mean([u == v for (_, u, v, _, _) in credit.pairs])) if n else float("nan"),
        "mean_q": float(np.mean(plan.q)) if len(plan.q) else float("nan"),
        "branched_share": float(np.mean(plan.branched)) if len(plan.branched) else float("nan"),
        "rho": pair_correlation(kept),
        "rho_per_decision": within_decision_rho(credit.pairs),
        "sigma_hat": float(scale),
    }
    term = np.abs(omega * credit.a_hat[np.asarray(plan.branched, dtype=bool)] / scale)
    for qq in TERM_QUANTILES:
        out[f"twin_term_q{round(qq * 100)}"] = float(np.quantile(term, qq)) if term.size else float("nan")
    out["twin_term_max"] = float(term.max()) if term.size else float("nan")
    return out


def within_decision_rho(pairs: Sequence[tuple[int, float, float, int, bool]]) -> float:
    """``rho-bar`` from the kept pairs of decisions with at least two of them: each pair is
    centred on its decision's means of ``U`` and ``U'`` and the centred pairs are pooled
    (:func:`~twice_envs.agents.stats.per_decision_rho`). It needs ``J >= 2``
    independent pairs (a star shares one ``U``); NaN otherwise."""
    by: dict[int, list[tuple[float, float]]] = {}
    for r, u, v, _, k in pairs:
        if k:
            by.setdefault(r, []).append((u, v))
    rows = [np.asarray(p, dtype=np.float64) for p in by.values() if len(p) >= 2]
    if not rows:
        return float("nan")
    u = np.concatenate([p[:, 0] for p in rows])
    v = np.concatenate([p[:, 1] for p in rows])
    mu = np.concatenate([np.full(len(p), p[:, 0].mean()) for p in rows])
    mv = np.concatenate([np.full(len(p), p[:, 1].mean()) for p in rows])
    return per_decision_rho(u, v, mu, mv)


def pair_correlation(pairs: Sequence[tuple[float, float]]) -> float:
    """Pearson correlation of ``(U, U')`` pooled over twin pairs of all decisions (NaN if
    either side is constant). It counts correlation *between* states too (good states
    give high ``U`` and ``U'`` alike); :func:`within_decision_rho` does not."""
    if len(pairs) < 2:
        return float("nan")
    a = np.asarray(pairs, dtype=np.float64)
    if a[:, 0].std() == 0 or a[:, 1].std() == 0:
        return float("nan")
    return float(np.corrcoef(a[:, 0], a[:, 1])[0, 1])
