"""Twice: twin credit with branch and evidence coins and inverse-probability weights.

For decision ``t`` of a factual episode with utility ``U``, a *twin* re-runs the
episode from ``s_t`` with an alternative turn (sampled on noise branch ``k >= 1``)
and the factual episode's downstream noise, giving ``U'``. ``D_t = U - U'`` has
expectation ``A(s_t, y_t)`` whatever the coupling quality; good coupling only
shrinks its variance (to ``1 - rho`` times that of an independent counterfactual).

Coins, drawn per decision and per twin:

* branch coin ``B_t ~ Bern(q_t)`` (``q_t`` from :mod:`.budget`);
* evidence coin ``S_t ~ Bern(q_same^{e_t})``, ``e_t = 1`` when the alternative turn
  got the same observation as the factual one (a same-evidence twin often ties, so
  most of them are not continued);

and the twin credit ``A_hat_t = B_t S_t D_t / (q_t q_same^{e_t})`` is unbiased for
``A(s_t, y_t)`` for any ``q_t > 0``. With ``J`` alternatives the credit is their mean.

The advantage used by the loss is ``A_t = A_traj + omega * A_hat_t / sigma_hat``
where ``A_traj`` is GRPO's group-normalised return and ``sigma_hat`` is one scale for
the whole batch: by default the standard deviation of the factual utilities of the batch,
floored at ``sigma_min`` (``twin_scale="running"``: the running RMS of earlier
updates' twin credits, see :class:`TwiceConfig`). The inverse weights make ``A_hat``
as large as ``1 / (q_min q_same)`` = 80 times ``D``, so with a low-reward batch the
twin term can dwarf ``A_traj``; :func:`twin_stats` logs its quantiles. Dividing every twin credit by the same positive number keeps
the direction of the twin-credit gradient unbiased (up to a batch constant) while
putting it on the scale of GRPO's unit-variance term; a per-decision or per-group
scale would re-weight decisions against each other and a floor keeps an all-tie
batch from blowing a rare non-zero twin up.

A self-twin (alternative text == factual text) is the factual episode by the coupling
guarantee: ``D = 0``, nothing generated after its alternative turn. The budget it would have
consumed is freed: a twin of decision ``t`` is planned at its expected cost net of self-twins,
``p_t len_t + (1 - p_t) c_t`` with ``p_t = pi(y_t | s_t)`` the chance that the alternative repeats the
factual turn (:func:`~.predictor.self_twin_probability`) and ``len_t`` that turn's tokens; a realised
self-twin is charged its alternative turn only, and every other twin its full ``c_t``, the ones the
evidence coin skips included (as published). Without the shortcut (``self_twin_shortcut=False``) or
for independent twins, ``p_t = 0``: every twin is planned and charged at ``c_t``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import numpy as np

from twice_envs.agents.credit import budget as budget_rules
from twice_envs.agents.credit import predictor
from twice_envs.agents.credit.budget import (  # noqa: F401  (the costs are part of Twice's interface)
    accounted_tokens,
    branch_costs,
    budget_stats,
    expected_twin_costs,
    turn_costs,
    twins_per_decision,
)
from twice_envs.agents.credit.diagnostics import (  # noqa: F401  (the diagnostics are part of Twice's interface)
    TERM_QUANTILES,
    pair_correlation,
    twin_stats,
    within_decision_rho,
)
from twice_envs.agents.credit.grpo import episode_advantages
from twice_envs.agents.credit.predictor import decision_index, fit_predictor  # noqa: F401  (part of Twice's interface)
from twice_envs.agents.credit.registry import (
    CreditContext,
    CreditResult,
    Request,
    Rollout,
    register_credit,
)
from twice_envs.agents.types import EpisodeRecord


@dataclass
class TwiceConfig:
    """Twin-credit settings (defaults: the method's published settings)."""

    beta: float = 0.7
    """Auxiliary budget: expected twin tokens = beta x the batch's policy tokens."""
    pairs: int = 1
    """J: independent pairs per branched decision. Pair 0 is the factual episode and its
    twins; each further pair replays the factual turn on a fresh downstream noise seed
    and runs its twins on that same seed (a replica plus the twins)."""
    star: int = 1
    """K: alternatives per pair that share the pair's downstream noise (the star design;
    they share one factual side, so they are not independent pairs)."""
    omega: float = 1.0
    """Weight of the twin credit in ``A_t = A_traj + omega A_hat_t / sigma_hat``."""
    q_min: float = 0.05
    """Floor of the branch probability (keeps every inverse weight <= 1/q_min)."""
    q_same: float = 0.25
    """Probability of continuing a same-evidence twin (evidence coin)."""
    warmup_updates: int = 10
    """Updates during which every decision is branched with probability ``warmup_q``."""
    warmup_q: float = 0.3
    """Branch probability during the predictor's warm-up."""
    sigma_min: float = 0.1
    """Floor of the batch scale ``sigma_hat``."""
    coupled: bool = True
    """Twins read the factual noise after the branch (False: independent counterfactuals)."""
    key_mode: str = "line"
    """Noise keying of the sampler: line (default), flat, counter or ngram (ablations)."""
    branching: str = "sqrt"
    """How q is chosen: sqrt (square-root rule), uniform, or mixed (2 p (1 - p))."""
    skip_same_evidence: bool = False
    """Ablation: never continue a same-evidence twin and count it as D = 0 (biased)."""
    inverse_weights: bool = True
    """Divide by q_t q_same^e_t (False: the plain, biased B S D)."""
    self_twin_shortcut: bool = True
    """Self-twins are not continued and free their budget: the plan counts a twin's cost net of its
    predicted self-twin chance (False: self-twins are continued like any other twin, planned and charged
    their full continuation)."""
    cost_ratio: bool = True
    """Plan and charge a twin that is not a self-twin at ``r c_t``, ``r`` the running ratio of the tokens the
    continued twins that were not self-twins truly generated to their proxies ``c_t`` over earlier updates (1
    until twins have run): the proxy, the factual turn and the tokens after it, is the factual continuation,
    while an alternative that differs from the factual turn tends to lead elsewhere (longer in the labs).
    Twins the evidence coin stopped are left out of ``r`` (they are charged in full, as published, and their
    savings are not recycled). False: ``c_t`` as published."""
    trajectory_term: bool = True
    """Include GRPO's A_traj in the advantage (False: twin credit only)."""
    cost_calibration: bool = False
    """Ablation: multiply every planned cost by the realised / planned twin tokens of earlier updates
    when solving for lambda (it recycles what the plan did not spend, chiefly the savings of twins the
    evidence coin stopped, into more branching, so the accounted tokens leave ``beta``)."""
    twin_scale: str = "batch"
    """The scale ``sigma_hat`` of the twin term: ``batch`` (the standard deviation of the
    batch's factual utilities, floored at ``sigma_min``) or ``running`` (the running
    root-mean-square of the twin credits ``A_hat`` of earlier updates, floored at
    ``sigma_min``; it puts the twin term itself at unit scale and, fixed before this
    batch's coins are drawn, keeps ``A_hat / sigma_hat`` unbiased for ``A / sigma_hat``)."""


@dataclass
class BranchPlan:
    """Which decisions of a batch get twins, with what probability.

    Attributes:
        index: every decision ``(episode, turn)`` of the factual batch.
        costs: ``c_t``: tokens of the factual turn plus the episode's remaining tokens.
        eta: predicted discordance per decision (NaN during warm-up).
        q: branch probability per decision.
        branched: the branch coins ``B_t``.
        lam: the bisected lambda (NaN during warm-up).
        budget: the target expected auxiliary tokens.
        p_self: the chance that a twin of the decision is a self-twin, as planned (0 without the shortcut;
            None: 0 everywhere).
        turn_costs: ``len_t``, the factual turn's tokens: what a self-twin costs (None: 1 each).
        cost_ratio: ``r``: a twin that is not a self-twin is planned and charged ``r c_t``.
    """

    index: list[tuple[int, int]]
    costs: np.ndarray
    eta: np.ndarray
    q: np.ndarray
    branched: np.ndarray
    lam: float = float("nan")
    budget: float = 0.0
    p_self: Optional[np.ndarray] = None
    turn_costs: Optional[np.ndarray] = None
    cost_ratio: float = 1.0

    @property
    def branched_decisions(self) -> list[tuple[int, int]]:
        return [d for d, b in zip(self.index, self.branched) if b]

    def unit_costs(self, config: "TwiceConfig") -> np.ndarray:
        """Expected tokens of a branched decision's twins and replicas (:func:`expected_twin_costs`)."""
        n = len(self.index)
        p = np.zeros(n) if self.p_self is None else self.p_self
        lens = np.ones(n) if self.turn_costs is None else self.turn_costs
        return expected_twin_costs(self.costs * self.cost_ratio, lens, p, config)


def policy_tokens(episodes: Sequence[EpisodeRecord]) -> int:
    """Tokens the policy generated in the factual batch."""
    return sum(ep.num_generated_tokens for ep in episodes)


def self_twin_chances(episodes: Sequence[EpisodeRecord], index: Sequence[tuple[int, int]],
                      config: TwiceConfig) -> np.ndarray:
    """``p_t`` as the plan counts it: :func:`~.predictor.self_twin_probability` where self-twins are
    shortcut (coupled twins, ``self_twin_shortcut``), else 0."""
    if not (config.coupled and config.self_twin_shortcut):
        return np.zeros(len(index))
    return predictor.self_twin_probability(episodes, index)


def branch_probabilities(
    episodes: Sequence[EpisodeRecord],
    config: TwiceConfig,
    eta: Optional[np.ndarray],
    *,
    update: int,
    index: Optional[list[tuple[int, int]]] = None,
    cost_scale: float = 1.0,
    success: Optional[np.ndarray] = None,
    cost_ratio: float = 1.0,
) -> tuple[np.ndarray, float, np.ndarray, float]:
    """``(q, lambda, costs, budget)`` for every decision (see :class:`TwiceConfig`).

    The rule and the budget see each decision's expected cost net of its predicted self-twins
    (:func:`expected_twin_costs`, a twin that is not a self-twin at ``cost_ratio x c_t``); ``costs`` are the
    plain ``c_t``. ``cost_scale`` multiplies the expected costs when solving for the budget (only under the
    ``cost_calibration`` ablation; 1 as published). ``success`` is the per-decision prediction ``p_hat_t``
    that mixed-outcome targeting needs.
    """
    index = decision_index(episodes) if index is None else index
    costs = branch_costs(episodes, index)
    unit_costs = expected_twin_costs(costs * cost_ratio, turn_costs(episodes, index),
                                     self_twin_chances(episodes, index, config), config) * cost_scale
    target = config.beta * policy_tokens(episodes)
    if update < config.warmup_updates:
        return np.full(len(index), config.warmup_q), float("nan"), costs, target
    if config.branching == "uniform":
        q, lam = budget_rules.uniform_rule(unit_costs, target, q_min=config.q_min)
    elif config.branching == "mixed":
        if success is None:
            raise ValueError("mixed-outcome targeting needs per-decision success predictions p_hat")
        q, lam = budget_rules.mixed_outcome_rule(success, unit_costs, target, q_min=config.q_min)
    elif config.branching == "sqrt":
        if eta is None:
            raise ValueError("the square-root rule needs predicted discordances eta")
        scores = np.sqrt(np.clip(eta, 0.0, 1.0) / unit_costs)
        q, lam = budget_rules.probabilities_for_budget(scores, unit_costs, target, q_min=config.q_min)
    else:
        raise ValueError(f"branching must be sqrt, uniform or mixed, got {config.branching!r}")
    return q, lam, costs, target


def plan_branches(
    episodes: Sequence[EpisodeRecord],
    config: TwiceConfig,
    eta: Optional[np.ndarray],
    rng: np.random.Generator,
    *,
    update: int,
    cost_scale: float = 1.0,
    success: Optional[np.ndarray] = None,
    cost_ratio: float = 1.0,
) -> BranchPlan:
    """Branch probabilities and the branch coins ``B_t ~ Bern(q_t)`` for a factual batch
    (``cost_ratio``: see :func:`branch_probabilities`)."""
    index = decision_index(episodes)
    q, lam, costs, target = branch_probabilities(episodes, config, eta, update=update, index=index,
                                                 cost_scale=cost_scale, success=success, cost_ratio=cost_ratio)
    coins = rng.random(len(index)) < q
    eta_arr = np.full(len(index), np.nan) if eta is None else np.asarray(eta, dtype=np.float64)
    return BranchPlan(index, costs, eta_arr, q, coins, lam, target, self_twin_chances(episodes, index, config),
                      turn_costs(episodes, index), float(cost_ratio))


def evidence_exponent(twin: EpisodeRecord) -> int:
    """``e_t``: 1 for a same-evidence twin that is not a self-twin."""
    return int(bool(twin.same_evidence) and not twin.self_twin)


def evidence_coins(
    same_evidence: Sequence[bool], config: TwiceConfig, rng: np.random.Generator
) -> np.ndarray:
    """``S ~ Bern(q_same^e)`` per twin (always 0 for same evidence under ``skip_same_evidence``)."""
    e = np.asarray(same_evidence, dtype=bool)
    keep_prob = np.where(e, 0.0 if config.skip_same_evidence else config.q_same, 1.0)
    draws = rng.random(len(e))
    return draws < keep_prob


@dataclass
class TwinCredit:
    """Per-decision twin credit of a batch, with the quantities behind it.

    Attributes:
        a_hat: ``A_hat_t`` per decision of the plan's index (0 where not branched).
        d: mean ``D_t`` over the decision's kept twins (NaN where none).
        pairs: ``(decision row, U, U', e, kept)`` for every twin.
    """

    a_hat: np.ndarray
    d: np.ndarray
    pairs: list[tuple[int, float, float, int, bool]] = field(default_factory=list)

    @property
    def realised(self) -> np.ndarray:
        """Pairs each decision realised: its kept twins (self-twins included, ``D = 0`` exactly); a twin
        the evidence coin dropped realised none. The decisions with at least one are those whose twin
        credit the published ablation table scores (its Rev. column)."""
        rows = np.array([r for r, _, _, _, k in self.pairs if k], dtype=np.int64)
        return np.bincount(rows, minlength=len(self.a_hat))


def twin_credit(
    episodes: Sequence[EpisodeRecord],
    twins: Sequence[EpisodeRecord],
    plan: BranchPlan,
    kept: Sequence[bool],
    config: TwiceConfig,
) -> TwinCredit:
    """``A_hat_t = (1/JK) sum_jk B_t S_jk D_jk / (q_t q_same^{e_jk})`` for every decision.

    ``twins[m].twin_of = (episode, turn)`` names its decision; ``kept[m]`` is its
    evidence coin ``S`` (a twin not kept contributes 0, and its ``U'`` is unused).
    ``D = U_j - U'`` with ``U_j`` the twin's ``pair_utility`` (pairs ``j >= 1``) or the
    factual utility.
    """
    row_of = {d: r for r, d in enumerate(plan.index)}
    a_hat = np.zeros(len(plan.index))
    d_sum = np.zeros(len(plan.index))
    d_cnt = np.zeros(len(plan.index))
    pairs = []
    for twin, s in zip(twins, kept):
        if twin.twin_of is None:
            raise ValueError("a twin record must have twin_of = (episode, turn)")
        i, t = twin.twin_of
        r = row_of[(int(i), int(t))]
        if not plan.branched[r]:
            raise ValueError(f"twin of decision {(i, t)} whose branch coin was 0")
        u = episodes[i].utility if twin.pair_utility is None else twin.pair_utility
        u_twin = u if twin.self_twin else twin.utility
        e = evidence_exponent(twin)
        pairs.append((r, u, u_twin, e, bool(s)))
        if not s:
            continue
        d = u - u_twin
        weight = 1.0 / (plan.q[r] * config.q_same**e) if config.inverse_weights else 1.0
        a_hat[r] += weight * d / (config.pairs * config.star)
        d_sum[r] += d
        d_cnt[r] += 1
    d_mean = np.where(d_cnt > 0, d_sum / np.maximum(d_cnt, 1), np.nan)
    return TwinCredit(a_hat, d_mean, pairs)


def sigma_hat(utilities: Sequence[float], sigma_min: float = 0.1) -> float:
    """The batch scale: standard deviation of the factual utilities, at least ``sigma_min``."""
    u = np.asarray(utilities, dtype=np.float64)
    return max(float(u.std()) if u.size else 0.0, sigma_min)


def twin_scale(utilities: Sequence[float], config: TwiceConfig, running_rms: float = float("nan")) -> float:
    """``sigma_hat`` as ``config.twin_scale`` says; ``running_rms`` is the running scale
    of earlier updates (the batch scale is used until there is one)."""
    if config.twin_scale == "batch" or (config.twin_scale == "running" and not np.isfinite(running_rms)):
        return sigma_hat(utilities, config.sigma_min)
    if config.twin_scale == "running":
        return max(float(running_rms), config.sigma_min)
    raise ValueError(f"twin_scale must be batch or running, got {config.twin_scale!r}")


def combine(
    episodes: Sequence[EpisodeRecord],
    index: Sequence[tuple[int, int]],
    a_hat: np.ndarray,
    config: TwiceConfig,
    scale: Optional[float] = None,
) -> list[np.ndarray]:
    """``A_t = A_traj + omega A_hat_t / sigma_hat`` as one array per episode
    (``scale``: ``sigma_hat``; default the batch scale :func:`sigma_hat`)."""
    util = [ep.utility for ep in episodes]
    a_traj = episode_advantages(util, [ep.group for ep in episodes])
    scale = sigma_hat(util, config.sigma_min) if scale is None else float(scale)
    out = [np.full(len(ep.turns), a_traj[i] if config.trajectory_term else 0.0) for i, ep in enumerate(episodes)]
    for (i, t), a in zip(index, a_hat):
        out[i][t] += config.omega * a / scale
    return out


# --------------------------------------------------------------------------- the training step


def plan_batch(factual: Sequence[EpisodeRecord], config: TwiceConfig, state: "predictor.PredictorState",
               rng: np.random.Generator, *, update: int) -> tuple[BranchPlan, np.ndarray, np.ndarray]:
    """The branch plan of a whole factual batch: ``(plan, features, eta)``.

    The predictor (fitted on earlier batches' twins) gives ``eta_t`` per decision and the twin cost
    ratio ``r`` of earlier updates (:attr:`~.predictor.PredictorState.twin_cost_ratio`); lambda is
    bisected over every decision of the batch at once, so the expected accounted tokens
    ``sum_t q_t E[cost_t]`` equal ``beta`` x the batch's policy tokens (:func:`accounted_tokens`).
    Every caller plans a batch this way: the trainer, the lab and the verl trainer.
    """
    X = predictor.decision_features(factual)
    eta = predictor.predict(state, X)
    success = (predictor.predict_success(state, predictor.success_features(factual))
               if config.branching == "mixed" else None)
    cost_scale = state.cost_scale if config.cost_calibration else 1.0
    ratio = state.twin_cost_ratio if config.cost_ratio else 1.0
    plan = plan_branches(factual, config, eta, rng, update=update, cost_scale=cost_scale, success=success,
                         cost_ratio=ratio)
    return plan, X, eta


@dataclass
class TwinPlan:
    """The plan phase of the twin terms (a twins request's memo).

    Attributes:
        plan: the batch's branch plan.
        config: the twin settings it was planned with.
        state: the predictor state it was planned with.
        features, eta: the predictor's features and predictions of every decision (None: the predictor is
            not fitted on these twins).
    """

    plan: BranchPlan
    config: TwiceConfig
    state: "predictor.PredictorState"
    features: Optional[np.ndarray] = None
    eta: Optional[np.ndarray] = None


def twins_request(plan: BranchPlan, config: TwiceConfig, state: "predictor.PredictorState",
                  features: Optional[np.ndarray] = None, eta: Optional[np.ndarray] = None) -> Request:
    """The request for a branch plan's twins: coupled twins, or independent counterfactuals when
    ``config.coupled`` is False."""
    return Request("twins" if config.coupled else "counterfactuals",
                   {"decisions": plan.branched_decisions, "config": config},
                   memo=TwinPlan(plan, config, state, features, eta))


def score_twins(factual: Sequence[EpisodeRecord], rollout: Rollout):
    """Score the twins of a planned request (:func:`twins_request`).

    Returns ``(twins, credit, scale, stats, state)``, with the budget's figures in ``stats``
    and the twin scale, the twin cost ratio (and the cost calibration of the ablation) tracked in ``state``."""
    tw, memo = rollout.result, rollout.request.memo
    plan, config, state = memo.plan, memo.config, memo.state
    credit = twin_credit(factual, tw.records, plan, tw.kept, config)
    # the scale comes from earlier updates (running) or this batch's utilities, never its coins
    scale = twin_scale([ep.utility for ep in factual], config, state.twin_rms)
    stats = twin_stats(credit, plan, tw.records, omega=config.omega, scale=scale)
    stats.update(budget_stats(tw, plan, config))
    state = predictor.calibrate_cost(state, tw.aux_tokens, stats["aux_planned"])
    state = predictor.track_twin_scale(state, credit.a_hat[plan.branched])
    state = predictor.track_twin_cost(state, *budget_rules.twin_cost_sample(
        plan, list(tw.records) + list(tw.replicas), list(tw.kept) + [True] * len(tw.replicas)))
    stats["cost_scale"] = state.cost_scale
    return tw, credit, scale, stats, state


def plan_twin_terms(factual: Sequence[EpisodeRecord], ctx: CreditContext) -> Request:
    """The plan phase of the twin terms: the batch's branches (square-root rule, the predictor carried in
    ``ctx.predictor_state``, the settings ``ctx.config``), as a twins request."""
    config = ctx.config or TwiceConfig()
    state = ctx.predictor_state or predictor.PredictorState()
    plan, X, eta = plan_batch(factual, config, state, ctx.rng, update=ctx.update)
    return twins_request(plan, config, state, X, eta)


def twin_terms_credit(factual: Sequence[EpisodeRecord], rollout: Rollout, ctx: CreditContext) -> CreditResult:
    """The credit phase of the twin terms: score the twins and fit the predictor; the result's advantages
    hold each turn's twin term ``omega A_hat_t / sigma_hat`` (0 at turns not branched)."""
    memo = rollout.request.memo
    plan, config = memo.plan, memo.config
    tw, credit, scale, stats, state = score_twins(factual, rollout)
    new_state, fit = fit_predictor(state, factual, plan, memo.features, memo.eta, credit, config, ctx.rng)
    stats.update(fit)
    stats["warmup"] = ctx.update < config.warmup_updates  # q fixed at warmup_q: not planned to the budget
    # each decision's coins and twin credit, for the records (not a metric)
    stats["decisions"] = {"index": plan.index, "q": plan.q, "branched": plan.branched, "a_hat": credit.a_hat,
                          "realised": credit.realised}
    terms = combine(factual, plan.index, credit.a_hat, replace(config, trajectory_term=False), scale)
    return CreditResult(terms, tw.aux_tokens, stats, new_state)


def twin_terms(factual: Sequence[EpisodeRecord], ctx: CreditContext) -> CreditResult:
    """Twin credit alone, both phases now: plan the batch's branches, run the twins through ``ctx``'s
    engine and fit the predictor (:func:`plan_twin_terms`, :func:`twin_terms_credit`). Twice adds it to
    GRPO's ``A_traj``; compositions add it to their own advantage (:func:`add_twin_terms`)."""
    request = plan_twin_terms(factual, ctx)
    return twin_terms_credit(factual, Rollout(request, ctx.run(request, factual)), ctx)


def add_twin_terms(base: Sequence[np.ndarray], factual: Sequence[EpisodeRecord], ctx: CreditContext,
                   rollout: Optional[Rollout] = None) -> CreditResult:
    """``base`` (one array of per-turn advantages per episode) plus the twin terms: of ``rollout`` (a planned
    twins request, :func:`plan_twin_terms`) or, without one, of :func:`twin_terms` run now."""
    res = twin_terms(factual, ctx) if rollout is None else twin_terms_credit(factual, rollout, ctx)
    res.advantages = [np.asarray(b, dtype=np.float64) + t for b, t in zip(base, res.advantages)]
    return res


def twice_plan(factual: Sequence[EpisodeRecord], ctx: CreditContext) -> list[Request]:
    """Twice's plan: the batch's twins (:func:`plan_twin_terms`)."""
    return [plan_twin_terms(factual, ctx)]


@register_credit("twice", display="Twice", description="twin credit on GRPO's term (coupled twins, budget rule)",
                 needs=("twins",), config=TwiceConfig, benches=("learn", "games"), plan=twice_plan)
def twice_step(factual: Sequence[EpisodeRecord], rollouts: Sequence[Rollout], ctx: CreditContext) -> CreditResult:
    """``A_traj + omega A_hat_t / sigma_hat``: GRPO's group term plus the twin terms (:func:`twin_terms_credit`)."""
    config = ctx.config or TwiceConfig()
    a_traj = episode_advantages([ep.utility for ep in factual], [ep.group for ep in factual])
    base = [np.full(len(ep.turns), a_traj[i] if config.trajectory_term else 0.0) for i, ep in enumerate(factual)]
    return add_twin_terms(base, factual, ctx, rollouts[0])
