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
  :func:`~twice_envs.agents.credit.twice.twice_step` (budget ``beta`` with the square-root
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
The lab envs (exact ``A*``) go through :mod:`twice_envs.agents.lab.lab_audit`, which computes
the rows with the same functions. What the audit samples and returns is
:mod:`~twice_envs.agents.lab.audit_config`'s, the oracle :mod:`~twice_envs.agents.lab.oracle`'s, the rows
:mod:`~twice_envs.agents.lab.scoring`'s and the report :mod:`~twice_envs.agents.lab.report`'s.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from twice_envs.agents.credit import crr, twice, vineppo
from twice_envs.agents.credit.grpo import episode_advantages
from twice_envs.agents.credit.registry import CreditContext, check_env, get_method, run_credit
from twice_envs.agents.credit.registry import methods as registered_methods
from twice_envs.agents.credit.twice import TwiceConfig
from twice_envs.agents.lab.audit_config import AuditConfig, AuditResult, NothingToAudit
from twice_envs.agents.lab.oracle import value_requests, value_variances, values
from twice_envs.agents.lab.report import format_table, write_outputs
from twice_envs.agents.lab.scoring import summarize_audit
from twice_envs.agents.lab.table2 import GIGPO_RAW, GROUP_2X, enlarged_group_credit, gigpo_raw, gigpo_row
from twice_envs.agents.rollout.episodes import Task, branch_rollouts, rollout
from twice_envs.agents.rollout.twins import Twins, llm_runners, run_twins
from twice_envs.agents.sampling.policy import SamplingConfig
from twice_envs.agents.training.evaluate import indexed_split_size, make_tasks
from twice_envs.agents.training.gold_answer import answer_probs
from twice_envs.keys import audit_seed
from twice_envs.progress import Progress

#: The audit's own names and its report's, importable from here.
__all__ = ["AuditConfig", "AuditResult", "NothingToAudit", "audited_episodes", "extra_factual", "format_table",
           "mixed_groups", "other_update_rows", "run_audit", "write_outputs"]


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
    """Sample, estimate the oracle, compute every estimator's credit; see the module docstring.

    ``log``: called with a line at each stage. Progress (the audit's stages done out of the total: the factual
    episodes, the oracle, the two pair sets, VinePPO and the update rows, each registered method, the
    bootstrap; and the time left) shows on a terminal unless :mod:`twice_envs.progress` is off."""
    if min(config.pairs) < 1 or min(config.vine_k) < 1:
        raise ValueError(f"pairs and vine_k must be >= 1, got {config.pairs} and {config.vine_k}")
    if config.oracle_rollouts < 1:
        raise ValueError(f"oracle_rollouts must be >= 1, got {config.oracle_rollouts}")
    with Progress(f"audit {config.env}", 6 + len(registered_methods()), unit="stages") as bar:
        return _run_audit(policy, config, log, bar)


def _run_audit(policy, config: AuditConfig, log, bar: Progress) -> AuditResult:
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
    bar.update()

    recs = branch_rollouts(policy, eps, value_requests(audited, eps, config.oracle_rollouts, "oracle", config.seed),
                           sampling=sampling)
    v_star, se2 = values(eps, audited, recs), value_variances(eps, audited, recs)
    v_before = np.array([v_star[i][t] for i, t in decisions])
    v_after = np.array([v_star[i][t + 1] for i, t in decisions])
    oracle = v_after - v_before
    # V(s_t) and V(s_{t+1}) come from independent rollout sets: their variances add
    oracle_se = np.array([np.sqrt(se2[i][t] + se2[i][t + 1]) for i, t in decisions])
    log(f"audit: oracle from {len(recs)} rollouts")
    bar.update()

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
        bar.update()
    vine = branch_rollouts(policy, eps, value_requests(audited, eps, max(config.vine_k), "vineppo", config.seed),
                           sampling=sampling)
    for K in config.vine_k:
        v = values(eps, audited, vine, K)
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
        res = run_credit(get_method("twice"), batch, CreditContext(
            policy=policy, sampling=sampling, rng=rng, update=0, noise_seed=audit_seed(config.seed, "twice-train"),
            config=tcfg, runners=llm_runners()))
        scale = res.stats["sigma_hat"]
        a_hat = np.concatenate(res.advantages) * scale  # utility units: trajectory_term is off
        credit["twice-train"], aux["twice-train"], pairs_of["twice-train"] = a_hat, res.aux_tokens, 0
        credit["twice"] = a_traj + TwiceConfig().omega * a_hat / scale  # A_traj + omega A_hat / sigma_hat
        aux["twice"], pairs_of["twice"] = res.aux_tokens, 0
        budget["twice"] = {**res.stats, "aux_generated": res.aux_tokens}
    bar.update()
    skipped = other_update_rows(policy, config, eps, decisions, sampling, credit, aux, pairs_of, budget, extras, log,
                                bar=bar)
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
    bar.update()
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
                      extras=None, log=lambda msg: None, *, bar: Progress | None = None) -> dict:
    """Add a row, in place, for every registered method without one: the advantage its registered step gives
    the audited decisions when it runs on the whole factual batch (every group, so group terms are the
    groups'; a method sampling ``rollouts > 1`` times the group size gets the further episodes on fresh
    noise, :func:`extra_factual`, shared through ``extras``, and their tokens count as its auxiliary ones).
    Twin terms are planned at the budget from the first update (no warm-up). Returns ``{method: why}`` for
    the methods left out: those needing a critic trained over updates, and those the env cannot serve
    (:func:`~twice_envs.agents.credit.registry.check_env`). ``bar``: counts one step per registered method."""
    skipped, extras = {}, ({} if extras is None else extras)
    for k, name in enumerate(registered_methods()):
        if bar is not None:
            bar.update()
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
        res = run_credit(method, list(eps) + list(extra), CreditContext(
            policy=policy, sampling=sampling, rng=np.random.default_rng(seed), update=0, noise_seed=seed,
            config=method.settings(beta=config.beta, warmup_updates=0), runners=llm_runners(answer_probs)))
        credit[name] = np.array([res.advantages[i][t] for i, t in decisions], dtype=np.float64)
        aux[name] = int(res.aux_tokens) + sum(e.num_generated_tokens for e in extra)
        pairs_of[name] = 0
        if "aux_accounted" in res.stats:
            budget[name] = {"aux_generated": res.aux_tokens, **res.stats}  # a grown batch: twins only
        log(f"audit: {name} update row done")
    return skipped


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
