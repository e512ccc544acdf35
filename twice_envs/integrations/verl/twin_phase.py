"""The twin phase of one verl batch: a registered method's auxiliary rollouts, run through verl's server.

verl's agent loop (:mod:`.agent_loop`) plays factual episodes only. For an estimator whose method
asks for auxiliary rollouts (:func:`~.estimators.runs_phase`: twins, independent counterfactuals,
value rollouts), once every episode of a training batch is in, the ``twice_envs`` trainer
(:mod:`.trainer`) hands the rows' ``extra_fields`` to this module, which runs the method's two
phases as the project's own trainer does (:func:`~twice_envs.agents.credit.registry.run_credit`):

1. rebuild the batch's factual :class:`EpisodeRecord` s from the rows (:func:`factual_batch`;
   GRPO groups from verl's prompt uids);
2. the method's plan over the whole batch (:func:`run_twin_phase`; Twice: the square-root rule over
   every decision, with the discordance predictor carried from earlier batches and one lambda
   bisected so that the expected accounted twin tokens equal ``beta`` x the batch's policy tokens);
3. its requests through verl's rollout server: the project's runners
   (:func:`~twice_envs.agents.rollout.twins.llm_runners`) over a :class:`~.agent_loop.ServerPolicy`
   with keyed ``extra_args``;
4. its credit phase: per-turn advantages, and the predictor state that plans the next batch.

:func:`row_fields` turns the result into per-row ``extra_fields`` entries: ``twice_turn_credit``
(each turn's advantage, which :func:`~.estimators.phase_advantages` spreads over the turn's tokens),
and the plan's ``twice_branch_q``, ``twice_branched`` and ``twice_twins``.

The env forks run in the process that calls this (verl's driver), so the env's own
resources (SearchQA's retriever, ALFWorld's games) must be available there.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from twice_envs.agents.credit import predictor
from twice_envs.agents.credit.registry import CreditContext, CreditMethod, CreditResult, Rollout, run_phases
from twice_envs.agents.rollout.twins import llm_runners
from twice_envs.agents.sampling.policy import SamplingConfig
from twice_envs.agents.types import EpisodeRecord
from twice_envs.integrations.verl import estimators as est
from twice_envs.integrations.verl.agent_loop import ServerPolicy
from twice_envs.keys import branch_plan_rng, stable_json_seed

T = TypeVar("T")


@dataclass
class TwinPhase:
    """What one batch's twin phase produced.

    Attributes:
        method: the registered method's name (verl's ``adv_estimator``).
        factual: the batch's factual episodes, in row order.
        result: the method's credit on them (per-turn advantages, auxiliary tokens, statistics).
        rollouts: what its plan asked for, each request (with the method's memo: Twice's branch plan,
            settings and predictions) and what verl's server returned for it.
        twins: the twin and counterfactual records run (``twin_of = (row, turn)``), each with its coin.
        state: the predictor state after this batch (the one given when the method carries none).
        stats: diagnostics (budget, twin and predictor figures).
    """

    method: str
    factual: list[EpisodeRecord]
    result: CreditResult
    rollouts: list[Rollout]
    twins: list[EpisodeRecord]
    state: Any
    stats: dict = field(default_factory=dict)


def factual_batch(extra_fields: Sequence[dict], uids: Sequence) -> list[EpisodeRecord]:
    """The factual episodes of verl's rows (the agent loop's ``twice_episode``), each with its
    GRPO group (verl's prompt uid, numbered in order of first appearance)."""
    groups: dict = {}
    out = []
    for b, (ef, uid) in enumerate(zip(extra_fields, uids)):
        if ef.get(est.EPISODE) is None:
            raise ValueError(f"row {b} carries no {est.EPISODE!r}: the twin phase needs rows played by the "
                             "twice_envs agent loop")
        ep = EpisodeRecord.from_json(ef[est.EPISODE])
        ep.group = groups.setdefault(uid, len(groups))
        out.append(ep)
    return out


def batch_sampling(extra_fields: Sequence[dict]) -> SamplingConfig:
    """The sampling every row was played with (twins must sample the same way); rows that differ are an error."""
    seen = {tuple(sorted(dict(ef.get(est.SAMPLING) or {}).items())) for ef in extra_fields}
    if len(seen) != 1 or not next(iter(seen)):
        raise ValueError(f"the rows of one batch must share one recorded {est.SAMPLING!r}, got {sorted(seen)}")
    return SamplingConfig(**dict(next(iter(seen))))


def batch_noise_seed(extra_fields: Sequence[dict]) -> int:
    """The batch's seed (independent counterfactuals and every coin derive from it): a hash of the
    rows' noise seeds in row order."""
    return stable_json_seed("twice_envs/verl-twin-phase", *[ef.get(est.NOISE_SEED, "") for ef in extra_fields])


def run_twin_phase(method: CreditMethod, factual: Sequence[EpisodeRecord], settings: Any,
                   state: predictor.PredictorState, policy, sampling: SamplingConfig, *, update: int,
                   noise_seed: int) -> TwinPhase:
    """Run the registered ``method``'s two phases on one factual batch, its requests through ``policy``
    (see the module doc).

    ``settings``: the method's settings (its config class, from ``algorithm.<prefix>``); ``state`` is the
    predictor state fitted on earlier batches; ``update`` the index of this update (warm-up reads it);
    ``noise_seed`` the batch's seed: every coin (branch and evidence coins, the predictor's SGD order) comes
    from ``branch_plan_rng(noise_seed)``. Deterministic given its arguments and the policy's answers."""
    factual, twins = list(factual), []
    ctx = CreditContext(policy=policy, sampling=sampling, rng=branch_plan_rng(noise_seed), update=update,
                        noise_seed=noise_seed, config=settings, predictor_state=state, runners=llm_runners(),
                        records=twins)
    res, rollouts = run_phases(method, factual, ctx)
    if res.episodes is not None:
        raise ValueError(f"credit method {method.name!r} grew the batch, and verl trains on its rows as sampled")
    state = res.predictor_state or state
    stats = {**res.stats, "twins": len(twins), "aux_tokens": res.aux_tokens}
    if res.predictor_state is not None:
        stats["predictor_updates"] = state.updates
    return TwinPhase(method.name, factual, res, rollouts, twins, state, stats)


def row_fields(phase: TwinPhase) -> list[dict]:
    """Per-row ``extra_fields`` entries for :func:`~.estimators.phase_advantages`, in row order.

    Every row gets ``twice_turn_credit`` (its turns' advantages), ``twice_branch_q`` (its turns' ``q_t``,
    0 where the method plans no branches), ``twice_branched`` (its branched turns) and ``twice_twins``
    (twins and counterfactuals run for it)."""
    out = [{est.TURN_CREDIT: [float(a) for a in adv], "twice_branch_q": [0.0] * len(ep.turns), "twice_branched": [],
            "twice_twins": 0} for ep, adv in zip(phase.factual, phase.result.advantages)]
    plan = phase.result.stats.get("decisions") or {"index": [], "q": [], "branched": []}
    for (i, t), q, b in zip(plan["index"], plan["q"], plan["branched"]):
        out[i]["twice_branch_q"][t] = float(q)
        if b:
            out[i]["twice_branched"].append(int(t))
    for tw in phase.twins:
        out[int(tw.twin_of[0])]["twice_twins"] += 1
    return out


def phase_metrics(phase: TwinPhase, prefix: str = "twice/") -> dict:
    """The phase's numeric diagnostics, named ``prefix + name`` (for verl's logger)."""
    return {prefix + k: float(v) for k, v in phase.stats.items()
            if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)}


def with_server_policy(server, tokenizer, fn: Callable[[ServerPolicy], T]) -> T:
    """``fn(policy)`` with a :class:`ServerPolicy` over ``server``: ``fn`` runs in a worker thread while
    a private event loop (in its own thread, so callers inside a running loop work too) sends the
    requests."""

    async def main() -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, fn, ServerPolicy(server, tokenizer, loop))

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, main()).result()
