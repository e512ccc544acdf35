"""Rebuild an env from a saved trajectory record, checking every field the record holds.

What a replay checks, field by field:

* ``format``, the types of every field, the lengths of the lists and the noise block
  (:meth:`Trajectory.from_json`; a record built in code is checked the same way);
* ``digests``: the record's own chain first, recomputed from its fields before any env
  runs (:meth:`Trajectory.check_chain`), then every turn against the replayed env
  (``env_id``, ``env_version``, ``kwargs``, ``seed``, ``options`` and the first
  observation, the task a reader sees, are in ``digests[0]``; each action, observation
  and reward in its turn's);
* ``actions``: no more actions than the episode takes (none after it ended);
* ``terminated`` and ``truncated`` (a whole-record replay): the replayed episode must
  end exactly as the record says;
* ``noise``: a factual record (no ``branches``) must hold the ``episode_seed`` its reset
  gives (``options["noise_seed"]``, else the seed derived from ``seed``). A twin's record
  lists its branch turns, each inside the episode (before its end, and before the env's
  ``max_turns``); its ``episode_seed`` is the factual one (a coupled twin) or a fresh one
  (an independent twin), which came from the agent's run, not from the env, so no replay
  can check it: :func:`noise_kind` tells the three kinds apart, and ``twice replay`` says
  which each record is, so a factual record given a branch and another seed shows as an
  independent twin.
* ``meta`` is free-form data of the caller and is not checked.

A mismatch raises :class:`ReplayDivergence` (its ``field`` names a field other than the
digests); a malformed record raises :class:`TrajectoryFormatError` naming the field.

A record is data from anywhere, and its ``kwargs`` go to ``make()``. Kwargs that name
files or folders (a journal, a corpus, question or product files, data folders,
caches) would let a record choose where the env reads and writes, so :func:`replay`
passes them on only with the user's consent: ``trusted=True`` (the record is yours),
or ``overrides`` that name the paths yourself. Journals opened during a replay are
read-only: a replay never creates or changes a journal file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional

from twice_envs.errors import ReplayDivergence, TrajectoryFormatError, TwiceError
from twice_envs.keys import NoiseSchedule, derive_episode_seed
from twice_envs.registry import make, registry
from twice_envs.tools import read_only_journals
from twice_envs.trajectory import Trajectory, reset_digest, step_digest
from twice_envs.trust import PATH_NAMES, PATH_SUFFIXES, check_path_consent, path_kwargs  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from twice_envs.core import TextEnv


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
) -> TextEnv:
    """Re-create the env of ``record`` and re-apply its first ``turn`` actions (default: all).

    Every step is checked against the record's digest chain; the first mismatch raises
    :class:`ReplayDivergence` naming the turn. So do actions after the episode's end,
    ``terminated``/``truncated`` flags the replay does not end with (when all actions are
    replayed) and a factual record's noise seed that its reset does not give (see the
    module docstring). A malformed record raises :class:`TrajectoryFormatError` naming the
    field. A record from another env version raises too (the fix: install the version
    that recorded it, or re-record).

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
    # A Trajectory built in code gets the same field checks as one read from a file.
    record = Trajectory.from_json(record.to_json() if isinstance(record, Trajectory) else record)
    record.check_chain()
    if record.env_id not in registry:
        raise TrajectoryFormatError(
            f"the record is from env {record.env_id!r}, which is not registered here; "
            "import the module that registers it first"
        )
    overrides = dict(overrides or {})
    kwargs = {**record.kwargs, **overrides}
    check_path_consent(
        record.env_id, record.kwargs, source="the record", trusted=trusted, exempt=overrides,
        consent=lambda named: "If the record is yours, consent with replay(record, trusted=True) "
        "(`twice replay --trust-kwargs`), or name the paths yourself with "
        f"replay(record, overrides={{{', '.join(repr(k) + ': ...' for k in named)}}}).",
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
    _replay_checked(env, record, n)
    return env


def _replay_checked(env: TextEnv, record: Trajectory, n: int) -> None:
    """Reset ``env`` as ``record`` was, apply its first ``n`` actions and check every field."""
    env.reset(seed=record.seed, options=record.options)
    traj = env.trajectory
    if traj.digests[0] != record.digests[0]:
        raise ReplayDivergence(0, record.digests[0], traj.digests[0], "reset observation differs")
    _check_noise_seed(env.noise_schedule, record, getattr(env, "max_turns", None))
    for t in range(n):
        if env.done:
            _ended_early(record, t)
        env.step(record.actions[t])
        if traj.digests[t + 1] != record.digests[t + 1]:
            raise ReplayDivergence(t + 1, record.digests[t + 1], traj.digests[t + 1], f"after action {record.actions[t]!r}")
    if n < record.num_turns and env.done:
        _ended_early(record, n)
    if n == record.num_turns:
        for flag in ("terminated", "truncated"):
            recorded, replayed = getattr(record, flag), getattr(traj, flag)
            if recorded != replayed:
                raise ReplayDivergence(
                    n, record.digests[n], record.digests[n],
                    f"the record says {flag}={recorded}; the replay ended {flag}={replayed}", field=flag,
                )
    env.set_noise_schedule(record.noise)


def _ended_early(record: Trajectory, t: int) -> None:
    raise ReplayDivergence(
        t, record.digests[t], record.digests[t],
        f"the episode ended after {t} actions, but the record holds {record.num_turns} "
        f"(action {t + 1}, {record.actions[t]!r:.60}, comes after the end)",
        field="actions",
    )


def _check_noise_seed(factual: NoiseSchedule, record: Trajectory, max_turns: Optional[int]) -> None:
    """A factual record (no branches) holds the noise seed its reset gave: ``factual``'s. A twin's
    branch turns come before the env's ``max_turns`` (a finished record's, before its end: checked
    on loading)."""
    branches = record.noise.get("branches") or {}
    late = [t for t in branches if max_turns is not None and int(t) >= max_turns]
    if late:
        raise ReplayDivergence(
            0, record.digests[0], record.digests[0],
            f"the record's noise.branches names turn {late[0]}, past the end of any episode of this env "
            f"(max_turns={max_turns}, so branch turns are 0..{max_turns - 1})",
            field="noise.branches",
        )
    if branches:
        return  # a twin's record: its seed is the factual one or a fresh one (see noise_kind)
    seed = record.noise["episode_seed"]
    if seed == factual.episode_seed:
        return
    given = record.options.get("noise_seed")
    source = (
        f"its reset options['noise_seed'] = {given}" if given is not None
        else f"reset seed {record.seed} derives {factual.episode_seed}"
    )
    raise ReplayDivergence(
        0, record.digests[0], record.digests[0],
        f"the record's noise.episode_seed is {seed}, while {source} (a factual record, with no branches, "
        "holds the noise seed of its reset)",
        field="noise.episode_seed",
    )


def noise_kind(record: Trajectory) -> str:
    """What a record's noise block says it is: ``"factual"`` (no branches; a replay checks its
    seed), ``"coupled twin"`` (branches, the seed of its reset) or ``"independent twin"``
    (branches and another seed: a fresh one from the agent's run, which no replay can check)."""
    if not record.noise.get("branches"):
        return "factual"
    given = record.options.get("noise_seed")
    reset_seed = given if given is not None else derive_episode_seed(record.seed)
    return "coupled twin" if record.noise["episode_seed"] == reset_seed else "independent twin"


def first_divergence(record: Trajectory | dict, *, trusted: bool = False) -> Optional[ReplayDivergence]:
    """Replay the whole record; return the divergence, or ``None`` if it replays exactly.

    "Exactly" covers every field :func:`replay` checks: the digest chain, the end flags
    and the noise block. A malformed record raises :class:`TrajectoryFormatError`.
    """
    try:
        replay(record, trusted=trusted)
    except ReplayDivergence as exc:
        return exc
    return None
