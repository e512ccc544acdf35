"""verl advantage estimators ``twice``, ``crr`` and ``gigpo`` (registered with ``register_adv_est``).

verl hands an estimator ``token_level_rewards`` and ``response_mask`` ``(B, T)``, the
group ``index`` (the prompt uid) and the algorithm ``config``. One row is one episode:
its response holds every turn and observation, and its reward (the episode utility)
sits on the last token. The per-turn facts credit needs travel from the agent loop
(:mod:`.agent_loop`) in ``extra_fields``, which only the trainer subclass
(:mod:`.trainer`) passes on (as ``extra_fields=``, one dict per row):

* ``twice_turn_of_token``: the turn of each response token (-1 on observations);
* ``twice_twin_credit``: the twin credit ``A_hat_t`` of each turn (0 where not branched);
* ``twice_turn_rewards``, ``twice_turn_invalid``, ``twice_anchors``: for GiGPO.

The advantages are the project's own estimators on these episodes
(:func:`twice_envs.agents.credit.twice.combine`, :func:`~twice_envs.agents.credit.gigpo.gigpo_credit`),
spread over each turn's tokens. Settings come from ``algorithm.twice`` and
``algorithm.gigpo`` in verl's config (field names of :class:`TwiceConfig` and
:class:`GiGPOConfig`); missing ones keep the published defaults. Without
``extra_fields`` (verl's stock trainer) ``twice`` and ``crr`` reduce to the
trajectory term (GRPO's group-normalised utility) and ``gigpo`` raises.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import fields, replace
from typing import Any, Optional, Sequence

import numpy as np

from twice_envs.agents.credit import gigpo, twice
from twice_envs.agents.credit.crr import crr_config
from twice_envs.agents.credit.registry import CreditContext, CreditMethod, get_method, methods
from twice_envs.agents.types import EpisodeRecord, TurnRecord
from twice_envs.integrations.episodes import token_advantages
from twice_envs.keys import NoiseKey

#: ``extra_fields`` keys the agent loop writes and the estimators read.
TURN_OF_TOKEN = "twice_turn_of_token"
TWIN_CREDIT = "twice_twin_credit"
TURN_REWARDS = "twice_turn_rewards"
TURN_INVALID = "twice_turn_invalid"
ANCHORS = "twice_anchors"


def _section(config: Any, name: str) -> dict:
    if config is None:
        return {}
    sub = config.get(name, None) if hasattr(config, "get") else getattr(config, name, None)
    if sub is None:
        return {}
    return {k: sub[k] for k in sub.keys()} if hasattr(sub, "keys") else dict(vars(sub))


def _settings(cls, config: Any, name: str, base=None):
    """``cls`` (a dataclass) with the fields set under ``config.<name>``; unknown keys are an error."""
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


def _episodes(utilities, groups, turn_of, extra_fields, *, with_steps: bool = False) -> list[EpisodeRecord]:
    out = []
    for b, (u, g) in enumerate(zip(utilities, groups)):
        n = max(turn_of[b]) + 1 if turn_of[b] else 0
        ef = extra_fields[b] if extra_fields is not None else {}
        turns = [TurnRecord([], [], "", NoiseKey(0, t, 0)) for t in range(max(n, 0))]
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
        out.append(EpisodeRecord("", 0, {}, group=g, turns=turns, utility=float(u), trajectory=traj))
    return out


def _to_tensor(per_token: list[list[float]], like):
    import torch

    return torch.tensor(per_token, dtype=torch.float32, device=like.device)


def _spread(per_turn: Sequence, turn_of: list[list[int]], response_mask):
    """Per-turn advantages on each turn's tokens (0 on observations): ``(advantages, returns)``."""
    adv = _to_tensor([token_advantages(turn_of[b], per_turn[b]) for b in range(len(per_turn))], response_mask)
    adv = adv * response_mask.to(adv.dtype)
    return adv, adv


def twin_advantages(token_level_rewards, response_mask, index=None, config=None, *,
                    extra_fields: Optional[Sequence[dict]] = None, crr: bool = False, **kwargs):
    """``A_t = A_traj + omega A_hat_t / sigma_hat`` on each turn's tokens; returns ``(advantages, returns)``."""
    cfg = _settings(twice.TwiceConfig, config, "twice")
    if crr:
        cfg = crr_config(cfg)
    utilities, mask, turn_of = _rows(token_level_rewards, response_mask, extra_fields)
    episodes = _episodes(utilities, _groups(index), turn_of, extra_fields)
    decisions, a_hat = [], []
    for b, ep in enumerate(episodes):
        credit = (extra_fields[b].get(TWIN_CREDIT) if extra_fields is not None else None) or [0.0] * len(ep.turns)
        if len(credit) != len(ep.turns):
            raise ValueError(f"row {b}: {len(credit)} twin credits for {len(ep.turns)} turns")
        for t in range(len(ep.turns)):
            decisions.append((b, t))
            a_hat.append(float(credit[t]))
    per_turn = twice.combine(episodes, decisions, np.asarray(a_hat, dtype=np.float64), cfg)
    return _spread(per_turn, turn_of, response_mask)


def crr_advantages(token_level_rewards, response_mask, index=None, config=None, **kwargs):
    """CRR: as :func:`twin_advantages`, with twins that were independent counterfactuals."""
    return twin_advantages(token_level_rewards, response_mask, index, config, crr=True, **kwargs)


def gigpo_advantages(token_level_rewards, response_mask, index=None, config=None, *,
                     extra_fields: Optional[Sequence[dict]] = None, **kwargs):
    """GiGPO ``A^E + omega A^S`` on each turn's tokens; needs the agent loop's per-turn fields."""
    if extra_fields is None:
        raise ValueError("the gigpo estimator needs per-turn rewards and anchor states: run it with "
                         "trainer.v1.trainer_mode=twice_envs and the twice_envs agent loop")
    cfg = _settings(gigpo.GiGPOConfig, config, "gigpo")
    utilities, mask, turn_of = _rows(token_level_rewards, response_mask, extra_fields)
    episodes = _episodes(utilities, _groups(index), turn_of, extra_fields, with_steps=True)
    per_turn = gigpo.gigpo_credit(episodes, cfg)
    return _spread(per_turn, turn_of, response_mask)


@functools.lru_cache(maxsize=None)
def step_advantages(method: CreditMethod):
    """A verl estimator for a registered method that needs no auxiliary rollouts: the method's
    own step on the episodes rebuilt from verl's rows, spread over each turn's tokens (one
    function per method, so registering twice finds the same one)."""
    with_steps = "anchor_groups" in method.needs

    def advantages(token_level_rewards, response_mask, index=None, config=None, *,
                   extra_fields: Optional[Sequence[dict]] = None, **kwargs):
        if with_steps and extra_fields is None:
            raise ValueError(f"the {method.name} estimator needs per-turn observations: run it with "
                             "trainer.v1.trainer_mode=twice_envs and the twice_envs agent loop")
        utilities, mask, turn_of = _rows(token_level_rewards, response_mask, extra_fields)
        episodes = _episodes(utilities, _groups(index), turn_of, extra_fields, with_steps=with_steps)
        per_turn = method(episodes, CreditContext()).advantages
        return _spread(per_turn, turn_of, response_mask)

    advantages.__name__ = advantages.__qualname__ = f"{method.name}_advantages"
    return advantages


def _entry_point(target: str):
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def estimators() -> dict:
    """Estimator name -> function for every registered credit method verl can run.

    A method that names its verl estimator (``verl=`` at registration) gets it; one that
    needs no auxiliary rollouts (at most anchor groups) is wrapped by :func:`step_advantages`;
    one that needs rollouts only the project's loop runs (VinePPO's value rollouts) is left out.
    """
    out = {}
    for name in methods():
        m = get_method(name)
        if m.verl:
            out[name] = _entry_point(m.verl)
        elif not (m.needs - {"anchor_groups"}):
            out[name] = step_advantages(m)
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
