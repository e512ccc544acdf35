"""Branching an episode, besides :meth:`TextEnv.fork <twice_envs.core.TextEnv.fork>` itself.

The turn a fork or twin is taken at (:func:`check_turn`), the digest a restored snapshot is
verified against (:func:`state_digest`), and a twin's alternative step (:func:`twin_step`).
All three stay importable from :mod:`twice_envs.core`.
"""

from __future__ import annotations

import hashlib
import io
import pickle
from typing import Any, Optional

import numpy as np

from twice_envs.keys import NoiseKey, NoiseSchedule
from twice_envs.trajectory import canonical_json


def state_digest(state: Any) -> Optional[str]:
    """What a restore of a :meth:`TextEnv._snapshot <twice_envs.core.TextEnv._snapshot>` value is verified against.

    ``None`` for an immutable (hashable) state: nothing can change it after the
    snapshot, so the restored state is compared with the snapshot value itself, which
    costs next to nothing. A mutable state (lists, dicts) is digested now, from its
    canonical JSON, or its pickle when it is not JSON data: a later change to it (a
    restore that shares it with the env, which then mutates it) shows up as a
    mismatch. Digests are compared only within one process.
    """
    try:
        hash(state)
        return None
    except TypeError:
        pass
    try:
        data = canonical_json(state).encode()
    except (TypeError, ValueError):
        data = _pickle_by_value(state)
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _pickle_by_value(state: Any) -> bytes:
    # Without the memo, an object reached twice is written twice: equal states give
    # equal bytes whether or not they share sub-objects (a restore may copy them).
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=4)
    pickler.fast = True
    try:
        pickler.dump(state)
    except (ValueError, RecursionError):  # a cyclic state: fall back to the memo
        return pickle.dumps(state, protocol=4)
    return buf.getvalue()


def check_turn(turn: Any, num_turns: int, what: str = "fork") -> int:
    """``turn`` as an int in ``0..num_turns`` (a turn of an episode with ``num_turns`` actions)."""
    if isinstance(turn, bool) or not isinstance(turn, (int, np.integer)):
        raise TypeError(f"{what}(turn) takes an int, got {type(turn).__name__} {turn!r}")
    if not 0 <= turn <= num_turns:
        raise ValueError(
            f"{what}({turn}) is outside this episode: it has {num_turns} actions, "
            f"so turn must be in 0..{num_turns}"
        )
    return int(turn)


def twin_step(
    env: Any, action: str, noise_keys: NoiseSchedule | int | dict, *, branch: int = 1
) -> tuple[NoiseKey, tuple]:
    """Take a twin's alternative ``action`` on ``env`` (at turn ``t``) as ``branch`` of ``noise_keys``.

    Binds ``noise_keys`` with turn ``t`` on ``branch``, so every later turn reports the
    factual key, then steps. Returns the alternative turn's key base and the step's
    5-tuple. :class:`twice_envs.wrappers.TwinEnv` wraps this; the checker uses it directly.
    """
    if isinstance(branch, bool) or not isinstance(branch, (int, np.integer)) or branch < 1:
        raise ValueError(f"a twin's branch must be an int >= 1 (0 is the factual episode), got {branch!r}")
    turn = env.turn
    bound = NoiseSchedule.coerce(noise_keys).with_branch(turn, int(branch))
    env.set_noise_schedule(bound)
    return bound.key(turn), env.step(action)
