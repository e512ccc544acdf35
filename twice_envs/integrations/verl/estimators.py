"""verl advantage estimators for every registered credit method verl can serve (``register_adv_est``).

verl hands an estimator ``token_level_rewards`` and ``response_mask`` ``(B, T)``, the
group ``index`` (the prompt uid) and the algorithm ``config``. One row is one episode:
its response holds every turn and observation, and its reward (the episode utility)
sits on the last token. The per-turn facts credit needs travel in ``extra_fields``
(one dict per row), which only the ``twice_envs`` trainer (:mod:`.trainer`) passes on:
the agent loop (:mod:`.agent_loop`) writes the episode's own facts and the trainer's
twin phase (:mod:`.twin_phase`) adds each row's credit:

* ``twice_turn_of_token``: the turn of each response token (-1 on observations);
* ``twice_turn_rewards``, ``twice_turn_invalid``, ``twice_anchors``, ``twice_env_id``: the per-turn
  rewards, invalid flags and observations (methods that need ``anchor_groups``, e.g. GiGPO);
* ``twice_turn_credit``: each turn's advantage from the twin phase (methods that ask for rollouts).

Which estimator a method gets follows from its registration alone (:func:`estimators`):

* a method that asks for no rollouts (GRPO, GiGPO): :func:`step_advantages`, its credit phase on the
  episodes rebuilt from the rows;
* a method whose requests verl's rollout server can run (:data:`VERL_NEEDS`: twins, independent
  counterfactuals, value rollouts; Twice, CRR, VinePPO): :func:`phase_advantages`, the advantages the
  trainer's twin phase computed with the method's two phases;
* any other (a critic, the gold answer's probabilities, exact advantages, further factual episodes, a
  batch of another size than ``rollout.n``) is not offered.

A method's settings come from ``algorithm.<prefix>`` in verl's config: the field names of its config
class, the prefix of its ``twice train`` flags (``algorithm.twice.beta`` for Twice and CRR,
``algorithm.gigpo.omega``; :func:`method_settings`).
"""

from __future__ import annotations

import functools
from dataclasses import fields, replace
from typing import Any, Optional, Sequence

import numpy as np

from twice_envs.agents.credit.registry import (
    FORK_NEEDS,
    CreditContext,
    CreditMethod,
    get_method,
    methods,
    run_credit,
)
from twice_envs.agents.credit.settings import flag_prefix
from twice_envs.agents.types import EpisodeRecord, TurnRecord
from twice_envs.integrations.episodes import token_advantages
from twice_envs.keys import NoiseKey

#: The needs verl can serve: rollouts its server runs in the twin phase, and the rows' own observations.
VERL_NEEDS = frozenset({"twins", "counterfactuals", "values", "anchor_groups"})

#: ``extra_fields`` keys the agent loop writes and the estimators read.
TURN_OF_TOKEN = "twice_turn_of_token"
TURN_REWARDS = "twice_turn_rewards"
TURN_INVALID = "twice_turn_invalid"
ANCHORS = "twice_anchors"
ENV_ID = "twice_env_id"
#: ``extra_fields`` keys the agent loop writes for the trainer's twin phase.
EPISODE = "twice_episode"
"""The factual :class:`EpisodeRecord` as JSON (token ids, trajectory, noise schedule)."""
SAMPLING = "twice_sampling"
"""The :class:`SamplingConfig` the episode was played with (its twins sample the same way)."""
NOISE_SEED = "twice_noise_seed"
"""The episode's noise seed (as text)."""
#: ``extra_fields`` key the trainer's twin phase adds: each turn's advantage.
TURN_CREDIT = "twice_turn_credit"


def _section(config: Any, name: str) -> dict:
    if config is None:
        return {}
    sub = config.get(name, None) if hasattr(config, "get") else getattr(config, name, None)
    if sub is None:
        return {}
    return {k: sub[k] for k in sub} if hasattr(sub, "keys") else dict(vars(sub))


def settings(cls, config: Any, name: str, base=None):
    """``base`` (default ``cls()``) with the fields set under ``config.<name>``; unknown keys are an error."""
    given = _section(config, name)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ValueError(f"algorithm.{name}: unknown settings {unknown} (known: {sorted(known)})")
    return replace(base if base is not None else cls(), **given)


def _groups(index: Optional[Sequence]) -> list[int]:
    """Group ids in order of first appearance (verl's uids are strings)."""
    if index is None:
        raise ValueError("a group estimator needs verl's index (the prompt uid)")
    seen: dict = {}
    return [seen.setdefault(u, len(seen)) for u in list(index)]


def _rows(token_level_rewards, response_mask, extra_fields):
    rewards = np.asarray(token_level_rewards.detach().cpu().double())
    mask = np.asarray(response_mask.detach().cpu())
    B, T = mask.shape
    if extra_fields is not None and len(extra_fields) != B:
        raise ValueError(f"{len(extra_fields)} extra_fields for a batch of {B} rows")
    turn_of = []
    for b in range(B):
        ef = extra_fields[b] if extra_fields is not None else None
        if ef is not None and ef.get(TURN_OF_TOKEN) is not None:
            row = [int(x) for x in ef[TURN_OF_TOKEN]][:T]
            turn_of.append(row + [-1] * (T - len(row)))
        else:  # the whole response is one turn
            turn_of.append([0 if m else -1 for m in mask[b]])
    return rewards.sum(axis=1), mask, turn_of


def _num_turns(turn_of: list[int], ef: dict) -> int:
    """The episode's turns: those with tokens in the response, or all of them when the row lists
    per-turn facts (a response cut at ``rollout.response_length`` can hide the last turns)."""
    seen = max(turn_of) + 1 if turn_of else 0
    return max(seen, len(ef.get(TURN_REWARDS) or []))


def _episodes(utilities, groups, turn_of, extra_fields, *, with_steps: bool = False) -> list[EpisodeRecord]:
    out = []
    for b, (u, g) in enumerate(zip(utilities, groups)):
        ef = extra_fields[b] if extra_fields is not None else {}
        n = _num_turns(turn_of[b], ef)
        turns = [TurnRecord([], [], "", NoiseKey(0, t, 0)) for t in range(n)]
        traj = None
        if with_steps:
            for key in (TURN_REWARDS, TURN_INVALID, ANCHORS):
                if len(ef.get(key) or []) != n:
                    raise ValueError(f"row {b}: extra_fields[{key!r}] needs one entry per turn ({n}); "
                                     "use the twice_envs agent loop with the twice_envs trainer")
            for t, turn in enumerate(turns):
                turn.reward = float(ef[TURN_REWARDS][t])
                turn.invalid = bool(ef[TURN_INVALID][t])
                turn.obs = str(ef[ANCHORS][t + 1]) if t + 1 < n else ""
            traj = {"observations": [str(ef[ANCHORS][0])]} if n else None
        out.append(EpisodeRecord(str(ef.get(ENV_ID) or ""), 0, {}, group=g, turns=turns, utility=float(u),
                                 trajectory=traj))
    return out


def _per_turn(extra_fields, b: int, key: str, n: int, default):
    """Row ``b``'s per-turn list under ``key`` (``n`` entries; ``[default] * n`` when absent)."""
    values = (extra_fields[b].get(key) if extra_fields is not None else None)
    if values is None:
        return [default] * n
    values = list(values)
    if len(values) != n:
        raise ValueError(f"row {b}: {len(values)} entries of {key!r} for {n} turns")
    return values


def _to_tensor(per_token: list[list[float]], like):
    import torch

    return torch.tensor(per_token, dtype=torch.float32, device=like.device)


def _spread(per_turn: Sequence, turn_of: list[list[int]], response_mask):
    """Per-turn advantages on each turn's tokens (0 on observations): ``(advantages, returns)``."""
    adv = _to_tensor([token_advantages(turn_of[b], per_turn[b]) for b in range(len(per_turn))], response_mask)
    adv = adv * response_mask.to(adv.dtype)
    return adv, adv


def served(method: CreditMethod) -> bool:
    """Whether verl can run ``method``: its needs within :data:`VERL_NEEDS`, and the factual batch verl samples
    (``rollout.n`` per prompt: no ``rollouts`` multiple, no tree ``roots``)."""
    return method.rollouts == 1 and method.roots is None and method.needs <= VERL_NEEDS


def runs_phase(name: str) -> bool:
    """Whether the estimator ``name`` is a registered method served by verl whose requests need the trainer's
    twin phase (rollouts through verl's server)."""
    return name in methods() and served(get_method(name)) and bool(get_method(name).needs & FORK_NEEDS)


def method_settings(method: CreditMethod, config: Any):
    """The method's settings from ``config.<prefix>`` (verl's ``algorithm`` section; the prefix of its
    ``twice train`` flags); None for a method without settings."""
    return None if method.config is None else settings(method.config, config, flag_prefix(method.config))


@functools.lru_cache(maxsize=None)
def step_advantages(method: CreditMethod):
    """A verl estimator for a registered method that asks for no rollouts: the method's credit phase on the
    episodes rebuilt from verl's rows, spread over each turn's tokens (one function per method, so
    registering twice finds the same one)."""
    with_steps = "anchor_groups" in method.needs

    def advantages(token_level_rewards, response_mask, index=None, config=None, *,
                   extra_fields: Optional[Sequence[dict]] = None, **kwargs):
        if with_steps and extra_fields is None:
            raise ValueError(f"the {method.name} estimator needs per-turn observations: run it with "
                             "trainer.v1.trainer_mode=twice_envs and the twice_envs agent loop")
        utilities, _, turn_of = _rows(token_level_rewards, response_mask, extra_fields)
        episodes = _episodes(utilities, _groups(index), turn_of, extra_fields, with_steps=with_steps)
        per_turn = run_credit(method, episodes, CreditContext(config=method_settings(method, config))).advantages
        return _spread(per_turn, turn_of, response_mask)

    advantages.__name__ = advantages.__qualname__ = f"{method.name}_advantages"
    return advantages


@functools.lru_cache(maxsize=None)
def phase_advantages(method: CreditMethod):
    """A verl estimator for a registered method that asks for rollouts: the per-turn advantages the trainer's
    twin phase computed with the method's two phases (``twice_turn_credit``), spread over each turn's tokens
    (0 on a row without it: the padding rows verl adds after the twin phase, whose response mask is 0)."""

    def advantages(token_level_rewards, response_mask, index=None, config=None, *,
                   extra_fields: Optional[Sequence[dict]] = None, **kwargs):
        if extra_fields is None or all(ef.get(TURN_CREDIT) is None for ef in extra_fields):
            raise ValueError(f"the {method.name} estimator needs the twin phase's per-turn credit: run it with "
                             "trainer.v1.trainer_mode=twice_envs and the twice_envs agent loop")
        utilities, _, turn_of = _rows(token_level_rewards, response_mask, extra_fields)
        episodes = _episodes(utilities, _groups(index), turn_of, extra_fields)
        per_turn = [_per_turn(extra_fields, b, TURN_CREDIT, len(ep.turns), 0.0) for b, ep in enumerate(episodes)]
        return _spread(per_turn, turn_of, response_mask)

    advantages.__name__ = advantages.__qualname__ = f"{method.name}_advantages"
    return advantages


def estimators() -> dict:
    """Estimator name -> function for every registered credit method verl can serve (:func:`served`):
    :func:`phase_advantages` for a method that asks for rollouts, :func:`step_advantages` for one that asks
    for none.

    A method registered with ``rollouts > 1`` (``grpo-2x``) is left out: its difference is the size of the
    factual batch, which verl chooses itself (``actor_rollout_ref.rollout.n``), not an estimator, so under
    verl it is its base method with ``rollout.n`` set to ``rollouts`` times the group size (GRPO (2x):
    ``algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=10``)."""
    out = {}
    for name in methods():
        m = get_method(name)
        if served(m):
            out[name] = phase_advantages(m) if m.needs & FORK_NEEDS else step_advantages(m)
    return out


def verl_estimators() -> dict:
    """:func:`estimators` less the names verl defines itself (``grpo``), which keep verl's own."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

    def native(name: str) -> bool:
        fn = ADV_ESTIMATOR_REGISTRY.get(name)
        return fn is not None and getattr(fn, "__module__", "").startswith("verl.")

    return {name: fn for name, fn in estimators().items() if not native(name)}


def register() -> None:
    """Register the estimators with verl (idempotent)."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

    for name, fn in verl_estimators().items():
        if ADV_ESTIMATOR_REGISTRY.get(name) is not fn:
            ADV_ESTIMATOR_REGISTRY.pop(name, None)
            register_adv_est(name)(fn)
