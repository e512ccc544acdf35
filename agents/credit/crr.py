"""CRR credit: one independent counterfactual at uniformly drawn decisions, replacing GRPO's advantage there.

Every decision is branched with the same probability ``q``, chosen (40-step bisection) so
that the expected auxiliary tokens ``q sum_t c_t`` equal Twice's budget, ``beta`` x the
batch's policy tokens. A branched decision gets one counterfactual: the episode forked
at ``s_t``, a fresh alternative turn, then *fresh* noise. Its advantage is replaced by
the outcome difference

    A_t = U - U'                       (branched decisions)
    A_t = A_traj                       (every other decision: GRPO's group-normalised return)

as the method was published: no inverse weights, no evidence coin, no twin scale. The
difference is in utility units while ``A_traj`` is normalised by the group's spread, so
the two kinds of decision are on the scales the published method gives them.

``crr-added`` (an ablation, :func:`crr_added_step`) is Twice with independent twins and
uniform branching instead: the inverse-weighted ``U - U'`` *added* to GRPO's term over
the batch scale, so that it differs from Twice only in the noise and the branching.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from twice_envs.agents.credit import predictor, twice
from twice_envs.agents.credit.grpo import episode_advantages
from twice_envs.agents.credit.registry import (
    CreditContext,
    CreditResult,
    Request,
    Rollout,
    register_credit,
)
from twice_envs.agents.types import EpisodeRecord


def crr_config(base: twice.TwiceConfig | None = None) -> twice.TwiceConfig:
    """Twice's budget turned into CRR's sampling: independent counterfactuals (``J K`` per branched
    decision, one as published), uniform branching, no warm-up, no evidence coin."""
    base = base or twice.TwiceConfig()
    return replace(base, coupled=False, branching="uniform", warmup_updates=0, skip_same_evidence=False, q_same=1.0,
                   cost_calibration=False)


def plan_branches(
    episodes: Sequence[EpisodeRecord],
    rng: np.random.Generator,
    config: twice.TwiceConfig | None = None,
) -> twice.BranchPlan:
    """Uniform branch coins at Twice's expected cost (``beta`` x policy tokens)."""
    return twice.plan_branches(episodes, crr_config(config), None, rng, update=0)


def crr_advantages(
    episodes: Sequence[EpisodeRecord],
    counterfactuals: Sequence[EpisodeRecord],
) -> list[np.ndarray]:
    """Per-turn advantages: GRPO's ``A_traj`` everywhere, replaced by ``U - U'`` at each
    decision that has a counterfactual (``twin_of = (episode, turn)``)."""
    util = [ep.utility for ep in episodes]
    a_traj = episode_advantages(util, [ep.group for ep in episodes])
    out = [np.full(len(ep.turns), a_traj[i], dtype=np.float64) for i, ep in enumerate(episodes)]
    for cf in counterfactuals:
        if cf.twin_of is None:
            raise ValueError("a counterfactual record must have twin_of = (episode, turn)")
        i, t = (int(v) for v in cf.twin_of)
        out[i][t] = episodes[i].utility - cf.utility
    return out


def crr_plan(factual: Sequence[EpisodeRecord], ctx: CreditContext) -> list[Request]:
    """Uniform branch coins at Twice's expected cost, one independent counterfactual each."""
    cfg = replace(crr_config(ctx.config), pairs=1, star=1)
    return [twice.twins_request(twice.plan_branches(factual, cfg, None, ctx.rng, update=0), cfg, None)]


@register_credit("crr", display="CRR", description="U - U' of one independent counterfactual replaces GRPO's "
                 "advantage at uniformly branched decisions", needs=("counterfactuals",), config=twice.TwiceConfig,
                 benches=("learn", "games"), plan=crr_plan)
def crr_step(factual: Sequence[EpisodeRecord], rollouts: Sequence[Rollout], ctx: CreditContext) -> CreditResult:
    """``U - U'`` at the branched decisions, GRPO's ``A_traj`` elsewhere (:func:`crr_advantages`)."""
    cf, memo = rollouts[0].result, rollouts[0].request.memo
    plan = memo.plan
    stats = {"branched_share": float(np.mean(plan.branched)) if len(plan.branched) else float("nan"),
             "mean_q": float(np.mean(plan.q)) if len(plan.q) else float("nan"),
             **twice.budget_stats(cf, plan, memo.config)}
    return CreditResult(crr_advantages(factual, cf.records), cf.aux_tokens, stats)


def crr_added_plan(factual: Sequence[EpisodeRecord], ctx: CreditContext) -> list[Request]:
    """CRR's uniform branch coins and independent counterfactuals, with Twice's ``J K`` per decision."""
    cfg = crr_config(ctx.config)
    plan = twice.plan_branches(factual, cfg, None, ctx.rng, update=0)
    return [twice.twins_request(plan, cfg, ctx.predictor_state or predictor.PredictorState())]


@register_credit("crr-added", display="CRR (added)", description="ablation: independent counterfactuals, uniform "
                 "branching, inverse-weighted and added to GRPO's term as Twice's are", needs=("counterfactuals",),
                 config=twice.TwiceConfig, plan=crr_added_plan)
def crr_added_step(factual: Sequence[EpisodeRecord], rollouts: Sequence[Rollout], ctx: CreditContext) -> CreditResult:
    """Twice's combination with CRR's sampling: ``A_traj + omega B (U - U') / (q sigma_hat)``."""
    memo = rollouts[0].request.memo
    tw, credit, scale, stats, state = twice.score_twins(factual, rollouts[0])
    return CreditResult(twice.combine(factual, memo.plan.index, credit.a_hat, memo.config, scale), tw.aux_tokens,
                        stats, state)
