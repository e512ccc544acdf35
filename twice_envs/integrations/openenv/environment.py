"""A registered twice env as an OpenEnv ``Environment``: one instance per session, one episode at a time.

:func:`environment_class` makes the class ``create_app`` is given, one per env id and kwargs. Each
session's instance makes its own twice env on its first reset (in the session's own thread, where
OpenEnv runs every call of a session), so two sessions never share an env, and the same
``(seed, options)`` gives the same first observation in every session, as in every process.

A reset takes ``seed`` (an int in ``0..2**64-1``; without it the env draws one and reports it in
``metadata["seed"]``), ``episode_id`` (any text up to 255 characters; a fresh one otherwise) and
``options`` (the env's reset options, e.g. ``{"task": ...}`` or ``{"noise_seed": ...}``); any
other field is refused by name, never dropped. Instead of a seed, a reset may name another episode
to start from: ``fork``, ``twin`` or ``restore`` (:mod:`.extension`). A step before a reset, a step after the episode
ended, and a bad seed or option each raise :class:`RequestError` naming the problem; the
session stays usable.
"""

from __future__ import annotations

import re
import threading
import uuid
from typing import Any, Optional

import twice_envs
from twice_envs._deps import require
from twice_envs.core import TextEnv
from twice_envs.errors import TwiceError
from twice_envs.integrations.openenv.extension import ExtensionError, Sessions, open_episode, source_of
from twice_envs.integrations.openenv.models import TwiceAction, TwiceObservation, TwiceState, observation

_interfaces = require("openenv.core.env_server.interfaces", "openenv", "the OpenEnv server")
_types = require("openenv.core.env_server.types", "openenv", "the OpenEnv server")

#: The fields a reset takes; anything else is refused by name.
RESET_FIELDS = ("seed", "episode_id", "options", "fork", "twin", "restore")


class RequestError(TwiceError, ValueError):
    """A request the session cannot carry out (bad field, step before reset, step after done)."""


class TwiceEnvironment(_interfaces.Environment[TwiceAction, TwiceObservation, TwiceState]):
    """One session's twice env behind OpenEnv's reset / step / state.

    Subclasses made by :func:`environment_class` set :attr:`env_id` and :attr:`env_kwargs`.
    Every instance holds its own env; none is shared between sessions.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True
    REQUIRES_SINGLE_THREAD_EXECUTOR = False
    #: The registered id and the kwargs each session's env is made with.
    env_id: str = ""
    env_kwargs: dict = {}
    #: The server's live sessions, which fork and twin requests name by handle.
    sessions: Sessions = Sessions()

    def __init__(self) -> None:
        super().__init__()
        self._env: Optional[TextEnv] = None  # made on the first reset, in the session's thread
        self._episode_id: Optional[str] = None
        #: Held while the env changes, so another session's fork never sees half a step.
        self.lock = threading.RLock()
        #: The name other sessions fork this one by (``state``'s ``session``).
        self.handle = uuid.uuid4().hex
        self.sessions.add(self.handle, self)

    @property
    def env(self) -> Optional[TextEnv]:
        """The session's env (``None`` before the first reset)."""
        return self._env

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, options: Optional[dict] = None,
              fork: Any = None, twin: Any = None, restore: Any = None, **unknown: Any) -> TwiceObservation:
        """Start an episode: the same ``(seed, options)`` gives the same first observation in any session.

        Or start from another episode: ``fork``, ``twin`` or ``restore`` (see :mod:`.extension`).
        """
        if unknown:
            raise RequestError(f"unknown reset fields {sorted(unknown)}; a reset takes {', '.join(RESET_FIELDS)}")
        if episode_id is not None and (not isinstance(episode_id, str) or len(episode_id) > 255):
            raise RequestError(f"episode_id must be text of at most 255 characters, got {episode_id!r:.80}")
        source = source_of({"fork": fork, "twin": twin, "restore": restore})
        if source is None:
            with self.lock:
                if self._env is None:
                    self._env = twice_envs.make(self.env_id, **self.env_kwargs)
                try:
                    text, info = self._env.reset(seed=seed, options=options)
                except (ValueError, TypeError) as exc:
                    raise RequestError(f"reset refused: {exc}") from None
            reward = None
        else:
            if seed is not None or options is not None:
                raise ExtensionError(f"a {source} starts from another episode: it takes no seed or options")
            spec = {"fork": fork, "twin": twin, "restore": restore}[source]
            env, text, reward, info = open_episode(source, self, spec)
            with self.lock:
                old, self._env = self._env, env
            if old is not None:
                old.close()
        self._episode_id = episode_id if episode_id is not None else uuid.uuid4().hex
        return observation(self._env, text, reward, info)

    def step(self, action: TwiceAction, timeout_s: Optional[float] = None, **kwargs: Any) -> TwiceObservation:
        """Take one turn's text; a malformed action is the env's to answer (``info["invalid"]``), never an error."""
        env = self._env
        if env is None or env._traj is None:
            raise RequestError(
                "step before reset: this session has no episode; send a reset first "
                "(HTTP /reset and /step keep no episode between requests: use the /ws session)"
            )
        if env.done:
            traj = env.trajectory
            why = "terminated" if traj.terminated else "truncated"
            raise RequestError(f"the episode is over ({why} after {traj.num_turns} turns); "
                               "send a reset to start another")
        with self.lock:
            text, reward, _, _, info = env.step(action.text)
        return observation(env, text, float(reward), info)

    @property
    def state(self) -> TwiceState:
        """The episode (id, step count, seed, turn, digest, record) and the session's handle."""
        env = self._env
        if env is None or env._traj is None:
            return TwiceState(env_id=self.env_id, session=self.handle)
        # no lock: OpenEnv reads state on its event loop, and only this session's own calls, which come
        # one at a time, change its env (another session's fork only reads it)
        traj = env.trajectory
        return TwiceState(episode_id=self._episode_id, step_count=traj.num_turns, env_id=self.env_id,
                          seed=traj.seed, turn=traj.num_turns, done=env.done, digest=traj.digest,
                          session=self.handle, record=traj.to_json())

    def get_metadata(self) -> _types.EnvironmentMetadata:
        return _types.EnvironmentMetadata(
            name=self.env_id,
            description=twice_envs.descriptions.get(self.env_id, "") or f"twice_envs {self.env_id}",
            version=twice_envs.__version__,
            author="twice_envs",
        )

    def close(self) -> None:
        self.sessions.remove(self.handle)
        with self.lock:
            if self._env is not None:
                self._env.close()


def environment_class(env_id: str, env_kwargs: Optional[dict] = None, *,
                      single_thread: bool = False, sessions: Optional[Sessions] = None) -> type[TwiceEnvironment]:
    """The ``Environment`` class that serves ``env_id`` made with ``env_kwargs``.

    Args:
        env_id: a registered id (``twice envs`` lists them).
        env_kwargs: keyword arguments for ``twice_envs.make`` (JSON data).
        single_thread: run every session on one shared thread (OpenEnv's
            ``REQUIRES_SINGLE_THREAD_EXECUTOR``). Off by default: each session already runs on a
            thread of its own, and the built-in envs allow one env per thread.
        sessions: the registry fork and twin requests look sessions up in (default: a new one).
    """
    name = re.sub(r"\W", "_", env_id)
    return type(name, (TwiceEnvironment,), {
        "env_id": env_id,
        "env_kwargs": dict(env_kwargs or {}),
        "REQUIRES_SINGLE_THREAD_EXECUTOR": bool(single_thread),
        "sessions": sessions if sessions is not None else Sessions(),
        "__doc__": f"{env_id} served through OpenEnv (see TwiceEnvironment).",
    })
