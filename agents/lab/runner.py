"""The credit lab: every estimator scored against exact advantages, with bootstrap CIs.

A lab policy (:mod:`.toy`, :mod:`.search_toy`) samples factual episodes through keyed
noise; every decision's true advantage ``A*`` is exact. For the same decisions:

* ``grpo``: ``U - mean_g U`` (the group baseline, utility units);
* ``gigpo``: GiGPO's ``A^E + omega A^S`` (:mod:`~twice_envs.agents.credit.gigpo`, the env's reference
  settings, ``gamma = 0.95``, ``omega = 1``) without its invalid-action penalty (the oracle has
  none; what the penalty changes is reported apart); no auxiliary rollouts. The step term
  groups turns with identical observations, so it is 0 where no two episodes of a group
  meet the same state; its scale is up to twice GRPO's, which its MSE ratio includes;
* ``twice Jx``: diagnostic twin credit, every decision twinned, the mean of ``J``
  independent pairs (pair 0: the factual episode and its coupled twin; pair ``j >= 1``:
  a replica of the factual turn and a coupled twin, both on a fresh downstream seed);
* ``crr Jx``: the mean of ``J`` independent counterfactuals per decision;
* ``vineppo Kx``: ``V(s_{t+1}) - V(s_t)`` from ``K`` rollouts per state;
* ``twice-train``: Twice's training-time credit ``A_hat`` (branch budget ``beta``, evidence
  coins, inverse weights) after a predictor warm-up on other batches, in utility units;

then, in a row named by the method, the advantage each registered method's update uses, through
the lab's runners: ``twice`` is ``A_traj + omega A_hat / sigma_hat``
of the same training-time step; the others run their registered step at update 0 (no warm-up
to wait for): published ``crr`` (``U - U'`` replaces ``A_traj`` at uniformly branched decisions),
the ``crr-added`` ablation, whitened ``vineppo``, and ``grpo-2x`` (GRPO's normalised advantage of
each audited episode with its group enlarged to ``2 G`` by ``G`` further episodes on fresh noise;
its auxiliary tokens are those extra factual tokens, see :func:`update_credit`). They mix units,
so read their wrong-sign rate and Pearson, not their MSE.

Each figure comes with a 95% percentile bootstrap CI that resamples GRPO groups
(an episode's decisions and its group share outcomes): wrong-sign over ``|A*| >= 0.05`` as
published (zero credit is never wrong) and among non-zero credits, the zero-credit share,
Pearson, MSE / GRPO's, the ``J``-pair ceiling, per-decision ``rho`` and auxiliary tokens; then
the budgeted rows' accounted and generated tokens against the budget, a per-turn breakdown,
paired comparisons of Twice's diagnostic rows with each diagnostic baseline at no more
auxiliary tokens (a baseline spending none is labelled so), and of Twice's update row with
the other methods at the same budget.

The rows print as the published credit table (each method's raw per-decision credit; ``grpo 2G``
is GRPO (2x)'s, over the group enlarged by the further episodes its update row reads), then the
diagnostic rows, then the update credit, labelled supplementary (:mod:`.table2`); and the coupling
figures of ``twice J1``'s coupled twin against ``crr J1``'s independent counterfactual at every
decision, rho-bar exact (:mod:`.coupling`).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from twice_envs import NoiseSchedule
from twice_envs.agents import stats as cs
from twice_envs.agents.credit import gigpo, twice, vineppo
from twice_envs.agents.credit.grpo import episode_advantages
from twice_envs.agents.credit.predictor import decision_index
from twice_envs.agents.credit.registry import check_env, get_method
from twice_envs.agents.credit.registry import methods as registered_methods
from twice_envs.agents.lab import toy
from twice_envs.agents.lab.choice_lab import (
    ChoiceLabSetting,
    add_choice_args,
    choice_lab_policy,
    choice_setting_from_args,
)
from twice_envs.agents.lab.coupling import coupling_summary, write_coupling
from twice_envs.agents.lab.critic import LabCritic
from twice_envs.agents.lab.plots import plot_credit_scatter
from twice_envs.agents.lab.search_toy import SearchToySetting, search_toy_policy
from twice_envs.agents.lab.table2 import GROUP_2X, enlarged_group_credit, format_ci, mark_tables, write_tables
from twice_envs.agents.lab.text_lab import TextLabSetting, text_lab_policy
from twice_envs.agents.rollout.twins import Twins, credit_step
from twice_envs.agents.types import EpisodeRecord
from twice_envs.agents.records import LAB_EPISODES, decision_lines, write_lines
from twice_envs.keys import lab_pair_seed
from twice_envs.noise import KEY_MODES
from twice_envs.trajectory import atomic_write_text
from twice_envs.wrappers.twin import twin

#: Each lab env's initial policy from the settings :func:`lab_policy` is given (a lab env joins with one entry).
LAB_POLICIES: dict[str, Callable] = {
    "SearchToy-v0": lambda setting, text_setting, choice_setting: search_toy_policy(setting),
    "CreditToy-v0": lambda setting, text_setting, choice_setting: toy.toy_policy(),
    "TextLab-v0": lambda setting, text_setting, choice_setting: text_lab_policy(text_setting or TextLabSetting()),
    "ChoiceLab-v0": lambda setting, text_setting, choice_setting: choice_lab_policy(choice_setting
                                                                                    or ChoiceLabSetting()),
}
LAB_ENVS = tuple(LAB_POLICIES)


def lab_policy(env: str = "SearchToy-v0", setting: SearchToySetting = SearchToySetting(),
               text_setting: TextLabSetting | None = None, choice_setting: ChoiceLabSetting | None = None):
    """The lab's initial policy for ``env`` (``setting``: SearchToy's; ``text_setting``: TextLab's,
    default :class:`~twice_envs.agents.lab.text_lab.TextLabSetting`; ``choice_setting``: ChoiceLab's,
    default :class:`~twice_envs.agents.lab.choice_lab.ChoiceLabSetting`)."""
    if env not in LAB_POLICIES:
        raise ValueError(f"lab env must be one of {LAB_ENVS}, got {env!r}")
    return LAB_POLICIES[env](setting, text_setting, choice_setting)


# --------------------------------------------------------------------------- running credit on lab policies


def lab_runners(envs: Sequence):
    """``(twins_fn, values_fn)`` for :func:`~twice_envs.agents.rollout.twins.credit_step` on a lab
    policy whose factual episodes live in ``envs`` (one pair, no star, per decision)."""

    def twins_fn(policy, factual, decisions, config, sampling, rng, *, noise_seed=0) -> Twins:
        if config.pairs != 1:
            raise ValueError("lab twins run one pair per decision (J = 1); K alternatives may share it")
        coins = None
        if config.skip_same_evidence or config.q_same < 1.0:
            coins = lambda flags: twice.evidence_coins(flags, config, rng)  # noqa: E731
        recs, kept = [], []
        for k in range(1, config.star + 1):  # the star: K alternatives on branches 1..K, one downstream noise
            r, c = toy.lab_twins(policy, factual, envs, decisions, coupled=config.coupled, branch=k,
                                 fresh_salt=k + noise_seed % 1_000_000 * config.star,
                                 evidence_coins=coins, self_twins=config.self_twin_shortcut)
            recs += r
            kept += c
        return Twins(recs, kept, sum(r.num_generated_tokens for r in recs))

    def values_fn(policy, factual, sampling, *, k=vineppo.K_ROLLOUTS, noise_seed=0, states=None) -> Twins:
        states = vineppo.value_states(factual) if states is None else list(states)
        recs = []
        for j in range(1, k + 1 if states else 1):
            recs += toy.toy_twins(policy, factual, envs, states, coupled=False, branch=j,
                                  fresh_salt=2_000_000 + 97 * (noise_seed % 1_000_000) + j)
        return Twins(recs, [True] * len(recs), sum(r.num_generated_tokens for r in recs))

    return twins_fn, values_fn


def lab_step_fns(envs: list) -> dict:
    """Every function :func:`~twice_envs.agents.rollout.twins.credit_step` takes from a lab
    policy whose factual episodes live in ``envs``: its twins and value rollouts (:func:`lab_runners`),
    further factual episodes (:func:`~twice_envs.agents.lab.toy.lab_branches`, whose envs join ``envs``,
    so the twins of a grown episode fork its own env), the policy's exact probabilities of the gold
    answer (:func:`~twice_envs.agents.lab.toy.answer_probs`) and its exact advantages
    (:func:`~twice_envs.agents.lab.toy.exact_advantages`), as ``credit_step``'s keyword arguments
    (the context hands each to the steps that ask for it)."""
    twins_fn, values_fn = lab_runners(envs)

    def branches_fn(policy, factual, nodes, sampling, *, noise_seed=0):
        return toy.lab_branches(policy, factual, envs, nodes, noise_seed=noise_seed)

    return {"twins_fn": twins_fn, "values_fn": values_fn, "branches_fn": branches_fn,
            "answer_probs_fn": toy.answer_probs, "exact_advantages_fn": toy.exact_advantages}


def lab_critic(method: str, policy):
    """A fresh tabular critic (:class:`~twice_envs.agents.lab.critic.LabCritic`, values 0) over ``policy``'s
    states when ``method``'s registered needs include ``critic``, else None."""
    return LabCritic(policy) if "critic" in get_method(method).needs else None


def replica_pairs(policy, episodes: Sequence[EpisodeRecord], envs: Sequence, decisions: Sequence[tuple[int, int]],
                  pair: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Pair ``pair >= 1`` of every decision: ``(U_j, U'_j, aux tokens)``.

    The replica takes the factual turn and the twin a fresh alternative (branch 1); both
    then read the same fresh downstream seed, so they are coupled to each other and
    independent of the factual episode.
    """
    u, u2, tokens = [], [], 0
    reps, rep_recs, tws, tw_recs, alt_keys, alt_states, forks = [], [], [], [], [], [], []
    for i, t in decisions:
        ep = episodes[i]
        sched = NoiseSchedule(lab_pair_seed(ep.options["noise_seed"], pair, t))
        forks.append((envs[i].fork(t), envs[i].fork(t), sched))
        alt_keys.append(sched.with_branch(t, 1).key(t))
        alt_states.append(policy.state(forks[-1][1]))
    alts = toy.sample_turns(policy, alt_states, alt_keys)
    self_rows = []
    for row, ((i, t), (f_rep, f_tw, sched), alt) in enumerate(zip(decisions, forks, alts)):
        ep = episodes[i]
        rep = twin(f_rep, ep.turns[t].text, sched, branch=2)  # forced turn: its branch only labels it
        reps.append(rep)
        rep_recs.append(EpisodeRecord(ep.env_id, ep.seed, dict(ep.options), group=ep.group))
        if alt.text == ep.turns[t].text:
            self_rows.append(row)  # the twin is the replica
            tws.append(None)
            tw_recs.append(None)
            continue
        tws.append(twin(f_tw, alt.text, sched, branch=1))
        tw_recs.append(EpisodeRecord(ep.env_id, ep.seed, dict(ep.options), group=ep.group))
    live = [(e, r) for e, r in zip(reps, rep_recs)] + [(e, r) for e, r in zip(tws, tw_recs) if e is not None]
    toy._run(policy, [e for e, _ in live], [r for _, r in live])
    for (i, t), alt, rep, rr, tw, tr in zip(decisions, alts, reps, rep_recs, tws, tw_recs):
        # the replica's turn t counts as its own turn's tokens, the twin's as its alternative's; the rest is auxiliary
        tokens += rr.num_generated_tokens + len(episodes[i].turns[t].token_ids)
        u.append(rr.utility)
        if tw is None:
            u2.append(rr.utility)
        else:
            tokens += tr.num_generated_tokens + len(alt.token_ids)
            u2.append(tr.utility)
    return np.array(u), np.array(u2), tokens


# --------------------------------------------------------------------------- the audit


@dataclass
class LabAuditConfig:
    """What the lab audit samples (defaults: the reported setting, about a minute on two cores)."""

    env: str = "SearchToy-v0"
    """Lab env (one of :data:`LAB_ENVS`)."""
    setting: SearchToySetting = field(default_factory=SearchToySetting)
    """SearchToy's world and initial policy (ignored for CreditToy and TextLab)."""
    text_setting: TextLabSetting = field(default_factory=TextLabSetting)
    """TextLab's world, initial policy and key layout (TextLab-v0 only)."""
    choice_setting: ChoiceLabSetting = field(default_factory=ChoiceLabSetting)
    """ChoiceLab's world and policy (ChoiceLab-v0 only)."""
    groups: int = 240
    """GRPO groups of factual episodes (every decision of every episode is audited)."""
    group_size: int = 5
    """Episodes per group."""
    pairs: tuple = (1, 2, 4)
    """``J`` values for Twice's diagnostic credit and CRR."""
    vine_k: tuple = (1, 2)
    """``K`` values for VinePPO."""
    beta: float = 0.7
    """Budget of the training-time Twice row."""
    warmup_batches: int = 4
    """Factual batches that fit the discordance predictor before the training-time row."""
    threshold: float = cs.THRESHOLD
    """``|A*|`` at least this counts for the wrong-sign rate."""
    n_boot: int = 1000
    """Bootstrap resamples."""
    seed: int = 0
    """Noise seed."""


@dataclass
class LabAuditResult:
    """Per-decision values, the table with CIs, and the comparisons."""

    config: LabAuditConfig
    oracle: np.ndarray
    groups: np.ndarray
    turns: np.ndarray
    credit: dict
    aux_tokens: dict
    pairs_of: dict
    rows: list
    per_turn: list
    comparisons: list
    policy_tokens: int
    budget: dict
    value: float
    gigpo_penalty: dict
    records: tuple = ()
    """``(factual episodes, twins, decisions)``: the audited episodes and the coupled twin of every
    decision (``twice J1``'s pair 0), in decision order, for the explorer."""
    coupling: dict = field(default_factory=dict)
    """The coupling figures (:func:`~twice_envs.agents.lab.coupling.coupling_summary`, exact rho-bar)."""
    table2: list = field(default_factory=list)
    """The published table's methods and their rows (:func:`~twice_envs.agents.lab.table2.mark_tables`)."""


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


def run_lab_audit(config: LabAuditConfig = LabAuditConfig(), *, policy=None, log=lambda m: None) -> LabAuditResult:
    """Sample, compute every row's credit, and summarise it (see the module)."""
    policy = policy if policy is not None else lab_policy(config.env, config.setting, config.text_setting,
                                                          config.choice_setting)
    eps, envs = toy.toy_rollouts(policy, config.groups, config.group_size, noise_seed=config.seed)
    index = decision_index(eps)
    oracle = np.concatenate(toy.exact_advantages(policy, eps))
    v_before = np.concatenate([policy.episode_values([policy.action_of(t.text) for t in e.turns]) for e in eps])
    u = np.array([e.utility for e in eps])
    g = np.array([e.group for e in eps])
    groups = np.array([g[i] for i, _ in index])
    turns = np.array([t for _, t in index])
    u1 = np.array([u[i] for i, _ in index])
    ptoks = sum(e.num_generated_tokens for e in eps)
    log(f"lab audit: {len(eps)} episodes, {len(index)} decisions with exact A*")

    credit, aux, pairs_of, rho = {}, {}, {}, {}
    credit["grpo"], aux["grpo"], pairs_of["grpo"] = np.array([u[i] - u[g == g[i]].mean() for i, _ in index]), 0, 0
    # GRPO (2x)'s raw credit: the groups enlarged by the further episodes its update row samples (the same ones)
    r2 = get_method("grpo-2x").rollouts
    extras = {r2: toy.toy_rollouts(policy, config.groups, config.group_size * (r2 - 1),
                                   noise_seed=config.seed + EXTRA_FACTUAL_NOISE)}
    more = extras[r2][0]
    credit[GROUP_2X] = enlarged_group_credit(u, g, [e.utility for e in more], [e.group for e in more],
                                             [i for i, _ in index])
    aux[GROUP_2X], pairs_of[GROUP_2X] = sum(e.num_generated_tokens for e in more), 0
    credit["gigpo"], penalty = gigpo_row(eps, policy.env_id, index)
    aux["gigpo"], pairs_of["gigpo"] = 0, 0
    # Twice, diagnostic: pair 0 against the factual episode, further pairs from replicas
    tw = toy.toy_twins(policy, eps, envs, index, coupled=True, branch=1)
    d_pairs = [u1 - np.array([w.utility for w in tw])]
    pair_tokens = [sum(w.num_generated_tokens for w in tw)]
    rho["twice"] = (u1, u1 - d_pairs[0], v_before + oracle, v_before)
    for j in range(1, max(config.pairs)):
        a, b, k = replica_pairs(policy, eps, envs, index, j)
        d_pairs.append(a - b)
        pair_tokens.append(k)
    for J in config.pairs:
        name = f"twice J{J}"
        credit[name], aux[name], pairs_of[name] = np.mean(d_pairs[:J], axis=0), sum(pair_tokens[:J]), J
    # CRR: independent counterfactuals against the factual episode
    cf = []
    for j in range(max(config.pairs)):
        recs = toy.toy_twins(policy, eps, envs, index, coupled=False, branch=1 + j, fresh_salt=7 + j)
        cf.append((u1 - np.array([w.utility for w in recs]), sum(w.num_generated_tokens for w in recs)))
    rho["crr"] = (u1, u1 - cf[0][0], v_before + oracle, v_before)
    for J in config.pairs:
        name = f"crr J{J}"
        credit[name] = np.mean([c for c, _ in cf[:J]], axis=0)
        aux[name], pairs_of[name] = sum(k for _, k in cf[:J]), J
    # VinePPO
    # VinePPO: the K-rollout rows share their first rollouts (rollout j is on branch j)
    _, values_fn = lab_runners(envs)
    vals = values_fn(policy, eps, None, k=max(config.vine_k), noise_seed=config.seed + 31)
    for K in config.vine_k:
        recs = [r for r in vals.records if r.branch <= K]
        credit[f"vineppo K{K}"] = np.concatenate(vineppo.vine_credit(eps, recs))
        aux[f"vineppo K{K}"], pairs_of[f"vineppo K{K}"] = sum(r.num_generated_tokens for r in recs), 0
    # Twice at training time, after a predictor warm-up: A_hat alone and the advantage its update uses
    tt = training_time_twice(policy, eps, envs, config)
    credit["twice-train"], aux["twice-train"], pairs_of["twice-train"] = tt.a_hat, tt.stats["aux_generated"], 0
    diagnostic = dict(credit)  # the rows so far are diagnostic: the equal-token comparisons are made among them
    credit["twice"], aux["twice"], pairs_of["twice"] = tt.update, tt.stats["aux_generated"], 0
    # every other registered method: its advantage as its update consumes it (no warm-up to wait for)
    budget_rows = {"twice": tt.stats}
    for name in registered_methods():
        if name in credit:
            continue
        try:
            check_env(name, policy.env_id)
        except ValueError as exc:  # e.g. a gold-answer method on CreditToy: left out, with the reason
            print(f"lab audit: {name} left out: {exc}", file=sys.stderr)
            continue
        extra, extra_envs = [], []
        rollouts = get_method(name).rollouts
        if rollouts > 1:  # its factual batch: the audited episodes and (rollouts - 1) G more per group
            if rollouts not in extras:
                extras[rollouts] = toy.toy_rollouts(policy, config.groups, config.group_size * (rollouts - 1),
                                                    noise_seed=config.seed + EXTRA_FACTUAL_NOISE)
            extra, extra_envs = extras[rollouts]
        res, credit[name], aux[name] = update_credit(name, policy, eps, envs, extra, extra_envs, config)
        pairs_of[name] = 0
        if "aux_accounted" in res.stats:
            budget_rows[name] = {"aux_generated": res.aux_tokens, **res.stats}  # a grown batch: twins only
    log("lab audit: credit computed; bootstrapping")

    idx = list(cs.resample_indices(len(oracle), config.n_boot, groups=groups, seed=config.seed))
    rows = [row_stats(n, credit[n], oracle, credit["grpo"], pairs_of[n], aux[n], idx, config.threshold,
                       rho.get(n.split()[0]) if n in ("twice J1", "crr J1") else None) for n in credit]
    table2 = mark_tables(rows, diagnostic)
    # one coupled twin (pair 0) and one independent counterfactual at every decision
    coupling = coupling_summary(u1, u1 - d_pairs[0], u1 - cf[0][0], v_before + oracle, v_before,
                                [w.self_twin for w in tw], idx, oracle="exact")
    per_turn = per_turn_table(oracle, credit, turns, config.threshold)
    comparisons = equal_token_comparisons(oracle, diagnostic, aux, idx, config.threshold)
    comparisons += budget_comparisons(oracle, credit, budget_rows, idx, config.threshold)
    budget = {n: budget_figures(st) for n, st in budget_rows.items()}
    return LabAuditResult(config, oracle, groups, turns, credit, aux, pairs_of, rows, per_turn, comparisons, ptoks,
                          budget, float(np.mean(u)), penalty, (eps, tw, index), coupling=coupling, table2=table2)


#: Added to the audit's seed for the noise of the extra factual episodes of a method with ``rollouts > 1``.
EXTRA_FACTUAL_NOISE = 5000


def update_credit(name: str, policy, eps: Sequence[EpisodeRecord], envs: Sequence, extra: Sequence[EpisodeRecord],
                  extra_envs: Sequence, config: LabAuditConfig):
    """The registered method ``name``'s advantage on the audited episodes ``eps`` as its update consumes it.

    Its step (at update 0, the lab's runners) sees ``eps`` followed by ``extra``: the further factual
    episodes of the same groups that a method registered with ``rollouts > 1`` samples (``grpo-2x``: ``G``
    more per group on fresh noise, so its baseline mean and std come from ``2 G`` episodes); only the
    audited episodes' advantages are kept. Returns the credit result, the per-decision advantages of
    ``eps`` (in :func:`~twice_envs.agents.credit.predictor.decision_index` order) and the auxiliary
    tokens: the step's own plus every token of ``extra`` (its extra factual rollouts are its cost).

    A method whose step carries state across updates (a critic; the discordance predictor of the twin terms,
    for methods that need twins) runs after the warm-up batches of :func:`warmed_state`, with that state, and
    plans its twins at the budget (no warm-up branching on the audited batch)."""
    batch = list(eps) + list(extra)
    critic, state, update = warmed_state(name, policy, config)
    res = credit_step(name, policy, batch, config=twice.TwiceConfig(beta=config.beta, warmup_updates=update),
                      sampling=None, rng=np.random.default_rng(config.seed + 23), update=update,
                      noise_seed=config.seed + 23, predictor_state=state, critic=critic,
                      **lab_step_fns(list(envs) + list(extra_envs)))
    adv = np.concatenate(res.advantages[:len(eps)]) if eps else np.zeros(0)
    return res, adv, res.aux_tokens + sum(e.num_generated_tokens for e in extra)


def warmed_state(name: str, policy, config: LabAuditConfig):
    """``(critic, predictor_state, updates)``: the state ``name``'s step carries into the audited batch.

    A method that needs a critic, twins or branches is first run on ``config.warmup_batches`` warm-up batches of
    ``policy`` (the batches Twice's predictor warms up on in :func:`training_time_twice`: same sizes and
    noise seeds; its twins branch at the warm-up probability there), each credited by its own step, which
    fits its critic and its predictor as training does; the audited batch is never among them. Any other
    method: ``(None, None, 0)``."""
    needs = get_method(name).needs
    critic = lab_critic(name, policy)
    if not needs & {"critic", "twins", "branches"}:
        return critic, None, 0
    rng = np.random.default_rng(config.seed + 29)
    group_size = config.group_size * get_method(name).rollouts
    tcfg = twice.TwiceConfig(beta=config.beta, warmup_updates=config.warmup_batches)
    state = None
    for w in range(config.warmup_batches):
        weps, wenvs = toy.toy_rollouts(policy, max(8, config.groups // 4), group_size,
                                       noise_seed=config.seed + 1000 + w)
        res = credit_step(name, policy, weps, config=tcfg, sampling=None, rng=rng, update=w,
                          noise_seed=config.seed + w, predictor_state=state, critic=critic,
                          **lab_step_fns(wenvs))
        state = res.predictor_state or state
    return critic, state, config.warmup_batches


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


@dataclass
class TrainingTimeTwice:
    """Twice's training-time credit on the audit batch (after a predictor warm-up on other batches).

    Attributes:
        a_hat: ``A_hat_t`` per decision (utility units; 0 where not branched).
        update: ``A_traj + omega A_hat_t / sigma_hat``, the advantage its update uses.
        stats: the credit step's statistics (the budget's figures among them).
    """

    a_hat: np.ndarray
    update: np.ndarray
    stats: dict


def training_time_twice(policy, eps, envs, config: LabAuditConfig,
                        twice_config: twice.TwiceConfig | None = None) -> TrainingTimeTwice:
    """Run Twice's credit step as training runs it, after ``warmup_batches`` batches that fit its predictor
    (``twice_config``: its settings, e.g. an ablation; the budget ``beta`` and warm-up come from ``config``)."""
    tcfg = replace(twice_config or twice.TwiceConfig(), beta=config.beta, warmup_updates=config.warmup_batches)
    rng = np.random.default_rng(config.seed + 17)
    state = None
    for w in range(config.warmup_batches):
        weps, wenvs = toy.toy_rollouts(policy, max(8, config.groups // 4), config.group_size,
                                       noise_seed=config.seed + 1000 + w)
        tf, vf = lab_runners(wenvs)
        res = credit_step("twice", policy, weps, config=tcfg, sampling=None, rng=rng, update=w,
                          noise_seed=config.seed + w, predictor_state=state, twins_fn=tf, values_fn=vf)
        state = res.predictor_state
    tf, vf = lab_runners(envs)
    res = credit_step("twice", policy, eps, config=tcfg, sampling=None, rng=rng, update=config.warmup_batches,
                      noise_seed=config.seed + 999, predictor_state=state, twins_fn=tf, values_fn=vf)
    update = np.concatenate(res.advantages)
    util = [e.utility for e in eps]
    a_traj = episode_advantages(util, [e.group for e in eps])
    traj = np.concatenate([np.full(len(e.turns), a_traj[i]) for i, e in enumerate(eps)])
    a_hat = (update - traj) * res.stats["sigma_hat"] / tcfg.omega
    return TrainingTimeTwice(a_hat, update, {**res.stats, "aux_generated": res.aux_tokens})


#: The rows the per-turn breakdowns show: one of each kind of credit.
BREAKDOWN_ROWS = ("grpo", "gigpo", "twice J1", "crr J1", "vineppo K2")
#: The rows the scatter plots (and the LLM audit's breakdowns) show: the same and Twice's training-time credit.
SHOWN_ROWS = ("grpo", "gigpo", "twice J1", "twice-train", "crr J1", "vineppo K2")


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


def _paired_rows(name, base, oracle, credit, idx, threshold, **labels) -> list[dict]:
    """Paired differences ``name - base`` of Pearson and wrong-sign rate with bootstrap CIs."""
    ws = lambda x, a: cs.wrong_sign_rate(x, a, threshold)  # noqa: E731
    out = []
    for fig, stat in (("pearson", cs.pearson), ("wrong_sign", ws)):
        c = cs.compare(stat, (credit[name], oracle), (credit[base], oracle), indices=idx)
        row = {"twice": name, "baseline": base, "figure": fig, **labels, **c.as_dict()}
        if fig == "wrong_sign":
            ratio = lambda x, y, a: ws(x, a) / ws(y, a) if ws(y, a) > 0 else float("nan")  # noqa: E731
            row["ratio"] = cs.bootstrap_ci(ratio, credit[name], credit[base], oracle, indices=idx).as_dict()
        out.append(row)
    return out


def equal_token_comparisons(oracle, credit, aux, idx, threshold) -> list[dict]:
    """Twice's diagnostic credit (the most pairs within each baseline's auxiliary tokens) against each
    baseline: paired differences of Pearson and wrong-sign rate with bootstrap CIs.

    Each comparison says whether the tokens are matched: ``equal_tokens`` is False (and ``label``
    says how) when Twice spends auxiliary tokens the baseline does not (GRPO, GiGPO), or when even
    Twice's cheapest row spends more than the baseline."""
    twices = sorted((aux[n], n) for n in credit if n.startswith("twice J"))
    out = []
    for base in credit:
        if not base.startswith(("crr", "vineppo", "grpo", "gigpo")):
            continue
        within = [n for k, n in twices if k <= aux[base]]
        tw = (within or [twices[0][1]])[-1]
        if aux[base] == 0:
            label = "unequal: the baseline uses no auxiliary tokens"
        elif not within:
            label = "unequal: Twice's cheapest row spends more"
        else:
            label = "at no more auxiliary tokens"
        out += _paired_rows(tw, base, oracle, credit, idx, threshold, twice_tokens=int(aux[tw]),
                            baseline_tokens=int(aux[base]), equal_tokens=label.startswith("at"), label=label)
    return out


def budget_figures(stats: dict) -> dict:
    """A budgeted method's tokens on the audit batch: target (beta x policy tokens), accounted and
    truly generated, and their ratios to the target."""
    target = float(stats["aux_target"])
    acc, gen = float(stats["aux_accounted"]), float(stats["aux_generated"])
    return {"target": target, "accounted": acc, "generated": gen,
            "accounted_ratio": acc / target if target > 0 else float("nan"),
            "generated_ratio": gen / target if target > 0 else float("nan")}


def budget_comparisons(oracle, credit, budget_rows: dict, idx, threshold) -> list[dict]:
    """Twice's update credit against every other method run at the same budget ``beta`` (CRR as
    published, its ablations): both spend ``beta`` x policy tokens in expectation."""
    out = []
    for base, st in budget_rows.items():
        if base == "twice":
            continue
        out += _paired_rows("twice", base, oracle, credit, idx, threshold,
                            twice_tokens=int(budget_rows["twice"]["aux_accounted"]),
                            baseline_tokens=int(st["aux_accounted"]), equal_tokens=True,
                            label="both at budget beta (accounted tokens)")
    return out


# --------------------------------------------------------------------------- output


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


def format_lab(res: LabAuditResult) -> str:
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


def setting_from_args(a) -> SearchToySetting:
    s = SearchToySetting()
    kw = {k: getattr(a, k) for k in ("hops", "queries", "useful", "horizon", "reward", "wording", "temperature")
          if getattr(a, k, None) is not None}
    return replace(s, **kw)


#: TextLab's own setting flags (``--memory-size`` sets ``memory_size``, ...).
TEXT_SETTING_ARGS = ("memory", "memory_size", "words", "max_lines", "max_words", "key_mode")


def text_setting_from_args(a) -> TextLabSetting:
    """The TextLab setting of the parsed flags: the world and action flags shared with SearchToy, and
    TextLab's own (:data:`TEXT_SETTING_ARGS`). Raises ``ValueError`` for a bad or too large setting."""
    kw = {k: getattr(a, k) for k in ("hops", "queries", "useful", "horizon", "reward", "wording", "temperature")
          + TEXT_SETTING_ARGS if getattr(a, k, None) is not None}
    return TextLabSetting(**kw)


def add_setting_args(p: argparse.ArgumentParser) -> None:
    for k in ("hops", "queries", "useful", "horizon"):
        p.add_argument(f"--{k}", type=int, default=None, help=f"SearchToy {k} (default {getattr(SearchToySetting, k)})")
    p.add_argument("--reward", choices=("binary", "graded"), default=None)
    p.add_argument("--wording", type=float, default=None, help="policy's dependence on its previous action (default 1)")
    p.add_argument("--temperature", type=float, default=None)
    t = TextLabSetting
    p.add_argument("--memory", type=float, default=None,
                   help=f"TextLab: strength of the dependence on its own earlier text (default {t.memory})")
    p.add_argument("--memory-size", type=int, default=None, help=f"TextLab: memory modulus (default {t.memory_size})")
    p.add_argument("--words", type=int, default=None, help=f"TextLab: thought words (default {t.words})")
    p.add_argument("--max-lines", type=int, default=None, help=f"TextLab: thought lines per turn at most "
                   f"(default {t.max_lines})")
    p.add_argument("--max-words", type=int, default=None, help=f"TextLab: words per line at most (default {t.max_words})")
    p.add_argument("--key-mode", choices=KEY_MODES, default=None, help=f"TextLab: key layout (default {t.key_mode})")
    add_choice_args(p)


def lab_main(argv: Sequence[str]) -> int:
    """``twice audit --env SearchToy-v0 [--pairs J ...]``: the lab audit."""
    p = argparse.ArgumentParser(prog="twice audit", description="Credit lab audit against exact advantages.")
    p.add_argument("--env", default="SearchToy-v0", choices=LAB_ENVS)
    p.add_argument("--groups", type=int, default=LabAuditConfig.groups)
    p.add_argument("--pairs", type=int, nargs="+", default=list(LabAuditConfig.pairs), help="J values")
    p.add_argument("--vine-k", type=int, nargs="+", default=list(LabAuditConfig.vine_k), help="K values")
    p.add_argument("--beta", type=float, default=LabAuditConfig.beta)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-boot", type=int, default=LabAuditConfig.n_boot)
    p.add_argument("--out", default="runs/lab_audit")
    add_setting_args(p)
    a = p.parse_args(argv)
    if min(a.pairs) < 1 or min(a.vine_k) < 1:
        p.error("--pairs and --vine-k must be >= 1")
    try:
        text_setting = text_setting_from_args(a) if a.env == "TextLab-v0" else TextLabSetting()
        choice_setting = choice_setting_from_args(a) if a.env == "ChoiceLab-v0" else ChoiceLabSetting()
    except ValueError as exc:
        p.error(str(exc))
    cfg = LabAuditConfig(env=a.env, setting=setting_from_args(a), text_setting=text_setting,
                         choice_setting=choice_setting, groups=a.groups,
                         pairs=tuple(sorted(set(a.pairs))), vine_k=tuple(sorted(set(a.vine_k))), beta=a.beta,
                         seed=a.seed, n_boot=a.n_boot)
    t0 = time.time()
    res = run_lab_audit(cfg, policy=lab_policy(cfg.env, cfg.setting, cfg.text_setting, cfg.choice_setting),
                        log=lambda m: print(f"[{time.time() - t0:5.0f}s] {m}", file=sys.stderr, flush=True))
    print(format_lab(res), end="")
    paths = write_lab(res, Path(a.out))
    print("written: " + ", ".join(str(v) for v in paths.values()))
    return 0
