"""How strongly twins are coupled, and what the coupling is worth in budget.

At every audited decision the audits run one coupled twin (the alternative turn, then the
factual episode's downstream noise) and one independent counterfactual (the alternative turn,
then fresh noise): ``D_c = U - U'_c`` and ``D_i = U - U'_i`` at the same decisions. The
published variance result, ``Var(D_c | s) = (1 - rho) Var(D_i | s)``, says that one coupled twin
is worth ``X = 1 / (1 - rho)`` independent counterfactuals at equal variance, so the coupling is
worth ``X`` times the auxiliary budget of independent counterfactuals.

Two measures of ``rho``:

* ``rho-bar`` (:func:`~twice_envs.agents.stats.per_decision_rho`): the coupled pairs centred on
  their decision's values; exact in the labs, from the estimated oracle on LLM envs;
* the oracle-free lower bound :func:`lower_bound`, ``1 - Var(D_c) / Var(D_i)`` over all decisions.
  Pooled over decisions, both variances also hold the spread of ``A*`` across decisions
  (``Var D = E Var(D | s) + Var A*``), which coupling does not reduce, so the pooled ratio
  understates ``1 - E Var(D_c | s) / E Var(D_i | s)``; it needs no oracle.

Every figure has a 95% percentile bootstrap CI over the audit's resamples (groups or episodes,
as the audit's other figures). ``X``'s interval is the image of ``rho``'s, ``1 / (1 - lo)`` to
``1 / (1 - hi)`` (infinite where ``hi >= 1``); where ``rho``'s interval reaches 0 or below, the
coupling is undetermined by that measure and no multiple is given.

:func:`summarize_pair_set` gives the point figures of one pair set (the LLM audit's pair table):
the pooled correlation of ``(U, U')``, ties, reversals and ``Var D``.
"""

from __future__ import annotations

import io
from typing import Sequence

import numpy as np

from twice_envs.agents import stats as cs
from twice_envs.agents.lab.table2 import format_ci


def summarize_pair_set(name: str, pairs: np.ndarray, oracle: np.ndarray, threshold: float = cs.THRESHOLD) -> dict:
    """Pooled rho of ``(U, U')``, tie share, reversal share (``D`` against ``A*``'s sign) and ``Var D``."""
    big = np.abs(oracle) >= threshold
    d = pairs[:, 0] - pairs[:, 1]
    return {
        "method": name,
        "pairs": "twin" if name == "twice" else "independent",
        "rho_pooled": cs.pearson(pairs[:, 0], pairs[:, 1]),
        "tie_share": float(np.mean(d == 0)) if len(d) else float("nan"),
        "reversal_share": float(np.mean(np.sign(d[big]) == -np.sign(oracle[big]))) if big.any() else float("nan"),
        "var_d": float(np.var(d)) if len(d) else float("nan"),
    }


def lower_bound(d_coupled, d_independent) -> float:
    """``1 - Var(D_c) / Var(D_i)`` over the decisions (population variances; NaN where ``Var(D_i)`` is 0
    or there are no decisions)."""
    dc = np.asarray(d_coupled, dtype=np.float64)
    di = np.asarray(d_independent, dtype=np.float64)
    if len(dc) != len(di):
        raise ValueError(f"coupled and independent differences must cover the same decisions, got {len(dc)} "
                         f"and {len(di)}")
    vi = float(np.var(di)) if len(di) else 0.0
    return 1.0 - float(np.var(dc)) / vi if vi > 0 else float("nan")


def budget_multiple(rho: dict) -> dict:
    """``X = 1 / (1 - rho)`` with the interval carried through from ``rho``'s ``{"value", "lo", "hi"}``.

    Returns ``{"value", "lo", "hi", "determined"}``: ``determined`` is False (and the figures NaN) where
    ``rho``'s interval is undefined or does not lie above 0; an end at ``rho >= 1`` is infinite."""
    lo, hi, value = float(rho["lo"]), float(rho["hi"]), float(rho["value"])
    if not (np.isfinite(lo) and np.isfinite(hi) and np.isfinite(value)) or lo <= 0:
        return {"value": float("nan"), "lo": float("nan"), "hi": float("nan"), "determined": False}

    def x(r: float) -> float:
        return 1.0 / (1.0 - r) if r < 1 else float("inf")

    return {"value": x(value), "lo": x(lo), "hi": x(hi), "determined": True}


def coupling_summary(u, u_coupled, u_independent, v_after, v_before, self_twin, indices: Sequence[np.ndarray], *,
                     oracle: str) -> dict:
    """The coupling figures of one audit.

    Args:
        u: the factual utility ``U`` at each decision.
        u_coupled: the coupled twin's utility ``U'_c`` (``U`` for a self-twin).
        u_independent: the independent counterfactual's utility ``U'_i``.
        v_after, v_before: ``V(s_{t+1})`` and ``V(s_t)`` (the means rho-bar centres on).
        self_twin: whether the coupled twin's alternative turn was the factual turn.
        indices: bootstrap resamples (:func:`~twice_envs.agents.stats.resample_indices`).
        oracle: ``"exact"`` or ``"estimated"``: where rho-bar's centres come from.

    Returns a JSON-ready dict: ``decisions``, ``oracle``, ``rho_bar``, ``lower_bound``, ``var_d_coupled``,
    ``var_d_independent``, ``tie_share_coupled``, ``tie_share_independent``, ``self_twin_share`` (each an
    estimate ``{"value", "lo", "hi"}``), ``worth`` (:func:`budget_multiple` of the lower bound and of rho-bar)
    and ``line``, the sentence the audits print (:func:`worth_line`).
    """
    u, uc, ui, va, vb = (np.asarray(x, dtype=np.float64) for x in (u, u_coupled, u_independent, v_after, v_before))
    st = np.asarray(self_twin, dtype=np.float64)
    dc, di = u - uc, u - ui

    def ci(stat, *arrays) -> dict:
        return cs.bootstrap_ci(stat, *arrays, indices=indices).as_dict()

    def share_zero(d) -> float:
        return float(np.mean(d == 0)) if len(d) else float("nan")

    def var(d) -> float:
        return float(np.var(d)) if len(d) else float("nan")

    out = {
        "decisions": int(len(u)),
        "oracle": oracle,
        "rho_bar": ci(cs.per_decision_rho, u, uc, va, vb),
        "lower_bound": ci(lower_bound, dc, di),
        "var_d_coupled": ci(var, dc),
        "var_d_independent": ci(var, di),
        "tie_share_coupled": ci(share_zero, dc),
        "tie_share_independent": ci(share_zero, di),
        "self_twin_share": ci(lambda s: float(np.mean(s)) if len(s) else float("nan"), st),
    }
    out["worth"] = {"lower_bound": budget_multiple(out["lower_bound"]), "rho_bar": budget_multiple(out["rho_bar"])}
    out["line"] = worth_line(out)
    return out


def _multiple(w: dict) -> str:
    return f"{w['value']:.3g} [{w['lo']:.3g}, {w['hi']:.3g}]"  # an end at rho >= 1 prints as inf


def worth_line(summary: dict) -> str:
    """The one sentence on what coupling is worth.

    Where the oracle-free lower bound's interval lies above 0: the budget multiple at the bound, and beside it
    the multiple at rho-bar (named with its oracle). Elsewhere the coupling is undetermined and the sentence
    gives no multiple, except at an exact rho-bar (the labs), which stands on its own; a rho-bar from an
    estimated oracle does not (where outcomes hardly vary it reflects the oracle's estimates, not the pairs)."""
    wl, wr = summary["worth"]["lower_bound"], summary["worth"]["rho_bar"]
    bound = format_ci(summary["lower_bound"])
    rho = f"rho-bar ({summary['oracle']} oracle) {format_ci(summary['rho_bar'])}"
    at_rho = f"at {rho}: " + (f"{_multiple(wr)} times" if wr["determined"] else
                              "undetermined (its CI does not lie above 0)")
    if wl["determined"]:
        return (f"coupling is worth about {_multiple(wl)} times the budget of independent counterfactuals here "
                f"(X = 1/(1 - rho) at the oracle-free lower bound rho >= {bound}; {at_rho})")
    why = (f"{bound} has a 95% CI that does not lie above 0" if np.isfinite(summary["lower_bound"]["value"])
           else "is undefined (the independent differences do not vary)")
    tail = at_rho if summary["oracle"] == "exact" else f"{rho} alone gives none: its oracle is estimated"
    return f"coupling is undetermined here: the oracle-free lower bound {why}, so it gives no budget multiple ({tail})"


def write_coupling(out: io.StringIO, summary: dict, resampled: str) -> None:
    """The coupling block of an audit's text output (``resampled``: what the bootstrap resamples)."""
    s = summary
    out.write(f"coupling: one coupled twin and one independent counterfactual at each of {s['decisions']} decisions "
              f"(95% CIs over {resampled})\n")
    out.write(f"  rho-bar ({s['oracle']} oracle): {format_ci(s['rho_bar'])}\n")
    out.write(f"  oracle-free lower bound 1 - Var(D coupled) / Var(D independent): {format_ci(s['lower_bound'])} "
              f"(Var D coupled {format_ci(s['var_d_coupled'])}, independent {format_ci(s['var_d_independent'])})\n")
    out.write(f"  ties (D = 0) %: coupled {format_ci(s['tie_share_coupled'], True)}, independent "
              f"{format_ci(s['tie_share_independent'], True)}; self-twins % {format_ci(s['self_twin_share'], True)}\n")
    out.write(f"  {s['line']}\n")
