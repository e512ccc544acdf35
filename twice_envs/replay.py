"""Rebuild an env from a saved trajectory record.

A record is data from anywhere, and its ``kwargs`` go to ``make()``. Kwargs that name
files or folders (a journal, a corpus, question or product files, data folders,
caches) would let a record choose where the env reads and writes, so :func:`replay`
passes them on only with the user's consent: ``trusted=True`` (the record is yours),
or ``overrides`` that name the paths yourself. Journals opened during a replay are
read-only: a replay never creates or changes a journal file.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from twice_envs.errors import ReplayDivergence, TrajectoryFormatError, TwiceError
from twice_envs.trajectory import Trajectory, reset_digest, step_digest

#: Kwarg names that name files or folders in any env.
PATH_NAMES = ("journal", "corpus", "questions", "products", "data", "cache", "path", "dir", "root")
#: Kwarg name endings that name files or folders in any env.
PATH_SUFFIXES = ("_path", "_paths", "_dir", "_dirs", "_root", "_file", "_files", "_folder", "_journal", "_cache")


def path_kwargs(env_id: str, kwargs: Mapping[str, Any]) -> list[str]:
    """The kwargs of a record for ``env_id`` that name files or folders and need consent.

    A kwarg needs consent when its name is a path name (:data:`PATH_NAMES`, an ending
    in :data:`PATH_SUFFIXES`, or the env class's ``path_kwargs``), it is not ``None``,
    and it differs from the value the env's registration gives it (a path the
    installed code chose is not the record's choice).
    """
    from twice_envs.registry import entry_point, registry

    spec = registry[env_id]
    declared = tuple(getattr(entry_point(spec), "path_kwargs", ()))
    defaults = spec.kwargs or {}
    out = []
    for name, value in kwargs.items():
        if value is None or (name in defaults and defaults[name] == value):
            continue
        lowered = name.lower()
        if name in declared or lowered in PATH_NAMES or lowered.endswith(PATH_SUFFIXES):
            out.append(name)
    return sorted(out)


def _rebased(record: Trajectory, kwargs: dict) -> Trajectory:
    """``record`` as if made with ``kwargs``: same content, digest chain recomputed.

    Used with ``overrides``: the replay then checks that the env made with the user's
    paths reproduces the record's observations and rewards, turn by turn.
    """
    digests = [
        reset_digest(record.env_id, record.env_version, kwargs, record.seed, record.options, record.observations[0])
    ]
    for a, o, r in zip(record.actions, record.observations[1:], record.rewards):
        digests.append(step_digest(digests[-1], a, o, r))
    return Trajectory(
        record.env_id, record.env_version, dict(kwargs), record.seed, dict(record.options), dict(record.noise),
        list(record.actions), list(record.observations), list(record.rewards), digests,
        record.terminated, record.truncated, dict(record.meta),
    )


def replay(
    record: Trajectory | dict,
    turn: Optional[int] = None,
    *,
    trusted: bool = False,
    overrides: Optional[Mapping[str, Any]] = None,
) -> "TextEnv":  # noqa: F821
    """Re-create the env of ``record`` and re-apply its first ``turn`` actions (default: all).

    Every step is checked against the record's digest chain; the first mismatch raises
    :class:`ReplayDivergence` naming the turn. A record from another env version raises
    too (the fix: install the version that recorded it, or re-record).

    Args:
        record: a :class:`Trajectory` or its JSON dict.
        turn: replay only the first ``turn`` actions.
        trusted: pass the record's file and folder kwargs (journal, corpus, data
            folders, caches) to ``make`` as they are. Without it a record that names
            any raises :class:`TwiceError` listing them.
        overrides: kwargs that replace the record's (e.g. your own corpus path, or
            ``journal=None``); a path named here is your choice, so it needs no
            ``trusted``. The replay then verifies that the record's observations and
            rewards come out again with these kwargs, and the env records them.
    """
    from twice_envs.registry import make, registry
    from twice_envs.tools import read_only_journals

    if isinstance(record, dict):
        record = Trajectory.from_json(record)
    record.check_chain()
    if record.env_id not in registry:
        raise TrajectoryFormatError(
            f"the record is from env {record.env_id!r}, which is not registered here; "
            "import the module that registers it first"
        )
    overrides = dict(overrides or {})
    kwargs = {**record.kwargs, **overrides}
    if not trusted:
        named = [k for k in path_kwargs(record.env_id, record.kwargs) if k not in overrides]
        if named:
            shown = ", ".join(f"{k}={record.kwargs[k]!r}" for k in named)
            raise TwiceError(
                f"the record names files or folders in its kwargs ({shown}); a replay would read and write "
                "where the record says. If the record is yours, consent with replay(record, trusted=True) "
                "(`twice replay --trust-kwargs`), or name the paths yourself with "
                f"replay(record, overrides={{{', '.join(repr(k) + ': ...' for k in named)}}})."
            )
    if overrides:
        record = _rebased(record, kwargs)
    with read_only_journals():
        env = make(record.env_id, **kwargs)
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


def first_divergence(record: Trajectory | dict, *, trusted: bool = False) -> Optional[ReplayDivergence]:
    """Replay the whole record; return the divergence, or ``None`` if it replays exactly."""
    try:
        replay(record, trusted=trusted)
    except ReplayDivergence as exc:
        return exc
    return None
