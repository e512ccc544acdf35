"""The audits' method tables: the published credit table first, then the diagnostic and update-credit rows.

The published table (Table 2 of the method's paper) scores each method's *raw per-decision
credit* at the audited decisions, before any normalisation, in utility units:

* GRPO: ``U - mean_g U``; GRPO (2x): the same over the ``2 G`` episodes of the task;
* GiGPO: ``A^E + omega A^S`` centred on its groups' means (its invalid-action penalty apart);
* VinePPO: ``V(s_{t+1}) - V(s_t)`` from ``K = 2`` rollouts per state;
* CRR: ``U - U'`` of one independent counterfactual;
* Twice: ``U - U'`` of one coupled twin (the alternative turn, then the factual episode's noise).

:func:`gigpo_row` (GiGPO without its invalid-action penalty), :func:`gigpo_raw` and
:func:`enlarged_group_credit` compute the rows both audits add for it.

Tree-GRPO has no row: its credit is each leaf's tree- and task-normalised outcome, one value per
episode broadcast to its turns (:mod:`~twice_envs.agents.credit.tree`), not a credit of the decision;
its update credit is among the supplementary rows.

:data:`PUBLISHED` says which audit row holds each (the first of its candidate rows that the audit
has). Every table gives the wrong-sign rate over ``|A*| >= 0.05`` as published (zero credit is never
wrong), and beside it the zero-credit share and the wrong-sign rate among non-zero credits, each
with its bootstrap CI. After it come the diagnostic rows (more pairs or rollouts per decision,
Twice's training-time ``A_hat``), then, labelled supplementary, the advantage each method's update
consumes (``twice``: ``A_traj + omega A_hat / sigma_hat``; ``crr``, ``vineppo``, ``grpo-2x``, ...),
whose units are mixed.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

import numpy as np

from twice_envs.agents.credit import gigpo
from twice_envs.agents.credit.registry import get_method
from twice_envs.agents.credit.vineppo import K_ROLLOUTS
from twice_envs.agents.types import EpisodeRecord

#: The row of the raw group credit over a group enlarged to ``rollouts x G`` episodes (GRPO (2x)'s).
GROUP_2X = "grpo 2G"
#: GiGPO's credit centred on its groups' means only, where the env's reference setting also divides by the
#: groups' standard deviations (elsewhere the ``gigpo`` row is already that).
GIGPO_RAW = "gigpo raw"


@dataclass(frozen=True)
class PublishedCredit:
    """How the published table scores one method.

    Attributes:
        rows: the audit rows that can hold its raw per-decision credit, in order of preference.
        credit: its definition, as the table's legend gives it.
    """

    rows: tuple
    credit: str


#: Registered method -> its raw per-decision credit, in the published table's order.
PUBLISHED: dict[str, PublishedCredit] = {
    "grpo": PublishedCredit(("grpo",), "U - mean_g U"),
    "grpo-2x": PublishedCredit((GROUP_2X,), "U - mean U over the task's 2G episodes (G more on fresh noise)"),
    "gigpo": PublishedCredit((GIGPO_RAW, "gigpo"), "A^E + omega A^S, centred on its groups' means, no penalty"),
    "vineppo": PublishedCredit((f"vineppo K{K_ROLLOUTS}",), f"V(s_t+1) - V(s_t) from {K_ROLLOUTS} rollouts per state"),
    "crr": PublishedCredit(("crr J1",), "U - U' of one independent counterfactual"),
    "twice": PublishedCredit(("twice J1",), "U - U' of one coupled twin"),
}

#: The tables a row can belong to (``row["table"]``), in the order they are printed.
TABLES = {
    "published": "published credit table (Table 2): each method's raw per-decision credit on the same decisions",
    "diagnostic": "diagnostic: more pairs or rollouts per decision, Twice's training-time A_hat",
    "update": "supplementary: update credit (the advantage each update consumes; units mixed, so read "
              "wrong-sign and Pearson, not MSE)",
}


def enlarged_group_credit(utilities, groups, extra_utilities, extra_groups, episodes) -> np.ndarray:
    """``U_i - mean U`` over episode ``i``'s group together with the further episodes of the same group
    (``extra_*``), for the episode ``i`` of every audited decision (``episodes``)."""
    u, g = np.asarray(utilities, dtype=np.float64), np.asarray(groups)
    xu, xg = np.asarray(extra_utilities, dtype=np.float64), np.asarray(extra_groups)
    mean = {k: float(np.mean(np.concatenate([u[g == k], xu[xg == k]]))) for k in np.unique(g)}
    return np.array([u[i] - mean[g[i]] for i in episodes], dtype=np.float64)


def gigpo_raw(episodes, env_id: str, decisions) -> np.ndarray | None:
    """GiGPO's credit on ``decisions`` centred on its groups' means only (no invalid-action penalty), where the
    env's reference setting (:func:`~twice_envs.agents.credit.gigpo.config_for`) also divides by the groups'
    standard deviations; None where it does not (the ``gigpo`` row is then the raw credit already)."""
    cfg = gigpo.config_for(env_id)
    if cfg.mode == "mean_norm":
        return None
    without, _ = gigpo.split_penalty(episodes, replace(cfg, mode="mean_norm"))
    return np.array([without[i][t] for i, t in decisions], dtype=np.float64)


def gigpo_row(eps: Sequence[EpisodeRecord], env_id: str,
              decisions: Sequence[tuple[int, int]]) -> tuple[np.ndarray, dict]:
    """GiGPO's credit on ``decisions`` with the env's reference settings but without its invalid-action
    penalty (the oracle has none), and what the penalty changes there: ``{coef, decisions_changed,
    mean_abs}`` (shared by the lab and the LLM audit)."""
    gcfg = gigpo.config_for(env_id)
    without, term = gigpo.split_penalty(eps, gcfg)
    pen = np.array([term[i][t] for i, t in decisions], dtype=np.float64)
    penalty = {"coef": gcfg.invalid_penalty, "decisions_changed": int(np.sum(pen != 0)),
               "mean_abs": float(np.mean(np.abs(pen))) if pen.size else 0.0}
    return np.array([without[i][t] for i, t in decisions], dtype=np.float64), penalty


def published_table(names: Iterable[str]) -> list[dict]:
    """One entry per method of :data:`PUBLISHED`: ``{"method", "display", "row", "credit"}`` with ``row`` the
    first of its candidate rows among ``names`` (the audit's rows), or None with ``missing`` naming the row
    it needs."""
    have = set(names)
    out = []
    for method, spec in PUBLISHED.items():
        row = next((r for r in spec.rows if r in have), None)
        entry = {"method": method, "display": get_method(method).display, "row": row, "credit": spec.credit}
        if row is None:
            entry["missing"] = spec.rows[-1]
        out.append(entry)
    return out


def mark_tables(rows: Sequence[dict], diagnostic: Iterable[str]) -> list[dict]:
    """Set each row's ``table`` (a key of :data:`TABLES`), in place: ``published`` for a row the published table
    uses (with ``published_as``: its methods), ``diagnostic`` for the other rows named in ``diagnostic``,
    ``update`` for the rest. Returns :func:`published_table` of the rows."""
    table = published_table(r["method"] for r in rows)
    used = {}
    for e in table:
        if e["row"] is not None:
            used.setdefault(e["row"], []).append(e["method"])
    diagnostic = set(diagnostic)
    for r in rows:
        if r["method"] in used:
            r["table"], r["published_as"] = "published", used[r["method"]]
        else:
            r["table"] = "diagnostic" if r["method"] in diagnostic else "update"
    return table


def format_ci(e: dict, pct: bool = False) -> str:
    """``value [lo, hi]`` of an estimate ``{"value", "lo", "hi"}`` (in % where ``pct``; "n/a" where undefined)."""
    f = 100.0 if pct else 1.0
    if not np.isfinite(e["value"]):
        return "n/a"
    return f"{e['value'] * f:.3g} [{e['lo'] * f:.3g}, {e['hi'] * f:.3g}]"


def write_method_table(out: io.StringIO, rows: Sequence[dict], *, name_width: int) -> None:
    """One line per row: auxiliary tokens, then each figure with its 95% CI."""
    out.write(f"{'method':<{name_width}} {'aux tok':>8} {'wrong-sign %':>20} {'zero %':>20} {'non-zero wrong %':>20} "
              f"{'Pearson':>22} {'MSE/GRPO':>22} {'ceiling':>8} {'rho-bar':>22}\n")
    for r in rows:
        ceil = f"{r['ceiling']['value']:.3f}" if "ceiling" in r else ""
        rb = format_ci(r["rho_bar"]) if "rho_bar" in r else ""
        nz = format_ci(r["wrong_sign_nonzero"], True) if "wrong_sign_nonzero" in r else ""
        out.write(f"{r['method']:<{name_width}} {r['aux_tokens']:>8d} {format_ci(r['wrong_sign'], True):>20} "
                  f"{format_ci(r['zero_credit'], True):>20} {nz:>20} {format_ci(r['pearson']):>22} "
                  f"{format_ci(r['mse_vs_grpo']):>22} {ceil:>8} {rb:>22}\n")


def write_published(out: io.StringIO, rows: Sequence[dict], table: Sequence[dict], policy_tokens: int) -> None:
    """The published table: one line per method with its row's figures (tokens per update relative to GRPO's,
    ``1 + aux / policy tokens``), then the legend of each method's credit."""
    by_name = {r["method"]: r for r in rows}
    out.write(f"{TABLES['published']}:\n")
    out.write(f"{'method':<12} {'row':<11} {'tok/GRPO':>8} {'wrong-sign %':>20} {'zero %':>20} "
              f"{'non-zero wrong %':>20} {'Pearson':>22} {'MSE/GRPO':>22}\n")
    for e in table:
        if e["row"] is None:
            out.write(f"{e['display']:<12} not in this run (needs the row {e['missing']!r})\n")
            continue
        r = by_name[e["row"]]
        tok = 1.0 + r["aux_tokens"] / policy_tokens if policy_tokens > 0 else float("nan")
        out.write(f"{e['display']:<12} {e['row']:<11} {tok:>7.2f}x {format_ci(r['wrong_sign'], True):>20} "
                  f"{format_ci(r['zero_credit'], True):>20} {format_ci(r['wrong_sign_nonzero'], True):>20} "
                  f"{format_ci(r['pearson']):>22} {format_ci(r['mse_vs_grpo']):>22}\n")
    out.write("credit scored:\n" + "".join(f"  {e['display']}: {e['credit']}\n" for e in table))


def write_tables(out: io.StringIO, rows: Sequence[dict], table: Sequence[dict], policy_tokens: int, *,
                 name_width: int) -> None:
    """The published table, then the diagnostic and the update-credit rows, each under its title (rows carry
    ``table`` from :func:`mark_tables`)."""
    write_published(out, rows, table, policy_tokens)
    for key in ("diagnostic", "update"):
        part = [r for r in rows if r.get("table") == key]
        if part:
            out.write(f"{TABLES[key]}:\n")
            write_method_table(out, part, name_width=name_width)
