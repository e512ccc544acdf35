"""A twice env behind NeMo Gym's GymnasiumServer protocol, with restore by validated replay.

NeMo Gym 0.7's ``resources_servers.gymnasium.GymnasiumServer`` calls two async methods per session,
``reset(metadata, session_id) -> (observation, info)`` and ``step(action, metadata, session_id) ->
(observation, reward, terminated, truncated, info)``, where ``action`` is the model's response (its
output text is the env action) and ``metadata`` the extra fields of the request. :class:`TwiceGymSessions`
implements exactly these for any registered env id, one env per session; :func:`server_class`
subclasses NeMo Gym's ``GymnasiumServer`` with them where nemo-gym is installed (it declares Python >= 3.13.14;
``tests/sidecar/nemo_gym.sh`` runs it on Python 3.13).

Reset metadata: ``seed`` (an int; the same seed gives the same first observation in every session and
process) and ``options`` (the env's reset options), or ``restore`` (a record). Any other key is refused
by name, never dropped.

Crash recovery. NeMo Gym 0.7 releases no checkpoint or restore interface for gymnasium servers; the
open proposals restore a text-game session by replaying its accepted commands and refusing on a
mismatch. This adapter implements that protocol: every step's ``info`` carries the episode's ``digest``
(the head of its digest chain) and ``turn``; :meth:`TwiceGymSessions.export` returns the session's
record (JSON data); a reset with ``{"restore": record}`` on any server of the same env id and kwargs
rebuilds the episode by :func:`twice_envs.replay`, which recomputes the record's chain, replays every
action and compares each turn's digest, refusing a record that was edited, comes from another env,
other kwargs or another env version, naming the field or turn.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Optional

import twice_envs
from twice_envs._deps import require
from twice_envs.core import TextEnv
from twice_envs.errors import TwiceError
from twice_envs.integrations.openenv.extension import restore as restore_record

#: The reset metadata keys; any other is refused by name.
RESET_KEYS = ("seed", "options", "restore")


class SessionError(TwiceError, ValueError):
    """A reset or step the session cannot carry out (the message names why)."""


def action_text(action: Any) -> str:
    """The env action in ``action``: text as is, or the output text of a NeMo Gym response."""
    if isinstance(action, str):
        return action
    output = getattr(action, "output", None)
    if output is None:
        raise SessionError(f"an action must be text or a model response with 'output', got {type(action).__name__}")
    parts = []
    for item in output:
        if getattr(item, "type", None) != "message":
            continue
        content = item.content
        parts += [content] if isinstance(content, str) else [c.text for c in content if c.type == "output_text"]
    return "".join(parts).strip()


def plain(value: Any) -> Any:
    """``value`` as JSON data (noise keys as their JSON form, numpy scalars as numbers, else text)."""
    def default(x: Any) -> Any:
        for method in ("to_json", "item"):
            if callable(getattr(x, method, None)):
                return getattr(x, method)()
        return str(x)
    return json.loads(json.dumps(value, default=default))


class TwiceGymSessions:
    """GymnasiumServer's ``reset`` / ``step`` / ``close_session`` for one env id, one env per session.

    Args:
        env_id: a registered env id.
        env_kwargs: keyword arguments for ``twice_envs.make`` (JSON data).
    """

    def __init__(self, env_id: str, env_kwargs: Optional[dict] = None) -> None:
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        twice_envs.make(env_id, **self.env_kwargs).close()  # an unknown id or kwarg fails here
        self.envs: dict[str, TextEnv] = {}

    def _info(self, env: TextEnv, info: dict) -> dict:
        traj = env.trajectory
        return {**plain(info), "digest": traj.digest, "turn": traj.num_turns, "seed": traj.seed}

    async def reset(self, metadata: dict, session_id: Optional[str] = None) -> tuple[str, dict]:
        """Start the session's episode from ``seed``/``options`` or from a ``restore`` record."""
        if session_id is None:
            raise SessionError("missing session id: a reset needs the session it starts")
        unknown = sorted(set(metadata or {}) - set(RESET_KEYS))
        if unknown:
            raise SessionError(f"unknown reset metadata {unknown}; a reset takes {', '.join(RESET_KEYS)}")
        record = (metadata or {}).get("restore")
        if record is not None:
            if metadata.get("seed") is not None or metadata.get("options") is not None:
                raise SessionError("a restore starts from its record: it takes no seed or options")
            env = await asyncio.to_thread(restore_record, self.env_id, self.env_kwargs, record)
            text, info = env.trajectory.observations[-1], dict(env.last_info)
        else:
            env = self.envs.get(session_id) or twice_envs.make(self.env_id, **self.env_kwargs)
            try:
                text, info = env.reset(seed=metadata.get("seed"), options=metadata.get("options"))
            except (TypeError, ValueError) as exc:
                raise SessionError(f"reset refused: {exc}") from None
        old = self.envs.get(session_id)
        self.envs[session_id] = env
        if old is not None and old is not env:
            old.close()
        return text, self._info(env, info)

    async def step(self, action: Any, metadata: dict, session_id: Optional[str] = None) -> tuple:
        """One turn: ``(observation, reward, terminated, truncated, info)``."""
        env = self.envs.get(session_id)
        if env is None or env._traj is None:
            raise SessionError(f"session {session_id!r} has no episode: send a reset first")
        if env.done:
            raise SessionError(f"the episode is over after {env.trajectory.num_turns} turns: send a reset")
        text, reward, terminated, truncated, info = env.step(action_text(action))
        return text, float(reward), bool(terminated), bool(truncated), self._info(env, info)

    def export(self, session_id: str) -> dict:
        """The session's episode record (JSON data): a reset with ``{"restore": record}`` rebuilds it."""
        env = self.envs.get(session_id)
        if env is None or env._traj is None:
            raise SessionError(f"session {session_id!r} has no episode to export")
        return env.trajectory.to_json()

    async def close_session(self, session_id: Optional[str]) -> None:
        """Free the session's env (safe to call twice)."""
        env = self.envs.pop(session_id, None)
        if env is not None:
            env.close()


def server_class(env_id: str, env_kwargs: Optional[dict] = None) -> type:
    """NeMo Gym's ``GymnasiumServer`` serving ``env_id`` (needs ``nemo-gym``, which declares Python >= 3.13.14).

    A reset or step the session refuses (:class:`SessionError`, a tampered or foreign restore record,
    an action the env cannot take) answers HTTP 400 with the reason as its ``detail``; the server and
    its other sessions go on."""
    base = require("resources_servers.gymnasium", "nemo-gym", "the NeMo Gym server").GymnasiumServer
    http_error = require("fastapi", "nemo-gym", "the NeMo Gym server").HTTPException
    sessions = TwiceGymSessions(env_id, env_kwargs)

    async def answer(call):
        try:
            return await call
        except (TwiceError, ValueError, TypeError) as exc:
            raise http_error(status_code=400, detail=str(exc)) from None

    class TwiceGymnasiumServer(base):
        ray_enabled = False

        async def reset(self, metadata: dict, session_id: Optional[str] = None) -> tuple:
            return await answer(sessions.reset(metadata, session_id))

        async def step(self, action: Any, metadata: dict, session_id: Optional[str] = None) -> tuple:
            return await answer(sessions.step(action, metadata, session_id))

        async def close_session(self, session_id: Optional[str]) -> None:
            await sessions.close_session(session_id)
            await super().close_session(session_id)

    TwiceGymnasiumServer.sessions = sessions
    return TwiceGymnasiumServer
