"""Rollouts and twin rollouts of a policy on any registered env, through the uniform step API.

:func:`rollout` runs groups of episodes (GRPO groups: ``group_size`` episodes per task),
generating one turn for every live episode at each step, in batched calls whose rows have
contexts of similar length (:func:`generate_in_batches`).
:func:`branch_rollouts` forks factual episodes at a turn, samples an alternative turn
on branch ``k >= 1`` and continues it with the factual noise (coupled twins) or fresh
noise (independent counterfactuals), batched across all requests. It runs in two
phases, also public: :func:`start_twins` (the alternative turns and what the env
answered) and :func:`finish_twins` (the continuations), so that an evidence coin can
be drawn between them.

Each episode's context is kept as token ids (never re-tokenised), so a record's
``prompt_ids`` and turns rebuild exactly what the model saw (:func:`pack_episode`). With a
history ``window`` the model sees the first prompt and the last ``window`` turns only
(:func:`~twice_envs.agents.rollout.context.turn_context`), and so do the episode's twins.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

import twice_envs
from twice_envs.agents.rollout.choice import turn_candidates
from twice_envs.agents.rollout.context import (
    check_window,
    initial_prompt_ids,
    observation_ids,
    turn_context,
    twin_prefix,
)
from twice_envs.agents.sampling.policy import (
    Generation,
    GenerationRequest,
    SamplingConfig,
)
from twice_envs.agents.types import EpisodeRecord, TurnRecord
from twice_envs.keys import (
    NoiseKey,
    NoiseSchedule,
    episode_noise_seed,
)
from twice_envs.noise import KeyState, sampling_logprobs
from twice_envs.wrappers.twin import twin

#: Final-info entries never copied into ``EpisodeRecord.info`` (bulky or per-step).
_INFO_SKIP = ("noise_key", "digest", "admissible_actions", "turn", "messages")


def same_evidence(factual: EpisodeRecord, turn: int, obs: str, over: bool) -> bool:
    """Whether an alternative turn got the factual turn's evidence.

    True when the observations are equal and neither the alternative nor the factual
    turn ended the episode: an observation after the last turn (often ``""``) is no
    evidence, and a twin that ended has its outcome already, with nothing left to skip.
    """
    return (not over) and turn < len(factual.turns) - 1 and obs == factual.turns[turn].obs


@dataclass
class Task:
    """One GRPO group: ``group_size`` episodes of the same task."""

    seed: int
    """The env reset seed (with ``options``, it names the task)."""
    options: dict = field(default_factory=dict)
    """Reset options (e.g. ``{"index": 17, "split": "dev"}``)."""


@dataclass
class BranchRequest:
    """One twin to run (see :func:`branch_rollouts`)."""

    episode: int
    """Index of the factual episode in the list passed to :func:`branch_rollouts`."""
    turn: int
    """The branch turn ``t``."""
    branch: int = 1
    """``k >= 1``: the noise branch of the alternative turn."""
    coupled: bool = True
    """True: later turns read the factual keys; False: a fresh ``noise_seed`` (CRR / VinePPO)."""
    noise_seed: Optional[int] = None
    """The fresh episode seed when ``coupled=False`` (required then)."""
    action: Optional[str] = None
    """Force this alternative text (encoded to tokens) instead of sampling one: for
    alternatives a person or script writes."""
    alternative: Optional[Generation] = None
    """Force this already sampled turn: its token ids are carried as they are (never
    re-encoded from its text)."""


@dataclass
class _Live:
    """An episode being generated."""

    env: Any
    record: EpisodeRecord
    context: list[int]
    turn_cap: int
    token_counter: int = 0
    stop: tuple[str, ...] = ()


def _json_info(info: dict) -> dict:
    out = {}
    for k, v in info.items():
        if k in _INFO_SKIP:
            continue
        if isinstance(v, (bool, int, float, str)) or v is None:
            out[k] = v
        elif isinstance(v, np.generic):
            out[k] = v.item()
    return out


def _finish(live: _Live, info: dict, terminated: bool, truncated: bool) -> None:
    rec = live.record
    rec.terminated, rec.truncated = bool(terminated), bool(truncated)
    rec.trajectory = live.env.trajectory.to_json()
    rec.utility = float(sum(rec.trajectory["rewards"]))
    keep = _json_info(info)
    keep["turn_cap"] = live.turn_cap
    env = live.env.unwrapped
    keep["measures"] = {k: float(v) for k, v in env.measures(info, rec.utility).items()}
    if getattr(env, "has_gold_answer", False):  # kept to score the policy's probability of the answer later
        keep["gold_answers"] = [str(g) for g in env.gold_answers()]
        keep["gold_actions"] = [env.answer_action(str(g)) for g in keep["gold_answers"]]
    rec.info.update(keep)


#: Seconds spent in env steps and in generation, summed over all rollouts (benchmarks read it).
TIMING = {"env_seconds": 0.0, "generate_seconds": 0.0}


def token_keys(policy, token_ids, key: NoiseKey, key_mode: str = "line", token_counter: int = 0,
               context=()) -> tuple[list[str], list[list[int]]]:
    """Each token's text (decoded alone, as the sampler's newline table decodes it) and the noise key it
    read, ``[turn, branch, line, pos]``, replayed through :class:`~twice_envs.noise.KeyState`; two empty
    lists for a policy without a tokenizer."""
    tok = getattr(policy, "tokenizer", None)
    if tok is None:
        return [], []
    texts = [tok.decode([int(t)], skip_special_tokens=False, clean_up_tokenization_spaces=False) for t in token_ids]
    state = KeyState(key, key_mode, int(token_counter), list(context))
    keys = []
    for t, text in zip(token_ids, texts):
        keys.append([int(v) for v in state.row()[2:]])
        state.advance(int(t), "\n" in text)
    return texts, keys


def _apply(policy, live: _Live, gen: Generation, key: NoiseKey, key_mode: str = "line") -> bool:
    """Step the env with a generated turn and record it; returns whether the episode is over."""
    texts, keys = token_keys(policy, gen.token_ids, key, key_mode, live.token_counter, live.context)
    if gen.choice is not None:  # chosen, not sampled: its tokens read no token keys
        keys = []
    t0 = time.perf_counter()
    obs, reward, terminated, truncated, info = live.env.step(gen.text)
    TIMING["env_seconds"] += time.perf_counter() - t0
    over = bool(terminated or truncated)
    if not over and live.env.turn >= live.turn_cap:
        truncated = over = True
    obs_ids = [] if over else observation_ids(policy.tokenizer, obs)
    live.record.turns.append(
        TurnRecord(
            token_ids=list(gen.token_ids),
            logprobs=[float(x) for x in gen.logprobs],
            text=gen.text,
            noise_key=NoiseKey(*key.base()),
            obs=obs,
            obs_token_ids=obs_ids,
            reward=float(reward),
            digest=info.get("digest", ""),
            entropy=float(gen.entropy),
            invalid=bool(info.get("invalid", False)),
            token_texts=texts,
            token_keys=keys,
            choice=gen.choice,
        )
    )
    _advance(live, gen.token_ids, obs_ids)
    if over:
        _finish(live, info, terminated, truncated)
    return over


def _advance(live: _Live, token_ids, obs_ids) -> None:
    """The context after the turn just recorded."""
    if live.record.window is None:
        live.context += list(token_ids) + list(obs_ids)
    else:
        live.context = turn_context(live.record, len(live.record.turns))
    live.token_counter += len(token_ids)


def generate_in_batches(policy, requests: Sequence[GenerationRequest], sampling: SamplingConfig, batch_size: int,
                        *, by_length: bool = True) -> list[Generation]:
    """One turn for every request, in calls of at most ``batch_size`` rows; the turns come back in request order.

    ``by_length`` (default) fills each call with contexts of similar lengths (shortest first, ties in
    request order): a call pads every row to its longest context and decodes until its longest turn
    ends, so a call that mixes a 50-token first prompt with a 1,500-token late context pays for the
    long one on every row. Each row's sample is keyed by its own noise key, so the grouping changes
    the cost, not which tokens are drawn (``twice bench rollout`` measures both orders).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = list(range(len(requests)))
    if by_length:
        order.sort(key=lambda i: len(requests[i].prompt_ids))
    out: list[Optional[Generation]] = [None] * len(requests)
    for start in range(0, len(order), batch_size):
        rows = order[start: start + batch_size]
        t0 = time.perf_counter()
        gens = policy.generate([requests[i] for i in rows], sampling)
        TIMING["generate_seconds"] += time.perf_counter() - t0
        for i, g in zip(rows, gens):
            out[i] = g
    return out  # type: ignore[return-value]


def _run(policy, live: list[_Live], sampling: SamplingConfig, batch_size: int, by_length: bool = True,
         progress: Optional[Callable[[int], None]] = None) -> None:
    """Generate and step every live episode until all are over (:func:`generate_in_batches` per step);
    ``progress(done)`` is called with the episodes over so far after each step."""
    active = [x for x in live if not x.env.done]
    for x in live:
        if x.env.done and x.record.trajectory is None:
            _finish(x, dict(x.env.last_info), x.env.trajectory.terminated, x.env.trajectory.truncated)
    key_mode = getattr(sampling, "key_mode", "line")
    chooses = getattr(policy, "chooses", False)
    while active:
        keys = [NoiseKey(*x.env.last_info.get("noise_key", x.env.noise_key())) for x in active]
        reqs = [GenerationRequest(list(x.context), k, x.stop, x.token_counter,
                                  turn_candidates(x.env) if chooses else None) for x, k in zip(active, keys)]
        gens = generate_in_batches(policy, reqs, sampling, batch_size, by_length=by_length)
        active = [x for x, g, k in zip(active, gens, keys) if not _apply(policy, x, g, k, key_mode)]
        if progress is not None:
            progress(len(live) - len(active))


def _make_env(env_id: str, env_kwargs: Optional[dict]):
    return twice_envs.make(env_id, **(env_kwargs or {}))


def rollout(policy, env_id: str, tasks: Sequence[Task], *, group_size: int, sampling: SamplingConfig,
            env_kwargs: Optional[dict] = None, noise_seed: int = 0, max_turns: Optional[int] = None,
            system: Optional[str] = None, batch_size: int = 64, window: Optional[int] = None,
            by_length: bool = True, progress: Optional[Callable[[int], None]] = None) -> list[EpisodeRecord]:
    """Run ``group_size`` episodes of every task; returns the records in group order.

    Episode ``j`` of group ``g`` gets the episode seed :func:`episode_noise_seed`
    ``(noise_seed, g, j)``, passed as the reset option ``noise_seed``; its record has
    ``group = g``. ``max_turns`` caps the turns (the env's own limit applies too).
    Generation is batched across all live episodes (``batch_size`` rows per call, grouped by context
    length unless ``by_length`` is False: :func:`generate_in_batches`).
    ``window``: turns of history in the model's context (None: the whole episode); the
    first prompt, which holds the task, is always kept. ``progress(done)``, if given, is called
    with the number of episodes over so far after each generation step.
    """
    window = check_window(window)
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    live: list[_Live] = []
    for g, task in enumerate(tasks):
        if not isinstance(task, Task):
            task = Task(*task) if isinstance(task, (tuple, list)) else Task(int(task))
        for j in range(group_size):
            env = _make_env(env_id, env_kwargs)
            options = dict(task.options)
            options["noise_seed"] = episode_noise_seed(noise_seed, g, j)
            obs, info = env.reset(seed=int(task.seed), options=options)
            cap = env.unwrapped.max_turns if hasattr(env.unwrapped, "max_turns") else 50
            if max_turns is not None:
                cap = min(cap, int(max_turns))
            prompt = initial_prompt_ids(policy.tokenizer, obs, system)
            rec = EpisodeRecord(env_id=env.unwrapped.env_id, seed=int(task.seed), options=dict(task.options), group=g,
                                prompt_ids=list(prompt), window=window)
            live.append(_Live(env, rec, list(prompt), cap, 0, tuple(env.unwrapped.protocol().stop)))
    _run(policy, live, sampling, batch_size, by_length, progress)
    return [x.record for x in live]


def _factual_context(ep: EpisodeRecord, turn: int) -> tuple[list[int], int]:
    """The context before ``turn`` and the tokens generated before it."""
    return turn_context(ep, turn), sum(len(t.token_ids) for t in ep.turns[:turn])


@torch.no_grad()
def score_tokens(policy, context: Sequence[int], tokens: Sequence[int], sampling: SamplingConfig) -> tuple[list[float], float]:
    """Log-probs of ``tokens`` after ``context`` under the sampling distribution, and the mean entropy."""
    ids = torch.tensor([list(context) + list(tokens)], dtype=torch.long, device=policy.device)
    logits = policy.model(input_ids=ids).logits[0, len(context) - 1: -1]
    logp = sampling_logprobs(logits.double(), sampling.temperature, sampling.top_p)
    p = logp.exp()
    ent = -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1)
    lp = logp.gather(-1, torch.tensor(list(tokens), device=logp.device)[:, None]).squeeze(-1)
    return lp.tolist(), float(ent.mean()) if len(tokens) else 0.0


@dataclass
class TwinStart:
    """A twin after its alternative turn (see :func:`start_twins`).

    Attributes:
        record: the twin's record so far (complete when ``live`` is None).
        live: the twin env and context to continue; None for a self-twin or a twin
            whose alternative turn ended the episode (its outcome is already known).
    """

    record: EpisodeRecord
    live: Optional[_Live] = None

    @property
    def done(self) -> bool:
        return self.live is None


def start_twins(policy, factual: Sequence[EpisodeRecord], requests: Sequence[BranchRequest], *,
                sampling: SamplingConfig, batch_size: int = 64, detect_self_twins: bool = True,
                by_length: bool = True) -> list[TwinStart]:
    """Phase 1 of :func:`branch_rollouts`: every request's alternative turn, sampled and stepped.

    Returns one :class:`TwinStart` per request, in request order; :func:`finish_twins`
    continues the ones still live (all of them, or those an evidence coin keeps).
    """
    prepared = []
    alt_reqs: list[tuple[int, GenerationRequest]] = []
    for i, r in enumerate(requests):
        if not 0 <= r.episode < len(factual):
            raise IndexError(f"request {i}: episode {r.episode} is not in the factual list ({len(factual)} episodes)")
        ep = factual[r.episode]
        if ep.trajectory is None:
            raise ValueError(f"request {i}: the factual episode has no trajectory record")
        if not 0 <= r.turn < len(ep.turns):
            raise ValueError(f"request {i}: turn {r.turn} is outside the factual episode ({len(ep.turns)} turns)")
        if r.branch < 1:
            raise ValueError(f"request {i}: branch must be >= 1 (0 is the factual episode), got {r.branch}")
        if not r.coupled and r.noise_seed is None:
            raise ValueError(f"request {i}: an independent twin (coupled=False) needs a fresh noise_seed")
        if r.action is not None and r.alternative is not None:
            raise ValueError(f"request {i}: give either action (text) or alternative (a sampled turn), not both")
        schedule = NoiseSchedule.from_json(ep.trajectory["noise"])
        seed = schedule.episode_seed if r.coupled else int(r.noise_seed)
        env = twice_envs.replay(ep.trajectory, turn=r.turn, trusted=True)
        ctx, counter = _factual_context(ep, r.turn)
        key = NoiseKey(seed, r.turn, r.branch)
        stop = tuple(env.protocol().stop)
        prepared.append((r, ep, env, ctx, counter, key, stop, schedule))
        if r.action is None and r.alternative is None:
            cands = turn_candidates(env) if getattr(policy, "chooses", False) else None
            alt_reqs.append((i, GenerationRequest(ctx, key, stop, counter, cands)))

    gens = generate_in_batches(policy, [q for _, q in alt_reqs], sampling, batch_size, by_length=by_length)
    alternatives: dict[int, Generation] = {i: g for (i, _), g in zip(alt_reqs, gens)}
    for i, (r, ep, env, ctx, counter, key, stop, schedule) in enumerate(prepared):
        if r.alternative is not None:
            alternatives[i] = r.alternative
        elif r.action is not None:
            toks = list(policy.tokenizer.encode(r.action, add_special_tokens=False))
            if toks and getattr(policy, "model", None) is not None:
                lp, ent = score_tokens(policy, ctx, toks, sampling)
            else:  # a remote policy (vLLM, verl's server) holds no local weights to score with
                lp, ent = [0.0] * len(toks), 0.0
            alternatives[i] = Generation(r.action, toks, lp, ent, "forced")

    out: list[TwinStart] = []
    for i, (r, ep, env, ctx, counter, key, stop, schedule) in enumerate(prepared):
        alt = alternatives[i]
        prompt, history = twin_prefix(ep, r.turn)
        rec = EpisodeRecord(env_id=ep.env_id, seed=ep.seed, options=dict(ep.options), group=ep.group, prompt_ids=prompt,
                            twin_of=(r.episode, r.turn), branch=r.branch, coupled=r.coupled, window=ep.window,
                            history=history)
        cap = int(ep.info.get("turn_cap", len(ep.turns) if ep.truncated else 10**9))
        fact = ep.turns[r.turn]
        texts, keys = token_keys(policy, alt.token_ids, key, getattr(sampling, "key_mode", "line"), counter, ctx)
        keys = [] if alt.choice is not None else keys  # a chosen turn's tokens read no token keys
        # the same tokens are the same sample; equal text from other tokens is not
        if detect_self_twins and r.coupled and list(alt.token_ids) == list(fact.token_ids):
            rec.self_twin = True
            rec.turns = [TurnRecord(list(alt.token_ids), list(alt.logprobs), alt.text, key, fact.obs,
                                    list(fact.obs_token_ids), fact.reward, fact.digest, alt.entropy, fact.invalid,
                                    texts, keys, alt.choice)]
            rec.utility = ep.utility
            rec.trajectory = ep.trajectory
            rec.terminated, rec.truncated = ep.terminated, ep.truncated
            rec.info = dict(ep.info)
            out.append(TwinStart(rec))
            continue
        t0 = time.perf_counter()
        tw = twin(env, alt.text, schedule if r.coupled else int(r.noise_seed), branch=r.branch)
        TIMING["env_seconds"] += time.perf_counter() - t0
        obs, reward, terminated, truncated, info = tw.first_step
        x = _Live(tw, rec, list(ctx), cap, counter, stop)
        over = bool(terminated or truncated) or tw.turn >= cap
        if over and not (terminated or truncated):
            truncated = True
        rec.same_evidence = same_evidence(ep, r.turn, obs, over)
        obs_ids = [] if over else observation_ids(policy.tokenizer, obs)
        rec.turns.append(TurnRecord(list(alt.token_ids), [float(v) for v in alt.logprobs], alt.text, key, obs, obs_ids,
                                    float(reward), info.get("digest", ""), float(alt.entropy),
                                    bool(info.get("invalid", False)), texts, keys, alt.choice))
        _advance(x, alt.token_ids, obs_ids)
        if over:
            _finish(x, info, terminated, truncated)
            out.append(TwinStart(rec))
        else:
            out.append(TwinStart(rec, x))
    return out


def finish_twins(policy, starts: Sequence[TwinStart], *, sampling: SamplingConfig, batch_size: int = 64,
                 by_length: bool = True) -> None:
    """Phase 2 of :func:`branch_rollouts`: continue every live twin of ``starts`` to its end
    (batched; the records are completed in place and the starts marked done)."""
    live = [s.live for s in starts if s.live is not None]
    _run(policy, live, sampling, batch_size, by_length)
    for s in starts:
        s.live = None


def branch_rollouts(policy, factual: Sequence[EpisodeRecord], requests: Sequence[BranchRequest], *,
                    sampling: SamplingConfig, batch_size: int = 64, detect_self_twins: bool = True,
                    by_length: bool = True) -> list[EpisodeRecord]:
    """Twins of factual episodes (one record per request, in request order).

    For each request: rebuild the factual env at turn ``t`` (replay, verified against the
    digest chain), sample the alternative turn with key ``(seed, t, branch)`` (or take
    the request's ``alternative`` token ids, or its ``action`` text), and

    * **self-twin** (coupled, alternative token ids == factual token ids): the twin is the
      factual episode; the record has ``self_twin=True``, the factual utility and only the
      alternative turn; nothing is continued;
    * otherwise step the alternative through :func:`twice_envs.wrappers.twin`
      (``same_evidence`` as :func:`same_evidence` says) and continue
      with the keys the twin env reports: the factual keys when coupled, a fresh
      ``noise_seed`` when not. A twin never runs past the factual episode's turn cap.

    Records have ``twin_of=(episode, t)``, ``branch``, ``coupled``, ``prompt_ids`` = the
    context before turn ``t`` and ``turns`` from ``t`` on; ``utility`` is the twin
    trajectory's total reward (comparable to the factual ``utility``).
    The env is rebuilt from the factual record's own kwargs. ``detect_self_twins=False``
    continues self-twins too (to verify that they reproduce the factual episode).
    """
    starts = start_twins(policy, factual, requests, sampling=sampling, batch_size=batch_size,
                         detect_self_twins=detect_self_twins, by_length=by_length)
    finish_twins(policy, starts, sampling=sampling, batch_size=batch_size, by_length=by_length)
    return [s.record for s in starts]
