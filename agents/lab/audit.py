"""The credit audit: how well does each estimator's credit match the true advantage?

For held-out questions, sample factual episodes (GRPO groups of ``G``; the first
episode of each group is audited, and with ``mixed_only`` only the groups whose
outcomes differ), estimate every audited decision's *oracle*
advantage ``A* = V(s_{t+1}) - V(s_t)`` from many independent rollouts per state
(``V(s_T) = U`` at the end), and compute each estimator's credit for the same
decisions, before any normalisation, in utility units:

* ``grpo``: ``U - mean_g U`` broadcast to every turn;
* ``gigpo``: GiGPO's ``A^E + omega A^S`` (:mod:`~twice_envs.agents.credit.gigpo`, with the reference
  scripts' normalisation for the env, :func:`~twice_envs.agents.credit.gigpo.config_for`) without its
  invalid-action penalty, which the oracle does not have; what the penalty changes is reported
  apart. No auxiliary rollouts. The step term groups turns with identical observations, so it is
  0 where no two episodes of a group meet the same state;
* ``twice Jx`` (diagnostic): every decision twinned, the mean of ``D = U_j - U'_j``
  over ``J`` independent pairs (pair 0: the factual episode and its coupled twin;
  pair ``j >= 1``: a replica of the factual turn and a twin, both on a fresh seed);
* ``crr Jx`` (diagnostic): the mean of ``U - U'`` over ``J`` independent counterfactuals;
* ``vineppo Kx`` (diagnostic): ``V(s_{t+1}) - V(s_t)`` from ``K`` rollouts per state;
* ``twice-train``: the training-time twin credit ``A_hat`` of
  :func:`~twice_envs.agents.rollout.twins.credit_step` (budget ``beta`` with the square-root
  rule and an untrained predictor, evidence coins, inverse weights), in utility units;

and one row per method holding the advantage its update uses:

* ``twice``: ``A_traj + omega A_hat / sigma_hat`` (``A_traj``: GRPO's normalised return);
* ``crr``: published CRR, ``U - U'`` of the first counterfactual at decisions branched uniformly
  at the budget (fresh coins), ``A_traj`` elsewhere (no new rollouts: a branched decision's
  counterfactual is the one ``crr J1`` ran; its tokens are the budget's accounted ones);
* ``vineppo``: the largest-``K`` VinePPO credit whitened over the audited decisions.

Update rows mix units (``A_traj`` is normalised), so read their wrong-sign rate and Pearson, not
their MSE. Twice's diagnostic rows are compared with the diagnostic baselines at no more
auxiliary tokens (a comparison with a baseline that spends none says so), its update row with
CRR's at the same budget.

The rows print as the published credit table (each method's raw per-decision credit: ``grpo``,
``grpo 2G`` for GRPO (2x), ``gigpo`` or ``gigpo raw``, ``vineppo K2``, ``crr J1``, ``twice J1``), then the
diagnostic rows, then the update credit, labelled supplementary (:mod:`~twice_envs.agents.lab.table2`).
``twice J1``'s coupled twin and ``crr J1``'s independent counterfactual at every decision give the
coupling figures (:mod:`~twice_envs.agents.lab.coupling`): rho-bar, the oracle-free lower bound
``1 - Var(D coupled) / Var(D independent)``, tie and self-twin shares, and what coupling is worth in
the budget of independent counterfactuals. ``decisions`` audits further episodes of each group until
that many decisions are audited.

Every figure has a 95% percentile bootstrap CI that resamples audited questions
(their decisions share outcomes): wrong-sign rate among decisions with
``|A*| >= 0.05`` (credit strictly of the opposite sign), zero-credit share there,
Pearson correlation with ``A*``, MSE relative to GRPO's, the ``J``-pair ceiling
(:func:`~twice_envs.agents.stats.one_pair_ceiling`), per-decision ``rho-bar``
(pairs centred on the oracle values ``V(s_{t+1})`` and ``V(s_t)``) and auxiliary tokens;
then a per-turn breakdown and paired comparisons of Twice against each baseline at no
more auxiliary tokens. The oracle is itself an estimate (``oracle_rollouts`` per
state): its noise adds the same amount to every method's MSE and lowers every Pearson.
Each decision's standard error of ``A*`` is
``sqrt(var_next / n_next + var_state / n_state)`` over the two states' independent
rollout sets (sample variances; ``V(s_T) = U`` is exact); the table's header gives its
median and 90th percentile beside the ``|A*|`` threshold and says so in words when the
median exceeds the threshold (the oracle cannot then tell which decisions pass it).

Every auxiliary rollout reads its own noise: the oracle's and VinePPO's value rollouts
get :func:`~twice_envs.keys.audit_seed` ``(seed, stream, episode, turn, index)`` of their
stream, and Twice's pairs, CRR's counterfactuals and the training-time row derive theirs
from their stream's base seed, so no two streams (and no auxiliary rollout and factual
episode) share a seed. Coupled twins read their factual episode's keys by design: where
the training-time row twins a decision, its twin is pair 0's twin of that decision.
The lab envs (exact ``A*``) go through :mod:`twice_envs.agents.lab.runner`, which computes
the rows with the same functions.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

import twice_envs
from twice_envs.agents import stats as cs
from twice_envs.agents.credit import crr, twice, vineppo
from twice_envs.agents.credit.grpo import episode_advantages
from twice_envs.agents.credit.registry import check_env, get_method
from twice_envs.agents.credit.registry import methods as registered_methods
from twice_envs.agents.credit.twice import TwiceConfig
from twice_envs.agents.lab.coupling import coupling_summary, summarize_pair_set, write_coupling
from twice_envs.agents.lab.plots import plot_credit_scatter
from twice_envs.agents.lab.runner import (
    LAB_ENVS,
    SHOWN_ROWS,
    budget_comparisons,
    budget_figures,
    equal_token_comparisons,
    gigpo_row,
    lab_main,
    per_turn_table,
    row_stats,
    write_breakdowns,
    write_budget,
)
from twice_envs.agents.lab.table2 import (
    GIGPO_RAW,
    GROUP_2X,
    enlarged_group_credit,
    gigpo_raw,
    mark_tables,
    write_tables,
)
from twice_envs.agents.models.load import load_policy, load_run_policy, shipped_model_config
from twice_envs.agents.models.runs import TRUST_HELP, checked_run_config
from twice_envs.agents.models.recipes import MODEL_NAMES
from twice_envs.agents.rollout.episodes import (
    BranchRequest,
    Task,
    branch_rollouts,
    rollout,
)
from twice_envs.agents.rollout.twins import Twins, credit_step, run_twins
from twice_envs.agents.sampling.policy import SamplingConfig
from twice_envs.agents.training.evaluate import indexed_split_size, make_tasks
from twice_envs.agents.training.gold_answer import answer_probs
from twice_envs.agents.records import AUDIT_EPISODES, decision_lines, write_lines
from twice_envs.errors import TwiceError
from twice_envs.keys import audit_seed
from twice_envs.play import parse_env_kwargs
from twice_envs.trajectory import atomic_write_text


class NothingToAudit(TwiceError):
    """The audited episodes hold no decision to audit (with ``mixed_only``: no group with differing returns)."""


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
    oracle_rollouts: int = 64
    """Independent rollouts per state for the oracle values (at least 1; the standard error of
    ``A*`` needs 2 and shrinks as ``1 / sqrt(oracle_rollouts)``)."""
    pairs: tuple = (1,)
    """``J`` values: independent pairs per decision for Twice's diagnostic row and
    counterfactuals per decision for CRR."""
    vine_k: tuple = (2,)
    """``K`` values: VinePPO rollouts per state."""
    training_row: bool = True
    """Also run the training-time Twice credit (``twice-train`` rows)."""
    beta: float = 0.7
    """Auxiliary budget of the training-time row."""
    threshold: float = cs.THRESHOLD
    """Decisions with ``|A*|`` at least this count for the wrong-sign rate."""
    n_boot: int = 1000
    """Bootstrap resamples."""
    max_new_tokens: int = 128
    """Tokens per turn."""
    max_turns: Optional[int] = 4
    """Turn cap."""
    window: Optional[int] = None
    """Turns of history in the model's context (None: the whole episode); a windowed model is
    audited with the window it plays with."""
    temperature: float = 1.0
    """Sampling temperature."""
    indexed_tasks: bool = True
    """Name tasks by ``{"split", "index"}`` reset options."""
    seed: int = 0
    """Noise seed of the audit."""
    decisions: int = 0
    """Audit at least this many decisions where the sampled groups hold them: after the first episode of
    every group, the second of every group, and so on (0: the first episode of each group only)."""


@dataclass
class AuditResult:
    """Per-decision values, the table with CIs, the per-turn table and the comparisons."""

    config: AuditConfig
    oracle: np.ndarray
    """``A*`` per audited decision."""
    episodes: np.ndarray
    """The audited episode of each decision (the bootstrap resamples these)."""
    turns: np.ndarray
    """The turn of each decision."""
    credit: dict
    """Method -> credit per decision (utility units)."""
    aux_tokens: dict
    """Method -> auxiliary tokens generated."""
    pairs_of: dict
    """Method -> ``J`` (0 where no pair ceiling applies)."""
    rows: list
    """One row per method: each figure as ``{"value", "lo", "hi"}``."""
    pair_rows: list
    """Twin vs independent pairs (``J = 1``): pooled and per-decision rho, ties, reversals."""
    per_turn: list
    comparisons: list
    policy_tokens: int = 0
    """Tokens the policy generated in the audited episodes."""
    questions: int = 0
    """Questions audited (fewer than asked for with ``mixed_only``)."""
    group_utilities: list = field(default_factory=list)
    """Utilities of every sampled factual episode, in group order (audited or not)."""
    budget: dict = field(default_factory=dict)
    """Budgeted update rows (``twice``, ``crr``): target, accounted and generated auxiliary tokens
    and their ratios to the target (:func:`~twice_envs.agents.lab.runner.budget_figures`)."""
    gigpo_penalty: dict = field(default_factory=dict)
    """What GiGPO's invalid-action penalty changes (not part of the ``gigpo`` row)."""
    oracle_se: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """The standard error of ``A*`` per audited decision (NaN where a state has fewer than two
    rollouts; empty where the oracle is not estimated from rollouts)."""
    skipped: dict = field(default_factory=dict)
    """Registered methods without a row, and why (:func:`other_update_rows`)."""
    records: tuple = ()
    """``(factual episodes, twins)``: every sampled factual episode and the coupled twin of pair 0 of
    each audited decision (its ``twin_of`` names the episode's index and the turn), for the explorer."""
    coupling: dict = field(default_factory=dict)
    """The coupling figures (:func:`~twice_envs.agents.lab.coupling.coupling_summary`; rho-bar from the
    estimated oracle), where both pair sets were run."""
    table2: list = field(default_factory=list)
    """The published table's methods and their rows (:func:`~twice_envs.agents.lab.table2.mark_tables`)."""

    def row(self, method: str) -> dict:
        return next(r for r in self.rows if r["method"] == method)

    def oracle_resolution(self) -> dict:
        """The median and 90th percentile of :attr:`oracle_se` over the decisions where it is finite
        (NaN where none is), the threshold, and ``resolves``: whether the median is at most the
        threshold (``None`` where no standard error is finite)."""
        se = np.asarray(self.oracle_se, float)
        se = se[np.isfinite(se)]
        median, p90 = (float(np.median(se)), float(np.percentile(se, 90))) if len(se) else (float("nan"),) * 2
        return {"median_se": median, "p90_se": p90, "threshold": float(self.config.threshold),
                "resolves": bool(median <= self.config.threshold) if len(se) else None}


def _value_requests(audited, eps, n_rollouts, stream, noise_seed):
    """``n_rollouts`` independent rollouts from every state of every audited episode, rollout ``m``
    of state ``(i, t)`` on :func:`~twice_envs.keys.audit_seed` ``(noise_seed, stream, i, t, m)``."""
    return [BranchRequest(i, t, branch=1 + m, coupled=False, noise_seed=audit_seed(noise_seed, stream, i, t, m))
            for i in audited for t in range(len(eps[i].turns)) for m in range(n_rollouts)]


def _state_utilities(eps, audited, recs):
    """The utilities of the value rollouts of every state ``(i, t)``, in request order."""
    out = {(i, t): [] for i in audited for t in range(len(eps[i].turns))}
    for r in recs:
        out[tuple(r.twin_of)].append(r.utility)
    return out


def _values(eps, audited, recs, n_rollouts=None):
    """``V(s_0..s_T)`` per audited episode from value rollouts (the first ``n_rollouts`` per state)."""
    sums = _state_utilities(eps, audited, recs)
    out = {}
    for i in audited:
        v = [float(np.mean(sums[(i, t)][:n_rollouts])) for t in range(len(eps[i].turns))] + [eps[i].utility]
        out[i] = np.array(v)
    return out


def _value_variances(eps, audited, recs):
    """The squared standard error of ``V(s_0..s_T)`` per audited episode: the sample variance
    (``ddof = 1``) of each state's rollouts over their number, NaN with fewer than two, and 0 for
    the terminal ``V(s_T) = U``."""
    sums = _state_utilities(eps, audited, recs)
    out = {}
    for i in audited:
        u = [np.asarray(sums[(i, t)], float) for t in range(len(eps[i].turns))]
        out[i] = np.array([float(np.var(x, ddof=1)) / len(x) if len(x) > 1 else float("nan") for x in u] + [0.0])
    return out


def _pair_credit(eps, decisions, twins) -> tuple[list[np.ndarray], list[int], list[np.ndarray]]:
    """Per pair ``j``: ``D_j`` per decision, its auxiliary tokens, and ``(U_j, U'_j)``."""
    row_of = {d: r for r, d in enumerate(decisions)}
    n_pairs = 1 + max([r.pair for r in twins.records] + [0])
    u = [np.full(len(decisions), np.nan) for _ in range(n_pairs)]
    u2 = [np.full(len(decisions), np.nan) for _ in range(n_pairs)]
    tokens = [0] * n_pairs
    for r in twins.records:
        i, t = r.twin_of
        k = row_of[(i, t)]
        uj = eps[i].utility if r.pair_utility is None else r.pair_utility
        u[r.pair][k] = uj
        u2[r.pair][k] = uj if r.self_twin else r.utility
        tokens[r.pair] += r.num_generated_tokens
    for r in twins.replicas:  # counted like the trainer's budget counts them (see run_twins)
        tokens[r.pair] += r.num_generated_tokens
    return [a - b for a, b in zip(u, u2)], tokens, [np.stack([a, b], 1) for a, b in zip(u, u2)]


def _tasks(config: AuditConfig) -> list[Task]:
    """The audit's tasks: ``questions`` tasks of its split (by index where the env names tasks so)."""
    return make_tasks(range(config.questions), config.split, indexed_split_size(config, config.split) is not None)


def run_audit(policy, config: AuditConfig, *, log=lambda msg: None) -> AuditResult:
    """Sample, estimate the oracle, compute every estimator's credit; see the module docstring."""

    if min(config.pairs) < 1 or min(config.vine_k) < 1:
        raise ValueError(f"pairs and vine_k must be >= 1, got {config.pairs} and {config.vine_k}")
    if config.oracle_rollouts < 1:
        raise ValueError(f"oracle_rollouts must be >= 1, got {config.oracle_rollouts}")
    sampling = SamplingConfig(temperature=config.temperature, max_new_tokens=config.max_new_tokens)
    eps = rollout(policy, config.env, _tasks(config), group_size=config.group_size, sampling=sampling,
                  env_kwargs=config.env_kwargs, noise_seed=config.seed, max_turns=config.max_turns,
                  window=config.window)
    utilities = [e.utility for e in eps]
    firsts = [g * config.group_size for g in range(config.questions)]
    if config.mixed_only:
        firsts = mixed_groups(utilities, config.group_size)
    audited = audited_episodes(firsts, [len(e.turns) for e in eps], config.group_size, config.decisions)
    decisions = [(i, t) for i in audited for t in range(len(eps[i].turns))]
    if not decisions:
        raise NothingToAudit(
            f"nothing to audit: none of the {config.questions} questions' groups of {config.group_size} episodes "
            f"ended with differing returns (mixed_only), so no decision has credit to compare; audit more "
            f"questions, or a policy whose outcomes differ")
    log(f"audit: {len(audited)} episodes, {len(decisions)} decisions")

    recs = branch_rollouts(policy, eps, _value_requests(audited, eps, config.oracle_rollouts, "oracle", config.seed),
                           sampling=sampling)
    v_star, se2 = _values(eps, audited, recs), _value_variances(eps, audited, recs)
    v_before = np.array([v_star[i][t] for i, t in decisions])
    v_after = np.array([v_star[i][t + 1] for i, t in decisions])
    oracle = v_after - v_before
    # V(s_t) and V(s_{t+1}) come from independent rollout sets: their variances add
    oracle_se = np.array([np.sqrt(se2[i][t] + se2[i][t + 1]) for i, t in decisions])
    log(f"audit: oracle from {len(recs)} rollouts")

    util = np.array(utilities)
    groups = np.array([e.group for e in eps])
    credit, aux, pairs_of, pair_sets = {}, {}, {}, {}
    credit["grpo"], aux["grpo"], pairs_of["grpo"] = np.array([util[i] - util[groups == groups[i]].mean()
                                                              for i, _ in decisions]), 0, 0
    # GiGPO as the reference scripts train this env, its invalid-action penalty reported apart (the oracle has none)
    credit["gigpo"], penalty = gigpo_row(eps, config.env, decisions)
    aux["gigpo"], pairs_of["gigpo"] = 0, 0
    raw = gigpo_raw(eps, config.env, decisions)
    if raw is not None:  # the published table scores GiGPO before its groups' standard deviations divide it
        credit[GIGPO_RAW], aux[GIGPO_RAW], pairs_of[GIGPO_RAW] = raw, 0, 0
    # GRPO (2x)'s raw credit: each group enlarged by the further episodes its update row samples (the same ones);
    # its tokens are the share of theirs that falls on the audited episodes
    extras = {}
    more = extra_factual(policy, config, sampling, get_method("grpo-2x").rollouts, extras)
    credit[GROUP_2X] = enlarged_group_credit(util, groups, [e.utility for e in more], [e.group for e in more],
                                             [i for i, _ in decisions])
    share = sum(eps[i].num_generated_tokens for i in audited) / max(1, sum(e.num_generated_tokens for e in eps))
    aux[GROUP_2X], pairs_of[GROUP_2X] = int(round(share * sum(e.num_generated_tokens for e in more))), 0
    # GRPO's normalised term, the part of every update's advantage that comes from the group
    a_traj_ep = episode_advantages(utilities, [e.group for e in eps])
    a_traj = np.array([a_traj_ep[i] for i, _ in decisions])
    max_j = max(config.pairs)
    rng = np.random.default_rng(audit_seed(config.seed, "coins"))
    diag = TwiceConfig(q_same=1.0, pairs=max_j)
    indep = crr.crr_config(TwiceConfig(pairs=max_j))
    # coupled twins, then independent counterfactuals: J pairs per decision each, every decision
    pair0 = []
    for name, cfg, stream in (("twice", diag, "twice-pairs"), ("crr", indep, "crr")):
        tw = run_twins(policy, eps, decisions, cfg, sampling, rng, noise_seed=audit_seed(config.seed, stream))
        d, tok, pr = _pair_credit(eps, decisions, tw)
        if name == "twice":
            pair0 = [r for r in tw.records if r.pair == 0]
        pair_sets[name] = pr[0]
        for J in config.pairs:
            credit[f"{name} J{J}"], aux[f"{name} J{J}"], pairs_of[f"{name} J{J}"] = np.mean(d[:J], 0), sum(tok[:J]), J
        log(f"audit: {name} pairs done")
    vine = branch_rollouts(policy, eps, _value_requests(audited, eps, max(config.vine_k), "vineppo", config.seed),
                           sampling=sampling)
    for K in config.vine_k:
        v = _values(eps, audited, vine, K)
        name = f"vineppo K{K}"
        credit[name] = np.array([v[i][t + 1] - v[i][t] for i, t in decisions])
        # the first K rollouts of every state
        aux[name] = sum(r.num_generated_tokens for r in vine if r.branch <= K)
        pairs_of[name] = 0
    ptoks = sum(eps[i].num_generated_tokens for i in audited)
    batch = [eps[i] for i in audited]
    diagnostic = list(credit)  # the rows so far; those added below hold update credit
    # the advantage each update uses, from the rollouts above: VinePPO whitens its credit; CRR replaces
    # GRPO's term by U - U' (its first counterfactual) at decisions branched uniformly at the budget
    k_max = f"vineppo K{max(config.vine_k)}"
    credit["vineppo"] = np.concatenate(vineppo.whiten([credit[k_max]])) if decisions else np.zeros(0)
    aux["vineppo"], pairs_of["vineppo"] = aux[k_max], 0
    budget = {}
    if batch:
        plan = crr.plan_branches(batch, np.random.default_rng(audit_seed(config.seed, "coins", 1)),
                                 TwiceConfig(beta=config.beta))
        branched = np.asarray(plan.branched, dtype=bool)  # plan.index follows `decisions`
        credit["crr"] = np.where(branched, credit["crr J1"], a_traj)
        crr_stats = twice.budget_stats(Twins(aux_tokens=0), plan, crr.crr_config())
        aux["crr"], pairs_of["crr"] = int(crr_stats["aux_accounted"]), 0
        budget["crr"] = {**crr_stats, "aux_generated": float("nan")}
    if config.training_row and batch:
        # the audited episodes as one batch (their groups are elsewhere, so A_traj is GRPO's over all episodes)
        tcfg = TwiceConfig(beta=config.beta, warmup_updates=0, trajectory_term=False, omega=1.0)
        res = credit_step("twice", policy, batch, config=tcfg, sampling=sampling, rng=rng, update=0,
                          noise_seed=audit_seed(config.seed, "twice-train"))
        scale = res.stats["sigma_hat"]
        a_hat = np.concatenate(res.advantages) * scale  # utility units: trajectory_term is off
        credit["twice-train"], aux["twice-train"], pairs_of["twice-train"] = a_hat, res.aux_tokens, 0
        credit["twice"] = a_traj + TwiceConfig().omega * a_hat / scale  # A_traj + omega A_hat / sigma_hat
        aux["twice"], pairs_of["twice"] = res.aux_tokens, 0
        budget["twice"] = {**res.stats, "aux_generated": res.aux_tokens}
    skipped = other_update_rows(policy, config, eps, decisions, sampling, credit, aux, pairs_of, budget, extras, log)
    log("audit: credit computed; bootstrapping")
    row_of = {d: k for k, d in enumerate(decisions)}
    self_twin = np.zeros(len(decisions), dtype=bool)
    for r in pair0:
        self_twin[row_of[tuple(r.twin_of)]] = r.self_twin
    result = summarize_audit(config, oracle, np.array([i for i, _ in decisions]), np.array([t for _, t in decisions]),
                           credit, aux, pairs_of, pair_sets, v_before, v_after, ptoks,
                           len({eps[i].group for i in audited}), utilities, budget, oracle_se, penalty, diagnostic,
                           self_twin=self_twin, groups=np.array([eps[i].group for i, _ in decisions]))
    result.skipped = skipped
    result.records = (list(eps), pair0)
    return result


def extra_factual(policy, config: AuditConfig, sampling, rollouts: int, cache: dict) -> list:
    """The further factual episodes of a method sampling ``rollouts`` x the group size: ``(rollouts - 1) G``
    more per question on fresh noise (:func:`~twice_envs.keys.audit_seed` ``(seed, "extra-factual",
    index=rollouts)``), sampled once per multiple and kept in ``cache``."""
    if rollouts not in cache:
        cache[rollouts] = rollout(policy, config.env, _tasks(config), group_size=config.group_size * (rollouts - 1),
                                  sampling=sampling, env_kwargs=config.env_kwargs, max_turns=config.max_turns,
                                  window=config.window,
                                  noise_seed=audit_seed(config.seed, "extra-factual", index=rollouts))
    return cache[rollouts]


def other_update_rows(policy, config: AuditConfig, eps, decisions, sampling, credit, aux, pairs_of, budget,
                      extras=None, log=lambda msg: None) -> dict:
    """Add a row, in place, for every registered method without one: the advantage its registered step gives
    the audited decisions when it runs on the whole factual batch (every group, so group terms are the
    groups'; a method sampling ``rollouts > 1`` times the group size gets the further episodes on fresh
    noise, :func:`extra_factual`, shared through ``extras``, and their tokens count as its auxiliary ones).
    Twin terms are planned at the budget from the first update (no warm-up). Returns ``{method: why}`` for
    the methods left out: those needing a critic trained over updates, and those the env cannot serve
    (:func:`~twice_envs.agents.credit.registry.check_env`)."""
    skipped, extras = {}, ({} if extras is None else extras)
    for k, name in enumerate(registered_methods()):
        if name in credit:
            continue
        method = get_method(name)
        if "critic" in method.needs:
            skipped[name] = "needs a critic trained over many updates (the lab audit warms one up first)"
            continue
        try:
            check_env(name, config.env)
        except ValueError as exc:
            skipped[name] = str(exc)
            continue
        extra = extra_factual(policy, config, sampling, method.rollouts, extras) if method.rollouts > 1 else []
        seed = audit_seed(config.seed, "update-rows", index=k)
        res = credit_step(name, policy, list(eps) + list(extra), config=TwiceConfig(beta=config.beta, warmup_updates=0),
                          sampling=sampling, rng=np.random.default_rng(seed), update=0, noise_seed=seed,
                          answer_probs_fn=answer_probs)
        credit[name] = np.array([res.advantages[i][t] for i, t in decisions], dtype=np.float64)
        aux[name] = int(res.aux_tokens) + sum(e.num_generated_tokens for e in extra)
        pairs_of[name] = 0
        if "aux_accounted" in res.stats:
            budget[name] = {"aux_generated": res.aux_tokens, **res.stats}  # a grown batch: twins only
        log(f"audit: {name} update row done")
    return skipped


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


def mixed_groups(utilities: Sequence[float], group_size: int) -> list[int]:
    """Index of the first episode of every group (consecutive runs of ``group_size``) whose
    utilities are not all equal."""
    return [g for g in range(0, len(utilities), group_size) if len(set(utilities[g: g + group_size])) > 1]


def audited_episodes(firsts: Sequence[int], turns: Sequence[int], group_size: int, decisions: int = 0) -> list[int]:
    """The audited episodes, in episode order: the first episode of each group (``firsts``), then, while they
    hold fewer than ``decisions`` decisions (``turns``: each episode's), the second episode of every group in
    turn, then the third, and so on, stopping as soon as the target is met (or every episode is taken)."""
    out, n = list(firsts), sum(turns[i] for i in firsts)
    for k in range(1, group_size):
        for first in firsts:
            if n >= decisions:
                return sorted(out)
            out.append(first + k)
            n += turns[first + k]
    return sorted(out)


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


def audit_main(argv: Sequence[str]) -> int:
    """``twice audit --checkpoint C --env ENV``; the lab envs (exact A*, no checkpoint) go to
    :func:`twice_envs.agents.lab.runner.lab_main`."""
    if any(a in LAB_ENVS for a in argv) and "--checkpoint" not in argv:
        return lab_main(argv)
    p = argparse.ArgumentParser(prog="twice audit", description="Credit audit against oracle advantages.")
    p.add_argument("--checkpoint", required=True,
                   help="run directory, its checkpoint/, or a shipped model (" + ", ".join(MODEL_NAMES) + ")")
    p.add_argument("--env", default="SearchQA-v0")
    p.add_argument("--env-kwargs", default="{}",
                   help="JSON kwargs for the env, over those the model was trained with (e.g. {\"reward\": \"success\"})")
    p.add_argument("--questions", type=int, default=AuditConfig.questions)
    p.add_argument("--split", default=AuditConfig.split,
                   help="the split the questions come from, where the env names them by split (default %(default)s)")
    p.add_argument("--decisions", type=int, default=AuditConfig.decisions,
                   help="audit at least this many decisions where the groups hold them: further episodes of each "
                        "group are audited after the first (default: the first episode of each group only)")
    p.add_argument("--oracle-rollouts", type=int, default=AuditConfig.oracle_rollouts,
                   help="independent rollouts per state for the oracle A* (default %(default)s; the table's header "
                        "gives the standard error of A* this leaves)")
    p.add_argument("--group-size", type=int, default=AuditConfig.group_size)
    p.add_argument("--mixed-only", action="store_true",
                   help="audit only questions whose group has mixed outcomes (--questions candidates are screened)")
    p.add_argument("--pairs", type=int, nargs="+", default=list(AuditConfig.pairs),
                   help="J values: independent pairs (Twice) and counterfactuals (CRR) per decision")
    p.add_argument("--vine-k", type=int, nargs="+", default=list(AuditConfig.vine_k), help="VinePPO K values")
    p.add_argument("--beta", type=float, default=AuditConfig.beta, help="budget of the training-time Twice row")
    p.add_argument("--no-training-row", action="store_true", help="skip the training-time Twice rows")
    p.add_argument("--n-boot", type=int, default=AuditConfig.n_boot, help="bootstrap resamples")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output directory (default: RUN/audit or audit/)")
    p.add_argument("--trust-kwargs", action="store_true", help=TRUST_HELP)
    a = p.parse_args(argv)
    if min(a.pairs) < 1 or min(a.vine_k) < 1:
        p.error("--pairs and --vine-k must be >= 1")
    if a.oracle_rollouts < 1:
        p.error("--oracle-rollouts must be >= 1")
    if a.questions < 1 or a.group_size < 1 or a.decisions < 0:
        p.error("--questions and --group-size must be >= 1 and --decisions >= 0")
    extra_kwargs = parse_env_kwargs(p, a.env_kwargs)
    if a.checkpoint in MODEL_NAMES:  # played as `twice train` plays it on this env
        tcfg = shipped_model_config(a.checkpoint, a.env)
        policy = load_policy(a.checkpoint)
        out = Path(a.out or "audit")
    else:  # the run's config.json passes the trust rule before the model loads
        checked_run_config(a.checkpoint, env=a.env, trusted=a.trust_kwargs, exempt=extra_kwargs,
                           kwargs_follow_env=False)
        policy, tcfg = load_run_policy(a.checkpoint)
        run = Path(a.checkpoint)
        out = Path(a.out) if a.out else (run.parent if run.name == "checkpoint" else run) / "audit"
    same_env = a.env == tcfg.env
    cfg = AuditConfig(env=a.env, env_kwargs={**(tcfg.env_kwargs if same_env else {}), **extra_kwargs},
                      questions=a.questions, window=tcfg.window if same_env else None,
                      oracle_rollouts=a.oracle_rollouts, group_size=a.group_size, mixed_only=a.mixed_only,
                      max_new_tokens=a.max_new_tokens or tcfg.max_new_tokens, max_turns=tcfg.max_turns,
                      indexed_tasks=tcfg.indexed_tasks, seed=a.seed, pairs=tuple(sorted(set(a.pairs))),
                      vine_k=tuple(sorted(set(a.vine_k))), beta=a.beta, training_row=not a.no_training_row,
                      n_boot=a.n_boot, split=a.split, decisions=a.decisions)
    # where questions are named by split and index (or a split is asked for), the env's own check of the split
    # and of the last question's index
    if cfg.indexed_tasks and (indexed_split_size(cfg, cfg.split) is not None or cfg.split != AuditConfig.split):
        try:
            twice_envs.make(cfg.env, **cfg.env_kwargs).reset(
                seed=0, options=make_tasks([cfg.questions - 1], cfg.split, True)[0].options)
        except ValueError as exc:
            p.error(f"--split {cfg.split!r} / --questions {cfg.questions}: {exc}")
    res = run_audit(policy, cfg, log=lambda m: print(m, file=sys.stderr))
    print(format_table(res), end="")
    paths = write_outputs(res, out)
    print("written: " + ", ".join(str(v) for v in paths.values()))
    return 0
