"""Credit on lab policies: the runners a credit step takes, and the replica pairs of the diagnostic rows.

A lab policy (:mod:`.toy`) samples through keyed noise and forks its envs, so every auxiliary rollout a
credit method asks for (twins, value rollouts, further factual episodes) runs here on the factual
episodes' own envs; its exact probabilities and advantages are handed over beside them.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from twice_envs import NoiseSchedule
from twice_envs.agents.credit import twice, vineppo
from twice_envs.agents.credit.registry import Runners, get_method
from twice_envs.agents.lab import toy
from twice_envs.agents.lab.critic import LabCritic
from twice_envs.agents.rollout.twins import Twins
from twice_envs.agents.types import EpisodeRecord
from twice_envs.keys import lab_pair_seed
from twice_envs.wrappers.twin import twin


def lab_runners(envs: Sequence):
    """``(twins_fn, values_fn)``: the twins and value-rollout runners
    (:class:`~twice_envs.agents.credit.registry.Runners`) of a lab policy whose factual episodes live in
    ``envs`` (one pair, no star, per decision)."""

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


def lab_step_fns(envs: list) -> Runners:
    """The engine (:class:`~twice_envs.agents.credit.registry.Runners`) of a lab policy whose factual
    episodes live in ``envs``: its twins and value rollouts (:func:`lab_runners`),
    further factual episodes (:func:`~twice_envs.agents.lab.toy.lab_branches`, whose envs join ``envs``,
    so the twins of a grown episode fork its own env), the policy's exact probabilities of the gold
    answer (:func:`~twice_envs.agents.lab.toy.answer_probs`) and its exact advantages
    (:func:`~twice_envs.agents.lab.toy.exact_advantages`)."""
    twins_fn, values_fn = lab_runners(envs)

    def branches_fn(policy, factual, nodes, sampling, *, noise_seed=0):
        return toy.lab_branches(policy, factual, envs, nodes, noise_seed=noise_seed)

    return Runners(twins=twins_fn, values=values_fn, branches=branches_fn, answer_probs=toy.answer_probs,
                   exact_advantages=toy.exact_advantages)


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
