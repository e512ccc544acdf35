"""Running the auxiliary rollouts each credit method asks for with an LLM policy (:func:`llm_runners`).

The methods in :mod:`twice_envs.agents.credit` are pure functions; this module runs
the policy for them: it asks :mod:`twice_envs.agents.rollout.episodes` for twins,
counterfactuals, value rollouts or further factual branches and counts the auxiliary tokens
they cost (:class:`~twice_envs.agents.credit.registry.Runners`).

Twice's evidence coin needs the alternative turn's observation *before* deciding
whether to continue the twin, so twins are run in two phases
(:func:`~twice_envs.agents.rollout.episodes.start_twins`, then
:func:`~twice_envs.agents.rollout.episodes.finish_twins` for the twins the coins keep), and the
sampled alternative turn is carried as its token ids throughout. A twin dropped by the
evidence coin costs only its alternative turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from twice_envs.agents.credit import twice, vineppo
from twice_envs.agents.credit.registry import CreditContext, CreditResult, Runners, get_method, methods
from twice_envs.agents.rollout.episodes import (
    BranchRequest,
    branch_rollouts,
    finish_twins,
    start_twins,
)
from twice_envs.agents.sampling.policy import Generation
from twice_envs.agents.types import GROWN_BRANCH, EpisodeRecord
from twice_envs.keys import independent_seed


@dataclass
class Twins:
    """The twins of a batch.

    Attributes:
        records: one record per twin, in request order (``twin_of`` names the decision).
        kept: the evidence coin of each twin (always True where there is no coin).
        aux_tokens: tokens generated for them (alternative turns, continuations and the
            replicas of independent pairs).
        replicas: the factual side of every independent pair ``j >= 1`` that was run
            (``twin_of`` and ``pair`` name it; its utility is the pair's ``U_j``).
    """

    records: list[EpisodeRecord] = field(default_factory=list)
    kept: list[bool] = field(default_factory=list)
    aux_tokens: int = 0
    replicas: list[EpisodeRecord] = field(default_factory=list)


def _factual_turn(ep: EpisodeRecord, turn: int):
    t = ep.turns[turn]
    return Generation(t.text, list(t.token_ids), list(t.logprobs), t.entropy, "factual")


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
    """``J`` pairs of ``K`` twins per decision (``config.pairs``, ``config.star``), with evidence coins.

    Phase 1 samples every alternative turn and steps it; a twin whose alternative ended
    the episode has its outcome then (exponent 0, kept), a self-twin (the factual token
    ids, with the shortcut) is the factual episode. The evidence coin
    ``S ~ Bern(q_same^e)`` then decides which of the others are continued in phase 2,
    with the sampled token ids carried as they are. Without the self-twin shortcut an
    identical alternative goes through the coin and is continued like any other twin.

    Pair ``j >= 1`` replays the factual turn (its token ids) on a fresh seed ``s_j`` and
    samples its alternatives with keys ``(s_j, t, k)``, continuing both on ``s_j``; the
    replica is run only when one of its twins is continued.
    """
    if config.pairs < 1 or config.star < 1:
        raise ValueError(f"pairs (J) and star (K) must be >= 1, got {config.pairs} and {config.star}")
    requests, replicas = [], []
    for i, t in decisions:
        for j in range(config.pairs):
            pair_seed = None if j == 0 else independent_seed(noise_seed, i, t, 10_000 + j)
            if j > 0 and config.coupled:
                replicas.append((i, t, j, BranchRequest(i, t, branch=1, coupled=False, noise_seed=pair_seed,
                                                        alternative=_factual_turn(factual[i], t))))
            for k in range(1, config.star + 1):
                if config.coupled:
                    coupled, seed = j == 0, pair_seed
                else:  # independent counterfactuals: every twin on its own fresh seed
                    coupled, seed = False, independent_seed(noise_seed, i, t, 100 * j + k)
                requests.append((j, BranchRequest(i, t, branch=k, coupled=coupled, noise_seed=seed)))
    if not requests:
        return Twins()
    shortcut = config.self_twin_shortcut and config.coupled
    starts = start_twins(policy, factual, [r for _, r in requests], sampling=sampling, detect_self_twins=shortcut)
    out = Twins()
    for (j, req), st in zip(requests, starts):
        rec = st.record
        rec.pair, rec.coupled = j, config.coupled
        # within a coupled pair j >= 1 the factual turn's token ids make a self-twin of the replica
        if shortcut and j > 0 and list(rec.turns[0].token_ids) == list(factual[req.episode].turns[req.turn].token_ids):
            st.live = None
            rec.self_twin = True
        out.aux_tokens += rec.turns[0].num_tokens
    # a self-twin is the factual episode: nothing to keep or drop, so no coin is drawn for it
    coined = [m for m, st in enumerate(starts) if not st.record.self_twin]
    coined_set = set(coined)
    kept = [True] * len(starts)
    for m, k in zip(coined, twice.evidence_coins([twice.evidence_exponent(starts[m].record) for m in coined],
                                                 config, rng)):
        kept[m] = bool(k)
    for st, k in zip(starts, kept):
        if not k:
            st.live = None  # dropped: costs only its alternative turn
    # replicas of the pairs that have a kept twin that is not a self-twin
    needed = {(st.record.twin_of[0], st.record.twin_of[1], st.record.pair) for st, k in zip(starts, kept)
              if k and st.record.pair > 0 and not st.record.self_twin}
    rep = [(key, r) for (i, t, j, r) in replicas if (key := (i, t, j)) in needed]
    rep_starts = start_twins(policy, factual, [r for _, r in rep], sampling=sampling, detect_self_twins=False)
    continued = [st for st in starts if not st.done] + rep_starts
    before = {id(st): st.record.num_generated_tokens for st in continued}
    finish_twins(policy, continued, sampling=sampling)
    out.aux_tokens += sum(st.record.num_generated_tokens - before[id(st)] for st in continued)
    out.aux_tokens += sum(st.record.turns[0].num_tokens for st in rep_starts)
    pair_u = {}
    for (key, _), st in zip(rep, rep_starts):
        st.record.pair = key[2]
        pair_u[key] = st.record.utility
        out.replicas.append(st.record)
    for m, (st, k) in enumerate(zip(starts, kept)):
        rec = st.record
        rec.evidence_coin = bool(k) if m in coined_set else None
        if rec.pair > 0 and config.coupled:
            key = (rec.twin_of[0], rec.twin_of[1], rec.pair)
            if rec.self_twin:
                rec.pair_utility = None  # D = 0 whatever U_j is
            elif k:
                rec.pair_utility = pair_u[key]
        out.records.append(rec)
        out.kept.append(k)
    return out


def run_value_rollouts(policy, factual: Sequence[EpisodeRecord], sampling, *, k: int = vineppo.K_ROLLOUTS,
                       noise_seed: int = 0, states: Optional[Sequence[tuple[int, int]]] = None) -> Twins:
    """``k`` independent rollouts from each turn boundary ``(episode, turn)`` of ``states`` (default:
    every turn boundary of every episode, VinePPO's). A rollout's seed depends only on its boundary and
    ``j``, so restricting ``states`` leaves the other rollouts as they were."""
    states = vineppo.value_states(factual) if states is None else states
    requests = [BranchRequest(i, t, branch=j, coupled=False, noise_seed=independent_seed(noise_seed, i, t, 1000 + j))
                for i, t in states for j in range(1, k + 1)]
    recs = branch_rollouts(policy, factual, requests, sampling=sampling) if requests else []
    return Twins(recs, [True] * len(recs), sum(r.num_generated_tokens for r in recs))


def run_branches(policy, factual: Sequence[EpisodeRecord], nodes: Sequence[tuple[int, int]], sampling, *,
                 noise_seed: int = 0) -> list[EpisodeRecord]:
    """A new factual episode per boundary ``(episode, turn)`` of ``nodes``: an independent rollout from it
    (turn ``turn`` sampled afresh, fresh noise from there on) grown onto the episode's earlier turns
    (:meth:`~twice_envs.agents.types.EpisodeRecord.grow`). The ``j``-th node's seed depends on its boundary
    and ``j``, so a boundary drawn twice gets two different episodes."""
    requests = [BranchRequest(i, t, branch=GROWN_BRANCH, coupled=False,  # twins of the new turn draw on 1..K
                              noise_seed=independent_seed(noise_seed, i, t, 5000 + j)) for j, (i, t) in enumerate(nodes)]
    recs = branch_rollouts(policy, factual, requests, sampling=sampling) if requests else []
    return [factual[int(r.twin_of[0])].grow(r) for r in recs]


def llm_runners(answer_probs=None) -> Runners:
    """The engine of an LLM policy: :func:`run_twins`, :func:`run_value_rollouts` and :func:`run_branches`
    (``answer_probs``: the gold answer's probabilities, :func:`~twice_envs.agents.training.gold_answer.answer_probs`,
    for the methods that need them). Bind it once per run and hand it to every update's
    :class:`~twice_envs.agents.credit.registry.CreditContext`."""
    return Runners(twins=run_twins, values=run_value_rollouts, branches=run_branches, answer_probs=answer_probs)


#: The baseline every saved credit is shown beside.
BASELINE = "grpo"


def annotate_credit(method: str, batch: Sequence[EpisodeRecord], res: CreditResult) -> None:
    """Record on each factual episode of ``batch`` its per-turn credit under ``method`` and GRPO's
    beside it (:attr:`~twice_envs.agents.types.EpisodeRecord.credit`) and, where the step reports its
    branch plan (``stats["decisions"]``), each turn's coins ``q``, ``B`` and twin credit ``A_hat``."""
    base = None
    if method != BASELINE and BASELINE in methods():
        base = get_method(BASELINE)(batch, CreditContext()).advantages
    for i, ep in enumerate(batch):
        ep.credit = {method: [float(a) for a in res.advantages[i]]}
        if base is not None:
            ep.credit[BASELINE] = [float(a) for a in base[i]]
    plan = res.stats.get("decisions")
    if not plan:
        return
    for ep in batch:
        ep.coins = [{} for _ in ep.turns]
    for (i, t), q, b, a in zip(plan["index"], plan["q"], plan["branched"], plan["a_hat"]):
        if 0 <= i < len(batch) and 0 <= t < len(batch[i].turns):
            batch[i].coins[t] = {"q": float(q), "B": bool(b), "A_hat": float(a)}
