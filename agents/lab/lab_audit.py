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

import sys
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from twice_envs.agents import stats as cs
from twice_envs.agents.credit import twice, vineppo
from twice_envs.agents.credit.grpo import episode_advantages
from twice_envs.agents.credit.predictor import decision_index
from twice_envs.agents.credit.registry import CreditContext, Runners, check_env, get_method, run_credit
from twice_envs.agents.credit.registry import methods as registered_methods
from twice_envs.agents.lab import toy
from twice_envs.agents.lab.choice_lab import ChoiceLabSetting
from twice_envs.agents.lab.compare import budget_comparisons, equal_token_comparisons
from twice_envs.agents.lab.coupling import coupling_summary
from twice_envs.agents.lab.policies import lab_policy
from twice_envs.agents.lab.runners import lab_critic, lab_runners, lab_step_fns, replica_pairs
from twice_envs.agents.lab.scoring import budget_figures, per_turn_table, row_stats
from twice_envs.agents.lab.search_toy import SearchToySetting
from twice_envs.agents.lab.table2 import GROUP_2X, enlarged_group_credit, gigpo_row, mark_tables
from twice_envs.agents.lab.text_setting import TextLabSetting
from twice_envs.agents.types import EpisodeRecord
from twice_envs.progress import Progress


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


def run_lab_audit(config: LabAuditConfig = LabAuditConfig(), *, policy=None, log=lambda m: None) -> LabAuditResult:
    """Sample, compute every row's credit, and summarise it (see the module).

    ``policy``: the initial policy (default :func:`~twice_envs.agents.lab.policies.lab_policy` of the config's
    settings); ``log``: called with a line at each stage. Progress (the audit's steps done out of the total,
    and the time left) shows on a terminal unless :mod:`twice_envs.progress` is off."""
    steps = 5 + 2 * max(config.pairs) + len(registered_methods())
    left_out: list[str] = []
    with Progress(f"lab audit {config.env}", steps, unit="steps") as bar:
        result = _run_lab_audit(config, policy, log, bar, left_out)
    for line in left_out:  # after the progress line, which they would break
        print(line, file=sys.stderr)
    return result


def _run_lab_audit(config: LabAuditConfig, policy, log, bar: Progress, left_out: list) -> LabAuditResult:
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
    bar.update()

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
    bar.update()
    # Twice, diagnostic: pair 0 against the factual episode, further pairs from replicas
    tw = toy.toy_twins(policy, eps, envs, index, coupled=True, branch=1)
    d_pairs = [u1 - np.array([w.utility for w in tw])]
    pair_tokens = [sum(w.num_generated_tokens for w in tw)]
    rho["twice"] = (u1, u1 - d_pairs[0], v_before + oracle, v_before)
    bar.update()
    for j in range(1, max(config.pairs)):
        a, b, k = replica_pairs(policy, eps, envs, index, j)
        d_pairs.append(a - b)
        pair_tokens.append(k)
        bar.update()
    for J in config.pairs:
        name = f"twice J{J}"
        credit[name], aux[name], pairs_of[name] = np.mean(d_pairs[:J], axis=0), sum(pair_tokens[:J]), J
    # CRR: independent counterfactuals against the factual episode
    cf = []
    for j in range(max(config.pairs)):
        recs = toy.toy_twins(policy, eps, envs, index, coupled=False, branch=1 + j, fresh_salt=7 + j)
        cf.append((u1 - np.array([w.utility for w in recs]), sum(w.num_generated_tokens for w in recs)))
        bar.update()
    rho["crr"] = (u1, u1 - cf[0][0], v_before + oracle, v_before)
    for J in config.pairs:
        name = f"crr J{J}"
        credit[name] = np.mean([c for c, _ in cf[:J]], axis=0)
        aux[name], pairs_of[name] = sum(k for _, k in cf[:J]), J
    # VinePPO: the K-rollout rows share their first rollouts (rollout j is on branch j)
    _, values_fn = lab_runners(envs)
    vals = values_fn(policy, eps, None, k=max(config.vine_k), noise_seed=config.seed + 31)
    for K in config.vine_k:
        recs = [r for r in vals.records if r.branch <= K]
        credit[f"vineppo K{K}"] = np.concatenate(vineppo.vine_credit(eps, recs))
        aux[f"vineppo K{K}"], pairs_of[f"vineppo K{K}"] = sum(r.num_generated_tokens for r in recs), 0
    bar.update()
    # Twice at training time, after a predictor warm-up: A_hat alone and the advantage its update uses
    tt = training_time_twice(policy, eps, envs, config)
    credit["twice-train"], aux["twice-train"], pairs_of["twice-train"] = tt.a_hat, tt.stats["aux_generated"], 0
    diagnostic = dict(credit)  # the rows so far are diagnostic: the equal-token comparisons are made among them
    credit["twice"], aux["twice"], pairs_of["twice"] = tt.update, tt.stats["aux_generated"], 0
    bar.update()
    # every other registered method: its advantage as its update consumes it (no warm-up to wait for)
    budget_rows = {"twice": tt.stats}
    for name in registered_methods():
        bar.update()  # one step per registered method, whether it has its own row here or not
        if name in credit:
            continue
        try:
            check_env(name, policy.env_id)
        except ValueError as exc:  # e.g. a gold-answer method on CreditToy: left out, with the reason
            left_out.append(f"lab audit: {name} left out: {exc}")
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
    bar.update()
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
    method = get_method(name)
    res = run_credit(method, batch, CreditContext(
        policy=policy, rng=np.random.default_rng(config.seed + 23), update=update, noise_seed=config.seed + 23,
        config=method.settings(beta=config.beta, warmup_updates=update), predictor_state=state, critic=critic,
        runners=lab_step_fns(list(envs) + list(extra_envs))))
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
    method = get_method(name)
    settings = method.settings(beta=config.beta, warmup_updates=config.warmup_batches)
    state = None
    for w in range(config.warmup_batches):
        weps, wenvs = toy.toy_rollouts(policy, max(8, config.groups // 4), group_size,
                                       noise_seed=config.seed + 1000 + w)
        res = run_credit(method, weps, CreditContext(policy=policy, rng=rng, update=w, noise_seed=config.seed + w,
                                                     config=settings, predictor_state=state, critic=critic,
                                                     runners=lab_step_fns(wenvs)))
        state = res.predictor_state or state
    return critic, state, config.warmup_batches


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
        res = run_credit(get_method("twice"), weps, CreditContext(
            policy=policy, rng=rng, update=w, noise_seed=config.seed + w, config=tcfg, predictor_state=state,
            runners=Runners(twins=tf, values=vf)))
        state = res.predictor_state
    tf, vf = lab_runners(envs)
    res = run_credit(get_method("twice"), eps, CreditContext(
        policy=policy, rng=rng, update=config.warmup_batches, noise_seed=config.seed + 999, config=tcfg,
        predictor_state=state, runners=Runners(twins=tf, values=vf)))
    update = np.concatenate(res.advantages)
    util = [e.utility for e in eps]
    a_traj = episode_advantages(util, [e.group for e in eps])
    traj = np.concatenate([np.full(len(e.turns), a_traj[i]) for i, e in enumerate(eps)])
    a_hat = (update - traj) * res.stats["sigma_hat"] / tcfg.omega
    return TrainingTimeTwice(a_hat, update, {**res.stats, "aux_generated": res.aux_tokens})
