"""Fork, twin and restore over the wire: a proposed extension of OpenEnv's session protocol.

Each call opens a session the ordinary way, with a reset that names where its episode comes from
instead of a seed; nothing else in the protocol changes, and a client that never sends these
fields never sees them:

* ``{"fork": {"session": S, "turn": t}}`` -- the episode of session ``S`` as it was after ``t``
  actions (default: now), by ``env.fork(t)``: snapshot or replay, verified either way.
* ``{"twin": {"session": S, "turn": t, "action": a, "branch": k}}`` -- the fork at ``t`` with the
  alternative action ``a`` taken as branch ``k >= 1`` of ``S``'s noise schedule, so every later
  turn reports ``S``'s noise key (``twin_step``); the reply is the observation after ``a``.
* ``{"restore": record}`` -- the episode of a record (``export``: the ``record`` field of
  ``state``), rebuilt by validated replay: every turn's digest is checked, and a record from
  another env, other kwargs, another env version, or one that was edited is refused, naming what
  differs.

``S`` is a session's handle (``state``'s ``session`` field): a random name that only the session's
own client learns. Forking reads the other session's env under its lock, so a fork never sees a
half-taken step.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Optional

import twice_envs
from twice_envs.core import TextEnv, twin_step
from twice_envs.errors import TrajectoryFormatError, TwiceError
from twice_envs.trajectory import Trajectory

#: The keys of the fork and twin requests.
SOURCES = {"fork": ("session", "turn"), "twin": ("session", "turn", "action", "branch")}


class ExtensionError(TwiceError, ValueError):
    """A fork, twin or restore request that cannot be carried out (the message names why)."""


class Sessions:
    """The live sessions of one server, by handle (weakly held: a closed session drops out).

    A session is a :class:`~.environment.TwiceEnvironment` (which imports this module): what this
    module reads of it is its ``lock``, its ``env``, and its class's ``sessions``, ``env_id`` and
    ``env_kwargs``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()

    def add(self, handle: str, session: Any) -> None:
        with self._lock:
            self._live[handle] = session

    def remove(self, handle: str) -> None:
        with self._lock:
            self._live.pop(handle, None)

    def get(self, handle: Any) -> Any:
        with self._lock:
            session = self._live.get(handle) if isinstance(handle, str) else None
        if session is None:
            raise ExtensionError(f"unknown session {handle!r:.80}: it has ended, or it is not a session of this server")
        return session


def _fields(source: str, spec: Any) -> dict:
    keys = SOURCES[source]
    if not isinstance(spec, dict):
        raise ExtensionError(f"{source} takes an object with {', '.join(keys)}, got {type(spec).__name__}")
    unknown = sorted(set(spec) - set(keys))
    if unknown:
        raise ExtensionError(f"unknown {source} fields {unknown}; {source} takes {', '.join(keys)}")
    if "session" not in spec:
        raise ExtensionError(f"{source} needs the 'session' whose episode it starts from (state's 'session' field)")
    return spec


def _fork(sessions: Sessions, source: str, spec: dict) -> tuple[TextEnv, Any]:
    """``(fork, parent's noise schedule)`` of the named session's episode at ``spec["turn"]``."""
    parent = sessions.get(spec["session"])
    with parent.lock:
        env = parent.env
        if env is None or env._traj is None:
            raise ExtensionError(f"session {spec['session']!r} has no episode to {source} yet (it was never reset)")
        try:
            return env.fork(spec.get("turn")), env.noise_schedule
        except (TypeError, ValueError) as exc:
            raise ExtensionError(f"{source} refused: {exc}") from None


def fork(sessions: Sessions, spec: Any) -> TextEnv:
    """The env of a ``fork`` request."""
    return _fork(sessions, "fork", _fields("fork", spec))[0]


def twin(sessions: Sessions, spec: Any) -> tuple[TextEnv, tuple]:
    """The env of a ``twin`` request and the 5-tuple of its alternative step."""
    spec = _fields("twin", spec)
    action = spec.get("action")
    if not isinstance(action, str):
        raise ExtensionError(f"twin needs the alternative 'action' as text, got {type(action).__name__}")
    env, schedule = _fork(sessions, "twin", spec)
    if env.done:
        raise ExtensionError(f"twin refused: the episode is over at turn {env.turn}; a twin replaces an action it took")
    try:
        _, result = twin_step(env, action, schedule, branch=spec.get("branch", 1))
    except (TypeError, ValueError) as exc:
        raise ExtensionError(f"twin refused: {exc}") from None
    return env, result


def restore(env_id: str, env_kwargs: dict, record: Any) -> TextEnv:
    """The env of a ``restore`` request: ``record`` replayed and verified turn by turn.

    The record must come from this server's env id with its kwargs (so a record never chooses
    what the server opens); its own digest chain, its env version and every replayed turn are
    checked by :func:`twice_envs.replay`.
    """
    try:
        parsed = Trajectory.from_json(record, where="the restore record")
    except TrajectoryFormatError as exc:
        raise ExtensionError(f"restore refused: {exc}") from None
    if parsed.env_id != env_id:
        raise ExtensionError(f"restore refused: the record's env_id is {parsed.env_id!r}; this server runs {env_id!r}")
    served = {**twice_envs.spec(env_id).kwargs, **env_kwargs}
    if parsed.kwargs != served:
        keys = sorted(k for k in set(parsed.kwargs) | set(served) if parsed.kwargs.get(k) != served.get(k))
        raise ExtensionError(f"restore refused: the record's kwargs differ from this server's in {keys}")
    try:  # the kwargs are the server's own (checked above), so the record names no path of its choosing
        return twice_envs.replay(parsed, trusted=True)
    except TwiceError as exc:
        field = getattr(exc, "field", None)
        raise ExtensionError(f"restore refused{f' ({field})' if field else ''}: {exc}") from None


def _open_fork(session: Any, spec: Any) -> tuple:
    env = fork(session.sessions, spec)
    return env, env.trajectory.observations[-1], None, env.last_info


def _open_twin(session: Any, spec: Any) -> tuple:
    env, (text, reward, _, _, info) = twin(session.sessions, spec)
    return env, text, float(reward), info


def _open_restore(session: Any, spec: Any) -> tuple:
    env = restore(session.env_id, session.env_kwargs, spec)
    return env, env.trajectory.observations[-1], None, env.last_info


#: How each reset field opens its episode: ``(session, spec) -> (env, text, reward or None, info)``.
OPENERS = {"fork": _open_fork, "twin": _open_twin, "restore": _open_restore}


def source_of(fields: dict) -> Optional[str]:
    """Which of fork / twin / restore a reset names (``None``: a plain reset); two at once are refused."""
    named = [name for name in OPENERS if fields.get(name) is not None]
    if len(named) > 1:
        raise ExtensionError(f"a reset starts from one episode, but names {' and '.join(named)}")
    return named[0] if named else None


def open_episode(source: str, session: Any, spec: Any) -> tuple:
    """``(env, text, reward, info)`` of the episode a ``fork`` / ``twin`` / ``restore`` reset names."""
    return OPENERS[source](session, spec)
