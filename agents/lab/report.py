"""The audits' reports: the text tables and the files of a lab audit and of an LLM audit.

:func:`format_lab` and :func:`write_lab` report a lab audit (:mod:`~twice_envs.agents.lab.lab_audit`),
:func:`format_table` and :func:`write_outputs` an LLM audit (:mod:`~twice_envs.agents.lab.audit`); both
print the published credit table first (:mod:`~twice_envs.agents.lab.table2`), then the budgets, the
coupling figures and the per-turn and paired breakdowns (:func:`write_breakdowns`).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import numpy as np

from twice_envs.agents.lab.audit_config import AuditResult
from twice_envs.agents.lab.coupling import write_coupling
from twice_envs.agents.lab.lab_audit import LabAuditResult
from twice_envs.agents.lab.plots import plot_credit_scatter
from twice_envs.agents.lab.scoring import BREAKDOWN_ROWS, SHOWN_ROWS
from twice_envs.agents.lab.table2 import format_ci, write_tables
from twice_envs.agents.records import AUDIT_EPISODES, LAB_EPISODES, decision_lines, write_lines
from twice_envs.trajectory import atomic_write_text


def write_breakdowns(out: io.StringIO, per_turn: Sequence[dict], comparisons: Sequence[dict],
                     methods: Sequence[str], *, ratios: bool) -> None:
    """The per-turn table of ``methods`` and Twice's comparisons at no more auxiliary tokens
    (with the wrong-sign ratio where ``ratios`` and the comparison has one)."""
    def fig(x: float, spec: str) -> str:
        return format(x, spec) if np.isfinite(x) else "n/a"

    out.write("per turn (Pearson / wrong-sign %; n/a: undefined, e.g. the Pearson of a credit that does not vary):\n")
    for r in per_turn:
        cells = "  ".join(f"{m}: {fig(r[m + ' pearson'], '.2f')}/{fig(100 * r[m + ' wrong_sign'], '.0f')}"
                          for m in methods if m + " pearson" in r)
        out.write(f"  turn {r['turn']:<3} n={r['decisions']:<5} {cells}\n")
    out.write("Twice vs baselines (difference, 95% CI, significant?; each line says whether the tokens match):\n")
    for c in comparisons:
        d = c["diff"]
        if np.isfinite(d["value"]):
            verdict = (f"{d['value']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}] "
                       f"{'significant' if c['significant'] else 'not significant'}")
        else:
            verdict = "n/a: the figure is undefined for one of them on these decisions (no comparison)"
        out.write(f"  {c['figure']:<10} {c['twice']} ({c['twice_tokens']} tok) - {c['baseline']} "
                  f"({c['baseline_tokens']} tok): {verdict}"
                  + (f"; ratio {format_ci(c['ratio'])}" if ratios and "ratio" in c else "")
                  + (f"  [{c['label']}]" if "label" in c else "") + "\n")


def write_budget(out: io.StringIO, budget: dict, penalty: dict) -> None:
    """The budgeted rows' tokens against the budget, and what GiGPO's penalty changes."""
    for name, b in budget.items():
        gen = "n/a (not rerun)" if not np.isfinite(b["generated_ratio"]) else f"{b['generated_ratio']:.3f}"
        out.write(f"budget of {name}: accounted aux tokens / (beta x policy tokens) = {b['accounted_ratio']:.3f}, "
                  f"truly generated / target = {gen}\n")
    if penalty:
        out.write(f"GiGPO's invalid-action penalty ({penalty['coef']}; not part of the gigpo row): changes "
                  f"{penalty['decisions_changed']} decisions, mean |term| {penalty['mean_abs']:.3g}\n")


# --------------------------------------------------------------------------- the lab audit


def format_lab(res: LabAuditResult) -> str:
    """The lab audit as text: the decisions and tokens, the method tables, the budgets, the coupling figures,
    the per-turn table and the paired comparisons."""
    out = io.StringIO()
    n_big = int(np.sum(np.abs(res.oracle) >= res.config.threshold))
    out.write(f"{res.config.env}: {len(res.oracle)} decisions with exact A* ({n_big} with |A*| >= "
              f"{res.config.threshold}), policy tokens {res.policy_tokens}, mean utility {res.value:.3f}; "
              "95% bootstrap CIs over groups\n")
    write_tables(out, res.rows, res.table2, res.policy_tokens, name_width=12)
    write_budget(out, res.budget, res.gigpo_penalty)
    if res.coupling:
        write_coupling(out, res.coupling, "groups")
    write_breakdowns(out, res.per_turn, res.comparisons, BREAKDOWN_ROWS, ratios=True)
    return out.getvalue()


def write_lab(res: LabAuditResult, out_dir: Path) -> dict:
    """``lab_audit.json``, ``lab_decisions.csv``, ``lab_scatter.png`` and, where the result holds its
    records, ``lab_episodes.jsonl`` (the episodes with each decision's credits and exact ``A*``, and their
    twins: ``twice view`` opens a decision from the scatter); returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = asdict(res.config)
    doc = {"config": cfg, "rows": res.rows, "per_turn": res.per_turn, "comparisons": res.comparisons,
           "policy_tokens": res.policy_tokens, "budget": res.budget,
           "gigpo_penalty": res.gigpo_penalty, "decisions": len(res.oracle), "table2": res.table2,
           "coupling": res.coupling}
    atomic_write_text(out_dir / "lab_audit.json", json.dumps(doc, indent=1, default=float))
    buf = io.StringIO()
    names = list(res.credit)
    buf.write(",".join(["group", "turn", "oracle"] + names) + "\n")
    for k in range(len(res.oracle)):
        buf.write(",".join([str(res.groups[k]), str(res.turns[k]), f"{res.oracle[k]:.6g}"]
                           + [f"{res.credit[n][k]:.6g}" for n in names]) + "\n")
    atomic_write_text(out_dir / "lab_decisions.csv", buf.getvalue())

    png = plot_credit_scatter(res.oracle, {n: res.credit[n] for n in SHOWN_ROWS if n in res.credit},
                              {n: res.pairs_of[n] for n in res.credit}, {r["method"]: r for r in res.rows},
                              out_dir / "lab_scatter.png")
    paths = {"json": out_dir / "lab_audit.json", "csv": out_dir / "lab_decisions.csv", "png": png}
    if res.records:
        eps, tws, index = res.records
        paths["episodes"] = write_lines(out_dir / LAB_EPISODES, decision_lines(eps, tws, index, res.credit, res.oracle))
    return paths


# --------------------------------------------------------------------------- the LLM audit


def format_table(result: AuditResult) -> str:
    """The audit as text: rows with CIs, pairs, per-turn table, comparisons."""
    out = io.StringIO()
    cfg = result.config
    n_big = int(np.sum(np.abs(result.oracle) >= cfg.threshold))
    res = result.oracle_resolution()
    out.write(f"{cfg.env}: {len(result.oracle)} decisions of {result.questions} questions, oracle A* from "
              f"{cfg.oracle_rollouts} rollouts per state ({n_big} with |A*| >= {cfg.threshold}); policy tokens "
              f"{result.policy_tokens}; 95% bootstrap CIs over audited questions\n")
    if len(result.oracle_se) and res["resolves"] is None:
        out.write(f"oracle SE of A*: not estimated (fewer than 2 rollouts per state); threshold |A*| >= "
                  f"{cfg.threshold}\n")
    elif len(result.oracle_se):
        out.write(f"oracle SE of A*: median {res['median_se']:.3f}, 90th percentile {res['p90_se']:.3f}; threshold "
                  f"|A*| >= {cfg.threshold}\n")
        if not res["resolves"]:
            out.write(f"warning: the oracle cannot resolve the |A*| >= {cfg.threshold} threshold at this size: the "
                      f"median standard error of A* ({res['median_se']:.3f}) exceeds it, so which decisions count "
                      f"is largely oracle noise; raise --oracle-rollouts (the SE falls as 1/sqrt(rollouts))\n")
    if n_big == 0:
        out.write("note: no decision changes the expected outcome measurably (the policy's outcomes do not vary on "
                  "these questions), so the credit rates are undefined\n")
    if len(result.oracle) < cfg.decisions:
        out.write(f"note: {len(result.oracle)} decisions, fewer than the {cfg.decisions} asked for: every episode of "
                  f"the sampled groups is audited; audit more questions for more\n")
    write_tables(out, result.rows, result.table2, result.policy_tokens, name_width=17)
    for name, why in result.skipped.items():
        out.write(f"{name}: no row ({why})\n")
    write_budget(out, result.budget, result.gigpo_penalty)
    out.write(f"{'pairs (J=1)':<12} {'rho pooled':>10} {'rho-bar':>8} {'ties':>6} {'reversals':>10} {'Var D':>7}\n")
    for r in result.pair_rows:
        out.write(f"{r['pairs']:<12} {r['rho_pooled']:>10.3f} {r['rho_bar']:>8.3f} {r['tie_share']:>6.2f} "
                  f"{r['reversal_share']:>10.3f} {r['var_d']:>7.3f}\n")
    if result.coupling:
        write_coupling(out, result.coupling, "questions")
    write_breakdowns(out, result.per_turn, result.comparisons, SHOWN_ROWS, ratios=False)
    return out.getvalue()


def write_outputs(result: AuditResult, out_dir: Path) -> dict:
    """``audit.json`` (everything; ``oracle_se`` holds :meth:`AuditResult.oracle_resolution`),
    ``audit.csv`` (one row per method, each figure with ``_lo`` / ``_hi`` columns),
    ``audit_decisions.csv`` (each decision's ``A*``, credits and, last, the ``A*`` standard
    error), ``audit.png`` and, where the result holds its records, ``audit_episodes.jsonl`` (the
    episodes with each audited turn's credits and ``A*``, and their twins: ``twice view`` opens a
    decision from the scatter); returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"config": asdict(result.config), "rows": result.rows, "pairs": result.pair_rows,
           "per_turn": result.per_turn, "comparisons": result.comparisons, "policy_tokens": result.policy_tokens,
           "questions": result.questions, "decisions": len(result.oracle), "budget": result.budget,
           "gigpo_penalty": result.gigpo_penalty, "skipped": result.skipped,
           "oracle_se": result.oracle_resolution(), "table2": result.table2, "coupling": result.coupling}
    paths = {"audit.json": out_dir / "audit.json", "audit_decisions.csv": out_dir / "audit_decisions.csv"}
    atomic_write_text(paths["audit.json"], json.dumps(doc, indent=1, default=float))
    flat = []
    for r in result.rows:
        row = {}
        for k, v in r.items():
            if isinstance(v, dict):
                row.update({k: v["value"], f"{k}_lo": v["lo"], f"{k}_hi": v["hi"]})
            else:
                row[k] = v
        flat.append(row)
    cols = list(dict.fromkeys(k for row in flat for k in row))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols)
    w.writeheader()
    w.writerows(flat)
    paths["audit.csv"] = out_dir / "audit.csv"
    atomic_write_text(paths["audit.csv"], buf.getvalue())
    buf = io.StringIO()
    names = list(result.credit)
    se = len(result.oracle_se) == len(result.oracle) and len(result.oracle) > 0
    buf.write(",".join(["episode", "turn", "oracle"] + names + (["oracle_se"] if se else [])) + "\n")
    for k in range(len(result.oracle)):
        buf.write(",".join([str(result.episodes[k]), str(result.turns[k]), f"{result.oracle[k]:.6g}"]
                           + [f"{result.credit[n][k]:.6g}" for n in names]
                           + ([f"{result.oracle_se[k]:.6g}"] if se else [])) + "\n")
    atomic_write_text(paths["audit_decisions.csv"], buf.getvalue())
    if result.records:
        eps, tws = result.records
        decisions = list(zip(result.episodes.tolist(), result.turns.tolist()))
        paths["audit_episodes.jsonl"] = write_lines(out_dir / AUDIT_EPISODES,
                                                    decision_lines(eps, tws, decisions, result.credit, result.oracle))
    shown = [n for n in SHOWN_ROWS if n in result.credit]
    paths["audit.png"] = plot_credit_scatter(result.oracle, {n: result.credit[n] for n in shown}, result.pairs_of,
                                             {r["method"]: r for r in result.rows}, out_dir / "audit.png")
    return paths
