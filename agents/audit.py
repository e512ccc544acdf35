"""The credit audit: how well does each estimator's credit match the true advantage?

For held-out questions, sample factual episodes (GRPO groups of ``G``; the first
episode of each group is audited, and with ``mixed_only`` only the groups whose
outcomes differ), estimate every audited decision's *oracle*
advantage ``A* = V(s_{t+1}) - V(s_t)`` from many independent rollouts per state
(``V(s_T) = U`` at the end), and compute each estimator's credit for the same
decisions, before any normalisation, in utility units:

* GRPO: ``U - mean_g U`` broadcast to every turn;
* Twice: ``D = U - U'`` of one coupled twin per decision;
* CRR: ``U - U'`` of one independent counterfactual per decision;
* VinePPO: ``V(s_{t+1}) - V(s_t)`` from ``K = 2`` rollouts per state.

Every decision gets a twin here (``q = 1``), so the table compares the twins
themselves; in training the inverse weights make the sampled version unbiased for
the same quantity. Reported per method: wrong-sign rate among decisions with
``|A*| >= 0.05`` (credit strictly of the opposite sign), the share of zero credit
there, MSE relative to GRPO's, Pearson correlation with ``A*`` and auxiliary tokens;
and for twin vs independent pairs: the correlation ``rho`` of ``(U, U')``, the tie
share (``U' = U``) and the reversal share (``D`` of the opposite sign to ``A*``).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from twice_envs.agents.twins import fresh_seed
from twice_envs.trajectory import atomic_write_text

METHODS = ("grpo", "twice", "crr", "vineppo")


@dataclass
class AuditConfig:
    """What the audit samples."""

    env: str = "SearchQA-v0"
    """Env id."""
    env_kwargs: dict = field(default_factory=dict)
    """Env kwargs."""
    split: str = "dev"
    """Held-out split."""
    questions: int = 16
    """Held-out questions (one audited factual episode each; with ``mixed_only``, the candidates)."""
    mixed_only: bool = False
    """Audit only the questions whose group has mixed outcomes (some episodes succeed, some
    fail). Where a weak policy fails every episode of a question, its decisions hardly change
    the expected outcome and every estimator's credit is 0 there, which says nothing about
    the estimators; the rates are then conditional on the question being within reach."""
    group_size: int = 5
    """GRPO group size (the group gives GRPO's baseline)."""
    oracle_rollouts: int = 16
    """Independent rollouts per state for the oracle values."""
    vine_k: int = 2
    """VinePPO rollouts per state."""
    threshold: float = 0.05
    """Decisions with ``|A*|`` at least this count for the wrong-sign rate."""
    max_new_tokens: int = 128
    """Tokens per turn."""
    max_turns: Optional[int] = 4
    """Turn cap."""
    temperature: float = 1.0
    """Sampling temperature."""
    indexed_tasks: bool = True
    """Name tasks by ``{"split", "index"}`` reset options."""
    seed: int = 0
    """Noise seed of the audit."""


@dataclass
class AuditResult:
    """Per-decision values and the summary table."""

    oracle: np.ndarray
    credit: dict[str, np.ndarray]
    aux_tokens: dict[str, int]
    pairs: dict[str, np.ndarray]
    table: list[dict]
    pair_table: list[dict]
    policy_tokens: int = 0
    questions: int = 0
    """Questions audited (fewer than asked for with ``mixed_only``)."""
    group_utilities: list = field(default_factory=list)
    """Utilities of every sampled factual episode, in group order (audited or not)."""


def _value_requests(audited, eps, n_rollouts, salt, noise_seed):
    from twice_envs.agents.rollout import BranchRequest

    return [BranchRequest(i, t, branch=1 + m, coupled=False, noise_seed=fresh_seed(noise_seed + salt, i, t, m))
            for i in audited for t in range(len(eps[i].turns)) for m in range(n_rollouts)]


def _values(eps, audited, recs):
    sums = {(i, t): [] for i in audited for t in range(len(eps[i].turns))}
    for r in recs:
        sums[tuple(r.twin_of)].append(r.utility)
    out = {}
    for i in audited:
        v = [float(np.mean(sums[(i, t)])) for t in range(len(eps[i].turns))] + [eps[i].utility]
        out[i] = np.array(v)
    return out


def run_audit(policy, config: AuditConfig, *, log=lambda msg: None) -> AuditResult:
    """Sample, estimate the oracle, compute every estimator's credit; see the module docstring."""
    from twice_envs.agents.policy import SamplingConfig
    from twice_envs.agents.rollout import BranchRequest, Task, branch_rollouts, rollout

    from twice_envs.agents.train import split_size

    sampling = SamplingConfig(temperature=config.temperature, max_new_tokens=config.max_new_tokens)
    indexed = config.indexed_tasks and split_size(config.env, config.env_kwargs, config.split) is not None
    tasks = [Task(i, {"split": config.split, "index": i} if indexed else {}) for i in range(config.questions)]
    eps = rollout(policy, config.env, tasks, group_size=config.group_size, sampling=sampling,
                  env_kwargs=config.env_kwargs, noise_seed=config.seed, max_turns=config.max_turns)
    utilities = [e.utility for e in eps]
    audited = [g * config.group_size for g in range(config.questions)]
    if config.mixed_only:
        audited = mixed_groups(utilities, config.group_size)
    decisions = [(i, t) for i in audited for t in range(len(eps[i].turns))]
    log(f"audit: {len(audited)} episodes, {len(decisions)} decisions")

    recs = branch_rollouts(policy, eps, _value_requests(audited, eps, config.oracle_rollouts, 1, config.seed), sampling=sampling)
    v_star = _values(eps, audited, recs)
    oracle = np.array([v_star[i][t + 1] - v_star[i][t] for i, t in decisions])
    log(f"audit: oracle from {len(recs)} rollouts")

    util = np.array(utilities)
    groups = np.array([e.group for e in eps])
    credit, aux, pairs = {}, {}, {}
    credit["grpo"] = np.array([util[i] - util[groups == groups[i]].mean() for i, t in decisions])
    aux["grpo"] = 0
    twins = branch_rollouts(policy, eps, [BranchRequest(i, t, 1, True) for i, t in decisions], sampling=sampling)
    indep = branch_rollouts(policy, eps, [BranchRequest(i, t, 1, False, fresh_seed(config.seed + 2, i, t, 1))
                                          for i, t in decisions], sampling=sampling)
    for name, rs in (("twice", twins), ("crr", indep)):
        u2 = np.array([eps[r.twin_of[0]].utility if r.self_twin else r.utility for r in rs])
        u1 = np.array([eps[i].utility for i, _ in decisions])
        credit[name] = u1 - u2
        aux[name] = sum(r.num_generated_tokens for r in rs)
        pairs[name] = np.stack([u1, u2], axis=1)
    vine = branch_rollouts(policy, eps, _value_requests(audited, eps, config.vine_k, 3, config.seed), sampling=sampling)
    v_vine = _values(eps, audited, vine)
    credit["vineppo"] = np.array([v_vine[i][t + 1] - v_vine[i][t] for i, t in decisions])
    aux["vineppo"] = sum(r.num_generated_tokens for r in vine)
    ptoks = sum(eps[i].num_generated_tokens for i in audited)
    table = summarize(oracle, credit, aux, config.threshold)
    pair_table = summarize_pairs(oracle, pairs, config.threshold)
    return AuditResult(oracle, credit, aux, pairs, table, pair_table, ptoks, len(audited), utilities)


def mixed_groups(utilities: Sequence[float], group_size: int) -> list[int]:
    """Index of the first episode of every group (consecutive runs of ``group_size``) whose
    utilities are not all equal."""
    return [g for g in range(0, len(utilities), group_size) if len(set(utilities[g: g + group_size])) > 1]


def _pearson(a, b) -> float:
    if len(a) < 2 or np.std(a) == 0 or np.std(b) == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def summarize(oracle: np.ndarray, credit: dict, aux: dict, threshold: float = 0.05) -> list[dict]:
    """The per-method table (wrong-sign rate, zero share, MSE / GRPO's, Pearson, aux tokens)."""
    big = np.abs(oracle) >= threshold
    mse_grpo = float(np.mean((credit["grpo"] - oracle) ** 2)) if "grpo" in credit and len(oracle) else float("nan")
    rows = []
    for name, c in credit.items():
        mse = float(np.mean((c - oracle) ** 2)) if len(c) else float("nan")
        rows.append({
            "method": name,
            "decisions": int(len(c)),
            "scored": int(big.sum()),
            "wrong_sign": float(np.mean(np.sign(c[big]) == -np.sign(oracle[big]))) if big.any() else float("nan"),
            "zero_credit": float(np.mean(c[big] == 0)) if big.any() else float("nan"),
            "mse": mse,
            "mse_vs_grpo": mse / mse_grpo if mse_grpo > 0 else float("nan"),
            "pearson": _pearson(c, oracle),
            "aux_tokens": int(aux.get(name, 0)),
        })
    return rows


def summarize_pairs(oracle: np.ndarray, pairs: dict, threshold: float = 0.05) -> list[dict]:
    """rho, tie share and reversal share of twin vs independent pairs."""
    big = np.abs(oracle) >= threshold
    rows = []
    for name, p in pairs.items():
        d = p[:, 0] - p[:, 1]
        rows.append({
            "pairs": "twin" if name == "twice" else "independent",
            "rho": _pearson(p[:, 0], p[:, 1]),
            "tie_share": float(np.mean(d == 0)) if len(d) else float("nan"),
            "reversal_share": float(np.mean(np.sign(d[big]) == -np.sign(oracle[big]))) if big.any() else float("nan"),
            "var_d": float(np.var(d)) if len(d) else float("nan"),
        })
    return rows


def format_table(result: AuditResult) -> str:
    out = io.StringIO()
    out.write(f"{'method':<9} {'wrong-sign':>10} {'zero':>6} {'MSE/GRPO':>9} {'Pearson':>8} {'aux tokens':>11}\n")
    for r in result.table:
        out.write(f"{r['method']:<9} {r['wrong_sign']:>10.3f} {r['zero_credit']:>6.2f} {r['mse_vs_grpo']:>9.3f} "
                  f"{r['pearson']:>8.3f} {r['aux_tokens']:>11d}\n")
    out.write(f"({result.table[0]['scored']} of {result.table[0]['decisions']} decisions of {result.questions} questions "
              f"have |A*| >= threshold; "
              f"policy tokens of the audited episodes: {result.policy_tokens})\n")
    if result.table[0]["scored"] == 0:
        out.write("note: no decision changes the expected outcome measurably (the policy's outcomes do not vary on "
                  "these questions), so the credit rates are undefined\n")
    out.write(f"{'pairs':<12} {'rho':>6} {'ties':>6} {'reversals':>10} {'Var D':>7}\n")
    for r in result.pair_table:
        out.write(f"{r['pairs']:<12} {r['rho']:>6.3f} {r['tie_share']:>6.2f} {r['reversal_share']:>10.3f} {r['var_d']:>7.3f}\n")
    return out.getvalue()


def write_outputs(result: AuditResult, out_dir: Path) -> dict:
    """``audit.csv``, ``audit_pairs.csv``, ``audit_decisions.csv`` and ``audit.png``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, rows in (("audit.csv", result.table), ("audit_pairs.csv", result.pair_table)):
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
        atomic_write_text(out_dir / name, buf.getvalue())
        paths[name] = out_dir / name
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["oracle"] + list(result.credit))
    for k in range(len(result.oracle)):
        w.writerow([f"{result.oracle[k]:.6g}"] + [f"{result.credit[m][k]:.6g}" for m in result.credit])
    atomic_write_text(out_dir / "audit_decisions.csv", buf.getvalue())
    paths["audit_decisions.csv"] = out_dir / "audit_decisions.csv"
    paths["audit.png"] = plot_audit(result, out_dir / "audit.png")
    return paths


def plot_audit(result: AuditResult, path: Path) -> Path:
    """Credit vs oracle advantage per method, and the wrong-sign rates."""
    from twice_envs.agents.plots import pyplot

    plt = pyplot()
    names = list(result.credit)
    fig, axes = plt.subplots(1, len(names) + 1, figsize=(3.2 * (len(names) + 1), 3.2))
    lim = max(1e-3, float(np.max(np.abs(result.oracle), initial=0.0)) * 1.1)
    for ax, name in zip(axes, names):
        ax.scatter(result.oracle, result.credit[name], s=10, alpha=0.6)
        ax.axhline(0, color="gray", lw=0.5)
        ax.axvline(0, color="gray", lw=0.5)
        ax.plot([-lim, lim], [-lim, lim], color="k", lw=0.5, ls="--")
        row = next(r for r in result.table if r["method"] == name)
        ax.set_title(f"{name}: r={row['pearson']:.2f}", fontsize=9)
        ax.set_xlabel("oracle A*")
    axes[0].set_ylabel("credit")
    rates = [next(r for r in result.table if r["method"] == n)["wrong_sign"] for n in names]
    axes[-1].bar(names, rates, color="tab:red")
    axes[-1].set_title("wrong-sign rate", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def audit_main(argv: Sequence[str]) -> int:
    """``twice audit --checkpoint C --env ENV``; the lab envs (exact A*, no checkpoint) go to
    :func:`twice_envs.agents.lab.lab_main`."""
    if any(a in ("SearchToy-v0", "CreditToy-v0") for a in argv) and "--checkpoint" not in argv:
        from twice_envs.agents.lab import lab_main

        return lab_main(argv)
    p = argparse.ArgumentParser(prog="twice audit", description="Credit audit against oracle advantages.")
    p.add_argument("--checkpoint", required=True, help="run directory, its checkpoint/, or 'tiny'")
    p.add_argument("--env", default="SearchQA-v0")
    p.add_argument("--questions", type=int, default=AuditConfig.questions)
    p.add_argument("--oracle-rollouts", type=int, default=AuditConfig.oracle_rollouts)
    p.add_argument("--group-size", type=int, default=AuditConfig.group_size)
    p.add_argument("--mixed-only", action="store_true",
                   help="audit only questions whose group has mixed outcomes (--questions candidates are screened)")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output directory (default: RUN/audit or audit/)")
    a = p.parse_args(argv)
    if a.checkpoint in ("tiny", "smollm2-135m"):
        from twice_envs.agents.models import load_policy
        from twice_envs.agents.train import cpu_config

        policy, tcfg = load_policy(a.checkpoint), cpu_config(model=a.checkpoint)
        out = Path(a.out or "audit")
    else:
        from twice_envs.agents.train import load_run_policy

        policy, tcfg = load_run_policy(a.checkpoint)
        run = Path(a.checkpoint)
        out = Path(a.out) if a.out else (run.parent if run.name == "checkpoint" else run) / "audit"
    cfg = AuditConfig(env=a.env, env_kwargs=tcfg.env_kwargs if a.env == tcfg.env else {}, questions=a.questions,
                      oracle_rollouts=a.oracle_rollouts, group_size=a.group_size, mixed_only=a.mixed_only,
                      max_new_tokens=a.max_new_tokens or tcfg.max_new_tokens, max_turns=tcfg.max_turns,
                      indexed_tasks=tcfg.indexed_tasks, seed=a.seed)
    res = run_audit(policy, cfg, log=lambda m: print(m, file=sys.stderr))
    print(format_table(res), end="")
    paths = write_outputs(res, out)
    print("written: " + ", ".join(str(v) for v in paths.values()))
    return 0
