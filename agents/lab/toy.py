"""Exact-advantage lab policies sampled through the real machinery.

A *lab policy* is a small categorical policy over an env's actions whose values are
exact (by enumeration or dynamic programming). It samples exactly like the LLM
sampler: ``argmax(log p + g)`` with keyed Gumbel noise ``g`` read at the env's reported
key, and its twins go through the same fork and twin machinery. It provides:

* ``env_id``, ``env_kwargs``: the env it acts in;
* ``state(env)``: what it conditions on, read from a live env;
* ``action_probs(state)``: its distribution over action indices;
* ``action_text(a)`` / ``action_of(text)``: the env action for an index and back;
* ``episode_advantages(actions)``, ``episode_values(actions)``: exact ``A(s_t, a_t)`` and
  ``V(s_t)`` along an episode;
* ``episode_states(actions)``: the state it conditions on before each turn (a learned
  critic's table keys).
* on an env with a gold answer, ``answer_action`` (its action index) and ``boundary_states(actions)``
  (its states before the first turn and after each turn), for :func:`answer_probs`.

A policy whose turns are one token samples them with :func:`sample_actions` (one keyed
draw from ``action_probs``). A policy whose turns are several tokens (several lines)
also has ``sample_turns(states, keys) -> list[LabTurn]``: it generates every turn token
by token with one :class:`~twice_envs.noise.KeyState` per row (the key rows of the LLM
sampler, in the policy's ``key_mode``) and returns the text, the token ids and their
log-probs. Its "actions" are then the turn texts themselves (``action_of(text)`` is the
text), since what it does next depends on the whole text. :func:`sample_turns` serves
both kinds, so :func:`toy_rollouts`, :func:`toy_twins`, :func:`lab_twins` and
:func:`exact_advantages` work for any of them: :class:`ToyPolicy` (CreditToy, below),
:class:`~twice_envs.agents.lab.search_toy.SearchToyPolicy` and
:class:`~twice_envs.agents.lab.text_policy.TextLabPolicy` (multi-token turns).

The toy policy of CreditToy-v0 (:mod:`twice_envs.envs.credittoy.env`) is categorical with
logits that depend on the turn and the previous action (as an LLM's next turn depends on
its own earlier text). Everything is small enough to enumerate, so ``V(s)`` and
``A(s, a)`` are exact.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np

import twice_envs
from twice_envs import NoiseKey, NoiseSchedule
from twice_envs.agents.rollout.episodes import same_evidence
from twice_envs.agents.types import GROWN_BRANCH, EpisodeRecord, TurnRecord
from twice_envs.envs.credittoy.env import (
    NUM_ACTIONS,
    NUM_TURNS,
    TOY_ID,
    utility_of,
)
from twice_envs.keys import lab_episode_seed, lab_independent_seed
from twice_envs.noise import KeyState, keyed_choice, state_rows
from twice_envs.wrappers.twin import twin

# --------------------------------------------------------------------------- the toy policy


@dataclass(frozen=True)
class ToyPolicy:
    """Categorical policy: ``logits[t, prev]`` over the four actions (``prev = 4``: none/invalid)."""

    logits: np.ndarray = field(hash=False, compare=False)
    env_id = TOY_ID
    env_kwargs: dict = field(default_factory=dict, hash=False, compare=False)

    def probs(self, turn: int, prev: int) -> np.ndarray:
        z = self.logits[turn, prev if prev >= 0 else NUM_ACTIONS]
        p = np.exp(z - z.max())
        return p / p.sum()

    def state(self, env) -> tuple[int, tuple[int, ...]]:
        """``(turn, history)`` of a live CreditToy env."""
        return env.turn, tuple(env.unwrapped.history)

    def action_probs(self, state) -> np.ndarray:
        turn, history = state
        return self.probs(turn, _prev(history))

    def action_text(self, a: int) -> str:
        return str(a)

    def action_of(self, text: str) -> int:
        return int(text)

    def episode_advantages(self, actions: Sequence[int]) -> np.ndarray:
        return np.array([exact_advantage(self, actions[:t], actions[t]) for t in range(len(actions))])

    def episode_values(self, actions: Sequence[int]) -> np.ndarray:
        return np.array([exact_value(self, tuple(actions[:t])) for t in range(len(actions))])

    def episode_states(self, actions: Sequence[int]) -> list[tuple[int, tuple[int, ...]]]:
        """The policy's state ``(turn, history)`` before each turn of an episode."""
        return [(t, tuple(actions[:t])) for t in range(len(actions))]


def toy_policy(seed: int = 2, scale: float = 1.2) -> ToyPolicy:
    """The fixed toy policy used by the tests (seeded normal logits)."""
    rng = np.random.default_rng(seed)
    return ToyPolicy(scale * rng.standard_normal((NUM_TURNS, NUM_ACTIONS + 1, NUM_ACTIONS)))


def _prev(history: Sequence[int]) -> int:
    return history[-1] if history else NUM_ACTIONS


def exact_value(policy: ToyPolicy, history: tuple[int, ...]) -> float:
    """``V(s)``: expected utility from the state after ``history`` (enumeration)."""
    return _values(policy)[tuple(history)]


@lru_cache(maxsize=8)
def _values_cached(key: bytes) -> dict:
    logits = np.frombuffer(key, dtype=np.float64).reshape(NUM_TURNS, NUM_ACTIONS + 1, NUM_ACTIONS)
    policy = ToyPolicy(logits)
    values: dict[tuple[int, ...], float] = {}
    for depth in range(NUM_TURNS, -1, -1):
        for h in itertools.product(range(NUM_ACTIONS), repeat=depth):
            if depth == NUM_TURNS:
                values[h] = utility_of(h)
            else:
                p = policy.probs(depth, _prev(h))
                values[h] = float(sum(p[a] * values[h + (a,)] for a in range(NUM_ACTIONS)))
    return values


def _values(policy: ToyPolicy) -> dict:
    return _values_cached(np.ascontiguousarray(policy.logits, dtype=np.float64).tobytes())


def exact_advantage(policy: ToyPolicy, history: Sequence[int], action: int) -> float:
    """``A(s, a) = V(s + a) - V(s)``."""
    h = tuple(history)
    return exact_value(policy, h + (action,)) - exact_value(policy, h)


def answer_probs(policy, episodes: Sequence[EpisodeRecord]) -> list[np.ndarray]:
    """The lab policy's exact probability of answering (its gold answer, ``policy.answer_action``) at the
    state before the first turn and after each turn of every episode: ``T + 1`` values per episode, each
    ``action_probs(state)[answer_action]`` at the states ``policy.boundary_states`` derives from the turns
    (a credit context's ``answer_probs``). A policy without a gold answer (CreditToy's) raises."""
    if not hasattr(policy, "boundary_states") or not hasattr(policy, "answer_action"):
        raise ValueError(f"the lab policy of {policy.env_id} has no gold answer to score")
    a = policy.answer_action
    return [np.array([policy.action_probs(s)[a]
                      for s in policy.boundary_states([policy.action_of(t.text) for t in ep.turns])],
                     dtype=np.float64)
            for ep in episodes]


def exact_advantages(policy, episodes: Sequence[EpisodeRecord]) -> list[np.ndarray]:
    """Exact ``A(s_t, y_t)`` for every turn of a lab policy's episodes."""
    return [np.asarray(policy.episode_advantages([policy.action_of(t.text) for t in ep.turns]), dtype=np.float64)
            for ep in episodes]


# --------------------------------------------------------------------------- sampling through the env


class LabTurn(NamedTuple):
    """One sampled turn of a lab policy."""

    text: str
    """The turn's text (what the env is given)."""
    token_ids: list
    """The generated token ids, in order."""
    logprobs: list
    """Log-prob of each token under the sampling distribution it was drawn from."""
    entropy: float = 0.0
    """Mean per-token entropy of those distributions over the turn."""


def sample_actions(policy, states: Sequence, keys: Sequence[NoiseKey]) -> list[int]:
    """Keyed Gumbel-max samples for policy states, one key each (batched; one-token turns)."""
    if not keys:
        return []
    import torch

    with np.errstate(divide="ignore"):  # an impossible action has log-probability -inf
        logits = np.stack([np.log(policy.action_probs(s)) for s in states])
    rows = state_rows([KeyState(k) for k in keys])  # one-token turns: the key base is the token's key
    return keyed_choice(torch.from_numpy(logits), torch.from_numpy(rows)).tokens.tolist()


def _one_token_turn(policy, state, action: int) -> LabTurn:
    p = policy.action_probs(state)
    nz = p[p > 0]
    return LabTurn(policy.action_text(action), [action], [float(np.log(p[action]))], float(-(nz * np.log(nz)).sum()))


def sample_turns(policy, states: Sequence, keys: Sequence[NoiseKey]) -> list[LabTurn]:
    """One turn per ``(state, key)``: the policy's own ``sample_turns`` (multi-token turns), else
    one keyed action per turn (:func:`sample_actions`)."""
    if not keys:
        return []
    if hasattr(policy, "sample_turns"):
        return [LabTurn(*t) for t in policy.sample_turns(states, keys)]
    return [_one_token_turn(policy, s, a) for s, a in zip(states, sample_actions(policy, states, keys))]


def _turn_record(turn: LabTurn, key: NoiseKey, obs: str, reward: float, digest: str) -> TurnRecord:
    return TurnRecord(
        token_ids=list(turn.token_ids),
        logprobs=list(turn.logprobs),
        text=turn.text,
        noise_key=key,
        obs=obs,
        reward=reward,
        digest=digest,
        entropy=float(turn.entropy),
    )


def _run(policy, envs: list, records: list[EpisodeRecord]) -> None:
    """Step every env to the end, sampling each turn at the env's reported key."""
    live = [j for j, env in enumerate(envs) if not env.done]
    while live:
        keys = [envs[j].last_info["noise_key"] for j in live]
        turns = sample_turns(policy, [policy.state(envs[j]) for j in live], keys)
        for j, turn, key in zip(live, turns, keys):
            obs, r, term, trunc, info = envs[j].step(turn.text)
            records[j].turns.append(_turn_record(turn, key, obs, r, info["digest"]))
        live = [j for j in live if not envs[j].done]
    for env, rec in zip(envs, records):
        rec.utility = float(env.unwrapped.trajectory.total_reward)
        rec.terminated = env.unwrapped.trajectory.terminated


def toy_rollouts(
    policy, n_groups: int, group_size: int = 5, *, noise_seed: int = 0
) -> tuple[list[EpisodeRecord], list]:
    """``n_groups x group_size`` factual episodes; returns the records and their live envs (for forks).

    A lab policy with ``group_options(noise_seed, group) -> dict`` (a multi-task lab's) gives each group's
    reset options (its task); every episode of a group gets them, and its record keeps them."""
    envs, records = [], []
    for g in range(n_groups):
        # a multi-task lab policy names each group's task (reset options); the others have one task
        task = policy.group_options(noise_seed, g) if hasattr(policy, "group_options") else {}
        for j in range(group_size):
            env = twice_envs.make(policy.env_id, **policy.env_kwargs)
            seed = lab_episode_seed(noise_seed, g, j)
            env.reset(seed=0, options={"noise_seed": seed, **task})
            envs.append(env)
            records.append(EpisodeRecord(policy.env_id, 0, {"noise_seed": seed, **task}, group=g))
    _run(policy, envs, records)
    return records, envs


def toy_twins(
    policy,
    episodes: Sequence[EpisodeRecord],
    envs: Sequence,
    decisions: Sequence[tuple[int, int]],
    *,
    coupled: bool = True,
    branch: int = 1,
    fresh_salt: int = 1,
) -> list[EpisodeRecord]:
    """One twin per decision ``(episode, turn)``: fork at ``t``, alternative on ``branch``, then
    the factual noise (``coupled``) or a fresh seed.

    A coupled twin whose alternative turn has the factual turn's text is the factual episode
    (a self-twin: not continued, ``U' = U``); an independent one is continued anyway,
    since its fresh noise makes it a different episode.
    """
    return lab_twins(policy, episodes, envs, decisions, coupled=coupled, branch=branch, fresh_salt=fresh_salt)[0]


#: First stream of :func:`lab_branches`' fresh seeds (above every twin and value-rollout stream of the lab).
BRANCH_STREAMS = 3_000_000_000


def lab_branches(policy, episodes: Sequence[EpisodeRecord], envs: list, nodes: Sequence[tuple[int, int]], *,
                 noise_seed: int = 0) -> list[EpisodeRecord]:
    """A new factual episode per boundary ``(episode, turn)`` of ``nodes`` (the lab's ``run_branches``):
    fork the episode's env at ``turn``, take turn ``turn`` afresh and play on, all on a fresh seed, and grow
    the result onto the episode's earlier turns (:meth:`~twice_envs.agents.types.EpisodeRecord.grow`).

    The new episodes' live envs are appended to ``envs``, in order, so that an ``envs`` list shared with
    :func:`~twice_envs.agents.lab.runners.lab_runners` forks them like the factual ones. The ``j``-th node's
    seed is ``lab_independent_seed(noise seed of the episode, BRANCH_STREAMS + 100003 (noise_seed mod 10**6)
    + j, turn)``."""
    forks, keys, scheds = [], [], []
    for j, (i, t) in enumerate(nodes):
        fork = envs[i].fork(t)
        sched = NoiseSchedule(lab_independent_seed(episodes[i].options["noise_seed"],
                                                   BRANCH_STREAMS + 100_003 * (noise_seed % 1_000_000) + j, t))
        forks.append(fork)
        scheds.append(sched)
        keys.append(sched.with_branch(t, GROWN_BRANCH).key(t))  # twins of the new turn draw on branches 1..K
    alts = sample_turns(policy, [policy.state(f) for f in forks], keys)
    conts, live, live_recs = [], [], []
    for (i, t), fork, sched, alt, key in zip(nodes, forks, scheds, alts, keys):
        parent = episodes[i]
        rec = EpisodeRecord(parent.env_id, parent.seed, dict(parent.options), group=parent.group, twin_of=(i, t),
                            branch=GROWN_BRANCH, coupled=False)
        tw = twin(fork, alt.text, sched, branch=GROWN_BRANCH)
        obs, r, term, trunc, info = tw.first_step
        rec.turns.append(_turn_record(alt, key, obs, r, info["digest"]))
        conts.append((rec, tw))
        if tw.done:
            rec.utility = float(tw.unwrapped.trajectory.total_reward)
            rec.terminated = tw.unwrapped.trajectory.terminated
        else:
            live.append(tw)
            live_recs.append(rec)
    _run(policy, live, live_recs)
    out = []
    for rec, tw in conts:
        out.append(episodes[int(rec.twin_of[0])].grow(rec))
        envs.append(tw)
    return out


def lab_twins(
    policy,
    episodes: Sequence[EpisodeRecord],
    envs: Sequence,
    decisions: Sequence[tuple[int, int]],
    *,
    coupled: bool = True,
    branch: int = 1,
    fresh_salt: int = 1,
    evidence_coins: Optional[Callable[[Sequence[bool]], Sequence[bool]]] = None,
    self_twins: bool = True,
) -> tuple[list[EpisodeRecord], list[bool]]:
    """:func:`toy_twins` with Twice's evidence coin: ``(twins, kept)``.

    ``self_twins=False`` (the no-self-twin-shortcut ablation) continues a coupled twin whose
    alternative equals the factual turn like any other twin (through the evidence coin).

    After every twin's alternative turn, ``evidence_coins(same_evidence)`` (one flag per
    twin that is not a self-twin and did not end at its alternative turn) says which to
    continue; a twin not kept stops after its alternative turn (its ``utility`` is then
    meaningless and ``kept`` is False). Without ``evidence_coins`` every twin is kept.
    """
    forks, twin_envs, records, alt_keys, alt_states = [], [], [], [], []
    for i, t in decisions:
        fork = envs[i].fork(t)
        alt_keys.append(fork.noise_schedule.with_branch(t, branch).key(t))
        alt_states.append(policy.state(fork))
        forks.append(fork)
    alts = sample_turns(policy, alt_states, alt_keys)
    out: list[EpisodeRecord] = []
    kept: list[bool] = []
    pending: list[int] = []
    for (i, t), fork, alt, key in zip(decisions, forks, alts, alt_keys):
        factual = episodes[i]
        rec = EpisodeRecord(factual.env_id, factual.seed, dict(factual.options), group=factual.group,
                            twin_of=(i, t), branch=branch, coupled=coupled)
        out.append(rec)
        kept.append(True)
        if coupled and self_twins and alt.text == factual.turns[t].text:
            # the factual episode: only its alternative turn was generated (as the LLM runner records it)
            ft = factual.turns[t]
            rec.turns.append(_turn_record(alt, key, ft.obs, ft.reward, ft.digest))
            rec.self_twin, rec.same_evidence, rec.utility = True, True, factual.utility
            continue
        fresh = NoiseSchedule(lab_independent_seed(factual.options["noise_seed"], fresh_salt, t))
        tw = twin(fork, alt.text, fork.noise_schedule if coupled else fresh, branch=branch)
        obs, r, term, trunc, info = tw.first_step
        rec.turns.append(_turn_record(alt, key, obs, r, info["digest"]))
        rec.same_evidence = same_evidence(factual, t, obs, tw.done)
        if tw.done:
            rec.utility = float(tw.unwrapped.trajectory.total_reward)
            rec.terminated = tw.unwrapped.trajectory.terminated
            continue
        pending.append(len(out) - 1)
        twin_envs.append(tw)
        records.append(rec)
    if evidence_coins is not None and pending:
        coins = [bool(c) for c in evidence_coins([out[j].same_evidence for j in pending])]
        for j, c in zip(pending, coins):
            kept[j] = c
        twin_envs = [e for e, c in zip(twin_envs, coins) if c]
        records = [r for r, c in zip(records, coins) if c]
    _run(policy, twin_envs, records)
    return out, kept
