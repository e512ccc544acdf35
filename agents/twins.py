"""Running the auxiliary rollouts each estimator needs, and turning them into advantages.

The estimators in :mod:`twice_envs.agents.credit` are pure functions; this module runs
the policy for them: it asks :mod:`twice_envs.agents.rollout` for twins,
counterfactuals or value rollouts, counts the auxiliary tokens they cost, and hands
the records to the estimators.

Twice's evidence coin needs the alternative turn's observation *before* deciding
whether to continue the twin, so coupled twins are run in two phases: the
alternative turns of all branched decisions in one batched call (stepping a replayed
fork to see their observation), then the continuations of the twins the coins keep,
through :func:`~twice_envs.agents.rollout.branch_rollouts` with the alternative text
forced. A twin dropped by the evidence coin costs only its alternative turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

import twice_envs
from twice_envs.agents.credit import crr, grpo, predictor, twice, vineppo
from twice_envs.agents.types import EpisodeRecord, TurnRecord
from twice_envs.keys import UINT64_MAX, NoiseKey, NoiseSchedule

METHODS = ("grpo", "twice", "crr", "vineppo")


def fresh_seed(noise_seed: int, episode: int, turn: int, branch: int) -> int:
    """A fresh 64-bit episode seed for an independent continuation (stable everywhere)."""
    w = np.random.SeedSequence([int(noise_seed) & UINT64_MAX, episode, turn, branch, 0x435252]).generate_state(2, np.uint32)
    return int(w[0]) | (int(w[1]) << 32)


def _context(ep: EpisodeRecord, turn: int) -> tuple[list[int], int]:
    ctx, n = list(ep.prompt_ids), 0
    for t in ep.turns[:turn]:
        ctx += list(t.token_ids) + list(t.obs_token_ids)
        n += len(t.token_ids)
    return ctx, n


@dataclass
class Twins:
    """The twins of a batch.

    Attributes:
        records: one record per twin, in request order (``twin_of`` names the decision).
        kept: the evidence coin of each twin (always True where there is no coin).
        aux_tokens: tokens generated for them (alternative turns and continuations).
    """

    records: list[EpisodeRecord] = field(default_factory=list)
    kept: list[bool] = field(default_factory=list)
    aux_tokens: int = 0


def run_twins(
    policy,
    factual: Sequence[EpisodeRecord],
    decisions: Sequence[tuple[int, int]],
    config: twice.TwiceConfig,
    sampling,
    rng: np.random.Generator,
    *,
    noise_seed: int = 0,
) -> Twins:
    """``config.n_alternatives`` twins per decision, with evidence coins when ``q_same < 1``."""
    from twice_envs.agents.rollout import BranchRequest, branch_rollouts

    requests = []
    for i, t in decisions:
        for k in range(1, config.n_alternatives + 1):
            seed = None if config.coupled else fresh_seed(noise_seed, i, t, k)
            requests.append(BranchRequest(i, t, branch=k, coupled=config.coupled, noise_seed=seed))
    if not requests:
        return Twins()
    needs_coin = config.skip_same_evidence or config.q_same < 1.0
    if not needs_coin:
        recs = branch_rollouts(policy, factual, requests, sampling=sampling)
        out = Twins(recs, [True] * len(recs), sum(r.num_generated_tokens for r in recs))
        _charge_self_twins(out, factual, config)
        return out

    # phase 1: the alternative turns and their observations
    rows, gen_reqs = [], []
    from twice_envs.agents.policy import GenerationRequest

    for r in requests:
        ep = factual[r.episode]
        schedule = NoiseSchedule.from_json(ep.trajectory["noise"])
        seed = schedule.episode_seed if r.coupled else int(r.noise_seed)
        env = twice_envs.replay(ep.trajectory, turn=r.turn)
        ctx, counter = _context(ep, r.turn)
        key = NoiseKey(seed, r.turn, r.branch)
        rows.append((r, ep, env, key))
        gen_reqs.append(GenerationRequest(ctx, key, tuple(env.protocol().stop), counter))
    gens = []
    for start in range(0, len(gen_reqs), 64):
        gens += policy.generate(gen_reqs[start : start + 64], sampling)

    out = Twins()
    keep_rows = []
    for (r, ep, env, key), g in zip(rows, gens):
        fact = ep.turns[r.turn]
        rec = EpisodeRecord(ep.env_id, ep.seed, dict(ep.options), group=ep.group, twin_of=(r.episode, r.turn),
                            branch=r.branch, coupled=r.coupled)
        rec.turns = [TurnRecord(list(g.token_ids), list(g.logprobs), g.text, key, entropy=g.entropy)]
        out.aux_tokens += len(g.token_ids)
        if r.coupled and g.text == fact.text:
            rec.self_twin = rec.same_evidence = True
            rec.utility = ep.utility
            out.records.append(rec)
            out.kept.append(True)
            continue
        obs = env.step(g.text)[0]
        rec.turns[0].obs = obs
        rec.same_evidence = obs == fact.obs
        out.records.append(rec)
        out.kept.append(False)
        keep_rows.append(len(out.records) - 1)
    coins = twice.evidence_coins([out.records[j].same_evidence for j in keep_rows], config, rng)
    continue_rows = [j for j, c in zip(keep_rows, coins) if c]
    # phase 2: continue the kept twins with the alternative text forced
    reqs2 = []
    for j in continue_rows:
        rec = out.records[j]
        i, t = rec.twin_of
        seed = None if config.coupled else fresh_seed(noise_seed, i, t, rec.branch)
        reqs2.append(BranchRequest(i, t, branch=rec.branch, coupled=config.coupled, noise_seed=seed, action=rec.turns[0].text))
    done = branch_rollouts(policy, factual, reqs2, sampling=sampling) if reqs2 else []
    for j, twin in zip(continue_rows, done):
        twin.same_evidence = out.records[j].same_evidence
        out.aux_tokens += twin.num_generated_tokens - len(twin.turns[0].token_ids)
        # keep the sampled alternative turn (the forced one is its re-encoding)
        twin.turns[0] = TurnRecord(**{**out.records[j].turns[0].__dict__, "obs": twin.turns[0].obs,
                                      "obs_token_ids": twin.turns[0].obs_token_ids, "reward": twin.turns[0].reward,
                                      "digest": twin.turns[0].digest})
        out.records[j] = twin
        out.kept[j] = True
    _charge_self_twins(out, factual, config)
    return out


def _charge_self_twins(out: Twins, factual: Sequence[EpisodeRecord], config: twice.TwiceConfig) -> None:
    # Without the shortcut a self-twin re-runs the factual continuation, which the
    # coupling makes token-identical to the factual one: charge it instead of re-running.
    if config.self_twin_shortcut:
        return
    for rec in out.records:
        if rec.self_twin:
            i, t = rec.twin_of
            out.aux_tokens += factual[i].remaining_tokens(t + 1)


def run_value_rollouts(policy, factual: Sequence[EpisodeRecord], sampling, *, k: int = vineppo.K_ROLLOUTS,
                       noise_seed: int = 0) -> Twins:
    """VinePPO's ``k`` independent rollouts from every turn boundary of every episode."""
    from twice_envs.agents.rollout import BranchRequest, branch_rollouts

    requests = [BranchRequest(i, t, branch=j, coupled=False, noise_seed=fresh_seed(noise_seed, i, t, 1000 + j))
                for i, t in vineppo.value_states(factual) for j in range(1, k + 1)]
    recs = branch_rollouts(policy, factual, requests, sampling=sampling) if requests else []
    return Twins(recs, [True] * len(recs), sum(r.num_generated_tokens for r in recs))


@dataclass
class CreditResult:
    """What a credit step produced.

    Attributes:
        advantages: one array of per-turn advantages per factual episode.
        aux_tokens: auxiliary tokens generated.
        stats: diagnostics for the metrics file.
        predictor_state: the updated discordance predictor (Twice).
    """

    advantages: list[np.ndarray]
    aux_tokens: int = 0
    stats: dict = field(default_factory=dict)
    predictor_state: Optional[predictor.PredictorState] = None


def credit_step(
    method: str,
    policy,
    factual: Sequence[EpisodeRecord],
    *,
    config: twice.TwiceConfig,
    sampling,
    rng: np.random.Generator,
    update: int,
    noise_seed: int,
    predictor_state: Optional[predictor.PredictorState] = None,
    vine_k: int = vineppo.K_ROLLOUTS,
) -> CreditResult:
    """Run what ``method`` needs and return the per-turn advantages of ``factual``."""
    if method == "grpo":
        return CreditResult(grpo.grpo_credit(factual))
    if method == "vineppo":
        vals = run_value_rollouts(policy, factual, sampling, k=vine_k, noise_seed=noise_seed)
        return CreditResult(vineppo.vine_credit(factual, vals.records), vals.aux_tokens)
    state = predictor_state or predictor.PredictorState()
    if method == "crr":
        cfg = crr.crr_config(config)
        plan = crr.plan_branches(factual, rng, config, cost_scale=state.cost_scale)
        tw = run_twins(policy, factual, plan.branched_decisions, cfg, sampling, rng, noise_seed=noise_seed)
        credit = twice.twin_credit(factual, tw.records, plan, tw.kept, cfg)
        stats = twice.twin_stats(credit, plan, tw.records)
        state = predictor.calibrate_cost(state, tw.aux_tokens, float(np.dot(plan.q, plan.costs)))
        stats["cost_scale"] = state.cost_scale
        return CreditResult(twice.combine(factual, plan.index, credit.a_hat, cfg), tw.aux_tokens, stats, state)
    if method != "twice":
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    X = predictor.decision_features(factual)
    eta = predictor.predict(state, X)
    plan = twice.plan_branches(factual, config, eta, rng, update=update, cost_scale=state.cost_scale)
    tw = run_twins(policy, factual, plan.branched_decisions, config, sampling, rng, noise_seed=noise_seed)
    credit = twice.twin_credit(factual, tw.records, plan, tw.kept, config)
    stats = twice.twin_stats(credit, plan, tw.records)
    state = predictor.calibrate_cost(state, tw.aux_tokens, float(np.dot(plan.q, plan.costs)) * config.n_alternatives)
    stats["cost_scale"] = state.cost_scale
    # fit the predictor on the realised twins, each weighted by 1 / (q q_same^e)
    rows, labels, weights = [], [], []
    for (r, u, v, e, kept) in credit.pairs:
        if kept:
            rows.append(r)
            labels.append(float(u != v))
            weights.append(1.0 / (plan.q[r] * config.q_same**e))
    stats["predictor_auc"] = predictor.auc(eta[rows], labels) if rows else float("nan")
    stats["discordance"] = float(np.mean(labels)) if labels else float("nan")
    new_state = predictor.sgd_update(state, X[rows], np.array(labels), np.array(weights), rng) if rows else state
    return CreditResult(twice.combine(factual, plan.index, credit.a_hat, config), tw.aux_tokens, stats, new_state)
