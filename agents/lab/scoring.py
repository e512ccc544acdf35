"""An audit's figures from its per-decision credit: each method's row with bootstrap CIs, the per-turn table.

Both audits score the same way: :func:`row_stats` gives one method's wrong-sign rate (as published: zero
credit is never wrong), wrong-sign among non-zero credits, zero-credit share, Pearson, MSE / GRPO's, the
pair ceiling and rho-bar, each with its CI over shared resamples; :func:`per_turn_table` breaks Pearson and
wrong-sign down by turn; :func:`summarize_audit` assembles the LLM audit's result from its credits (the lab
audit assembles its own in :func:`~twice_envs.agents.lab.lab_audit.run_lab_audit`).
"""

from __future__ import annotations

import numpy as np

from twice_envs.agents import stats as cs
from twice_envs.agents.lab.audit_config import AuditConfig, AuditResult
from twice_envs.agents.lab.compare import budget_comparisons, equal_token_comparisons
from twice_envs.agents.lab.coupling import coupling_summary, summarize_pair_set
from twice_envs.agents.lab.table2 import mark_tables

#: The rows the per-turn breakdowns show: one of each kind of credit.
BREAKDOWN_ROWS = ("grpo", "gigpo", "twice J1", "crr J1", "vineppo K2")
#: The rows the scatter plots (and the LLM audit's breakdowns) show: the same and Twice's training-time credit.
SHOWN_ROWS = ("grpo", "gigpo", "twice J1", "twice-train", "crr J1", "vineppo K2")


def row_stats(name, c, oracle, grpo, pairs, aux, idx, threshold, rho=None) -> dict:
    """One method row: wrong-sign rate (as published: zero is never wrong), wrong-sign among non-zero
    credits, zero-credit share, Pearson, MSE / GRPO's, the pair ceiling and
    rho-bar, each with its bootstrap CI over the resamples ``idx`` (shared by the lab and the audit)."""
    ws = lambda x, a: cs.wrong_sign_rate(x, a, threshold)  # noqa: E731
    zs = lambda x, a: cs.zero_credit_share(x, a, threshold)  # noqa: E731
    wn = lambda x, a: cs.wrong_sign_nonzero(x, a, threshold)  # noqa: E731
    row = {
        "method": name,
        "aux_tokens": int(aux),
        "wrong_sign": cs.bootstrap_ci(ws, c, oracle, indices=idx).as_dict(),
        "wrong_sign_nonzero": cs.bootstrap_ci(wn, c, oracle, indices=idx).as_dict(),
        "zero_credit": cs.bootstrap_ci(zs, c, oracle, indices=idx).as_dict(),
        "pearson": cs.bootstrap_ci(cs.pearson, c, oracle, indices=idx).as_dict(),
        "mse_vs_grpo": cs.bootstrap_ci(cs.mse_ratio, c, oracle, grpo, indices=idx).as_dict(),
    }
    if pairs:
        row["ceiling"] = cs.bootstrap_ci(lambda a: cs.one_pair_ceiling(a, pairs).pearson, oracle, indices=idx).as_dict()
        row["ceiling_share"] = row["pearson"]["value"] / row["ceiling"]["value"]
    if rho is not None:
        row["rho_bar"] = cs.bootstrap_ci(cs.per_decision_rho, *rho, indices=idx).as_dict()
    return row


def per_turn_table(oracle, credit, turns, threshold, methods=BREAKDOWN_ROWS) -> list[dict]:
    """Pearson and wrong-sign per turn index (turns past 5 pooled)."""
    out = []
    bins = np.minimum(turns, 6)
    for b in np.unique(bins):
        sel = bins == b
        row = {"turn": f"{b}+" if b == 6 else str(b), "decisions": int(sel.sum())}
        for m in methods:
            if m in credit:
                row[f"{m} pearson"] = cs.pearson(credit[m][sel], oracle[sel])
                row[f"{m} wrong_sign"] = cs.wrong_sign_rate(credit[m][sel], oracle[sel], threshold)
        out.append(row)
    return out


def budget_figures(stats: dict) -> dict:
    """A budgeted method's tokens on the audit batch: target (beta x policy tokens), accounted and
    truly generated, and their ratios to the target."""
    target = float(stats["aux_target"])
    acc, gen = float(stats["aux_accounted"]), float(stats["aux_generated"])
    return {"target": target, "accounted": acc, "generated": gen,
            "accounted_ratio": acc / target if target > 0 else float("nan"),
            "generated_ratio": gen / target if target > 0 else float("nan")}


def summarize(oracle: np.ndarray, credit: dict, aux: dict, threshold: float = cs.THRESHOLD) -> list[dict]:
    """Point figures per method (wrong-sign rate, zero share, MSE / GRPO's, Pearson, aux tokens)."""
    big = np.abs(oracle) >= threshold
    rows = []
    for name, c in credit.items():
        rows.append({
            "method": name,
            "decisions": int(len(c)),
            "scored": int(big.sum()),
            "wrong_sign": cs.wrong_sign_rate(c, oracle, threshold),
            "zero_credit": cs.zero_credit_share(c, oracle, threshold),
            "mse": cs.mse(c, oracle),
            "mse_vs_grpo": cs.mse_ratio(c, oracle, credit["grpo"]) if "grpo" in credit else float("nan"),
            "pearson": cs.pearson(c, oracle),
            "aux_tokens": int(aux.get(name, 0)),
        })
    return rows


def summarize_audit(config: AuditConfig, oracle, episodes, turns, credit, aux, pairs_of, pair_sets, v_before, v_after,
                    policy_tokens=0, questions=0, group_utilities=(), budget=None,
                    oracle_se=None, gigpo_penalty=None, diagnostic=None, *, self_twin=None,
                    groups=None) -> AuditResult:
    """The rows with CIs (marked by table, :func:`~twice_envs.agents.lab.table2.mark_tables`), the pair
    table, the coupling figures, the per-turn table and the comparisons (``oracle_se``: the standard error
    of each decision's ``A*``, kept on the result; none by default).

    ``diagnostic``: the names of the diagnostic rows (default: every row), among which Twice's
    equal-token comparisons are made; the others hold update credit. ``budget``: each budgeted
    update row's credit-step statistics (its comparisons with Twice's update row are made at the
    same budget). ``groups``: what the bootstrap resamples (default: the audited ``episodes``; several
    audited episodes of one question share its group). The coupling figures need both pair sets
    (``twice``: coupled, ``crr``: independent) and ``self_twin``, each decision's flag (default: none)."""
    budget = budget or {}
    groups = episodes if groups is None else groups
    idx = list(cs.resample_indices(len(oracle), config.n_boot, groups=groups, seed=config.seed))
    rho = {name: (p[:, 0], p[:, 1], v_after, v_before) for name, p in pair_sets.items()}
    rows = [row_stats(n, credit[n], oracle, credit["grpo"], pairs_of[n], aux[n], idx, config.threshold,
                       rho.get(n.split()[0]) if n in ("twice J1", "crr J1") else None) for n in credit]
    # Twice's training-time A_hat is diagnostic too (compared at the budget, not at equal tokens)
    table2 = mark_tables(rows, list(credit) if diagnostic is None else list(diagnostic) + ["twice-train"])
    pair_rows = [summarize_pair_set(name, p, oracle, config.threshold) for name, p in pair_sets.items()]
    for pr in pair_rows:
        pr["rho_bar"] = cs.per_decision_rho(*rho[pr["method"]])
    coupling = {}
    if {"twice", "crr"} <= set(pair_sets):
        tw, ind = pair_sets["twice"], pair_sets["crr"]
        flags = np.zeros(len(oracle), dtype=bool) if self_twin is None else self_twin
        coupling = coupling_summary(tw[:, 0], tw[:, 1], ind[:, 1], v_after, v_before, flags, idx,
                                    oracle="estimated")
    methods = [m for m in SHOWN_ROWS if m in credit]
    names = list(credit) if diagnostic is None else diagnostic
    comparisons = equal_token_comparisons(oracle, {n: credit[n] for n in names}, aux, idx, config.threshold)
    if "twice" in budget:
        comparisons += budget_comparisons(oracle, credit, budget, idx, config.threshold)
    return AuditResult(config, oracle, episodes, turns, credit, aux, pairs_of, rows, pair_rows,
                       per_turn_table(oracle, credit, turns, config.threshold, methods), comparisons,
                       policy_tokens, questions, list(group_utilities),
                       budget={n: budget_figures(st) for n, st in budget.items()},
                       gigpo_penalty=gigpo_penalty or {},
                       oracle_se=np.zeros(0) if oracle_se is None else np.asarray(oracle_se, float),
                       coupling=coupling, table2=table2)
