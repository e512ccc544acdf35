"""CRR credit: independent counterfactuals, branched uniformly at Twice's expected cost.

A branched decision gets one counterfactual that takes a fresh alternative turn and
continues with a *fresh* noise seed; its credit is ``U - U'``. Every decision is
branched with the same probability ``q``, chosen so that the expected auxiliary
tokens equal Twice's budget (``beta`` x policy tokens). For training, the credit
enters the advantage exactly as Twice's does (inverse-weighted by ``1/q`` and added to
GRPO's term over the batch scale), so that the only differences from Twice are the
independent noise and the uniform branching.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from twice_envs.agents.credit import predictor, twice
from twice_envs.agents.credit.registry import (
    CreditContext,
    CreditResult,
    register_credit,
)
from twice_envs.agents.types import EpisodeRecord


def crr_config(base: twice.TwiceConfig | None = None) -> twice.TwiceConfig:
    """Twice's settings turned into CRR: independent twins, uniform branching, no evidence coin."""
    base = base or twice.TwiceConfig()
    return replace(base, coupled=False, branching="uniform", warmup_updates=0, skip_same_evidence=False, q_same=1.0)


def plan_branches(
    episodes: Sequence[EpisodeRecord],
    rng: np.random.Generator,
    config: twice.TwiceConfig | None = None,
    *,
    cost_scale: float = 1.0,
) -> twice.BranchPlan:
    """Uniform branch coins at Twice's expected cost."""
    return twice.plan_branches(episodes, crr_config(config), None, rng, update=0, cost_scale=cost_scale)


def crr_credit(
    episodes: Sequence[EpisodeRecord],
    counterfactuals: Sequence[EpisodeRecord],
    plan: twice.BranchPlan,
    config: twice.TwiceConfig | None = None,
) -> twice.TwinCredit:
    """``B_t (U - U') / q`` per decision (every counterfactual is kept)."""
    cfg = crr_config(config)
    return twice.twin_credit(episodes, counterfactuals, plan, [True] * len(counterfactuals), cfg)


@register_credit("crr", display="CRR", description="independent counterfactuals branched uniformly",
                 needs=("counterfactuals",), config=twice.TwiceConfig, benches=("learn", "games"),
                 verl="twice_envs.integrations.verl.estimators:crr_advantages")
def crr_step(factual: Sequence[EpisodeRecord], ctx: CreditContext) -> CreditResult:
    """Uniform branch coins at Twice's expected cost, one independent counterfactual each."""
    config = ctx.twice or twice.TwiceConfig()
    state = ctx.predictor_state or predictor.PredictorState()
    cfg = crr_config(config)
    plan = plan_branches(factual, ctx.rng, config, cost_scale=state.cost_scale)
    tw, credit, scale, stats, state = twice.run_planned_twins(ctx, factual, plan, cfg, state)
    return CreditResult(twice.combine(factual, plan.index, credit.a_hat, cfg, scale), tw.aux_tokens, stats, state)
