"""Rebuild an env from a saved trajectory record."""

from __future__ import annotations

from typing import Optional

from twice_envs.errors import ReplayDivergence, TrajectoryFormatError, TwiceError
from twice_envs.trajectory import Trajectory


def replay(record: Trajectory | dict, turn: Optional[int] = None) -> "TextEnv":  # noqa: F821
    """Re-create the env of ``record`` and re-apply its first ``turn`` actions (default: all).

    Every step is checked against the record's digest chain; the first mismatch raises
    :class:`ReplayDivergence` naming the turn. A record from another env version raises
    too (the fix: install the version that recorded it, or re-record).
    """
    from twice_envs.registry import make, registry

    if isinstance(record, dict):
        record = Trajectory.from_json(record)
    record.check_chain()
    if record.env_id not in registry:
        raise TrajectoryFormatError(
            f"the record is from env {record.env_id!r}, which is not registered here; "
            "import the module that registers it first"
        )
    env = make(record.env_id, **record.kwargs)
    if str(env.version) != record.env_version:
        raise TwiceError(
            f"the record was made with {record.env_id} version {record.env_version}, but the installed env is "
            f"version {env.version}: its dynamics changed, so the record cannot be replayed exactly. "
            "Re-record the episode, or install the twice-envs release that recorded it."
        )
    n = record.num_turns if turn is None else turn
    if not 0 <= n <= record.num_turns:
        raise ValueError(f"turn must be in 0..{record.num_turns}, got {n}")
    env._replay_into(record, n)
    return env


def first_divergence(record: Trajectory | dict) -> Optional[ReplayDivergence]:
    """Replay the whole record; return the divergence, or ``None`` if it replays exactly."""
    try:
        replay(record)
    except ReplayDivergence as exc:
        return exc
    return None
