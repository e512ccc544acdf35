"""A typed OpenEnv client for a served twice env (OpenEnv's ``EnvClient`` with the twice messages).

    from twice_envs.integrations.openenv import TwiceEnvClient
    with TwiceEnvClient("http://127.0.0.1:8000").sync() as env:
        result = env.reset(seed=7)
        result = env.step("<search> who founded X </search>")
        print(result.observation.text, result.reward, result.done, result.metadata["digest"])

``step`` takes a :class:`~.models.TwiceAction` or its text. A server error (a bad seed, a step
after the episode ended) raises ``RuntimeError`` with the server's message and code; the session
stays open.

The protocol extension (:mod:`.extension`) over the wire, for a synchronous client::

    twin_env, result = twin(env, "search q7", turn=1, branch=1)   # a new session: the twin after its action
    branch, result = fork(env, turn=2)                             # a new session at turn 2
    record = export(env)                                           # the episode's record (JSON data)
    result = restore(other_env, record)                            # any session, on any server of the env
"""

from __future__ import annotations

from typing import Any, Optional

from twice_envs._deps import require
from twice_envs.errors import TwiceError
from twice_envs.integrations.openenv.models import TwiceAction, TwiceObservation, TwiceState

_client = require("openenv.core.env_client", "openenv", "the OpenEnv client")
_results = require("openenv.core.client_types", "openenv", "the OpenEnv client")


class TwiceEnvClient(_client.EnvClient[TwiceAction, TwiceObservation, TwiceState]):
    """One ``/ws`` session of a ``twice serve`` server.

    Args:
        base_url: the server's ``http://`` or ``ws://`` address.
        token: the server's bearer token, if it has one (sent as ``Authorization: Bearer``).
        **kwargs: passed to OpenEnv's ``EnvClient`` (timeouts, message size, headers).
    """

    def __init__(self, base_url: str, *, token: Optional[str] = None, **kwargs: Any) -> None:
        if token is not None:
            kwargs["headers"] = {**(kwargs.get("headers") or {}), "Authorization": f"Bearer {token}"}
        super().__init__(base_url=base_url, **kwargs)

    def _step_payload(self, action: TwiceAction | str) -> dict:
        return (TwiceAction(text=action) if isinstance(action, str) else action).model_dump()

    def _parse_result(self, payload: dict) -> _results.StepResult:
        metadata = payload.get("metadata") or {}
        obs = TwiceObservation.model_validate({**payload.get("observation", {}), "done": payload.get("done", False),
                                               "reward": payload.get("reward"), "metadata": metadata})
        return _results.StepResult(observation=obs, reward=obs.reward, done=obs.done, metadata=metadata)

    def _parse_state(self, payload: dict) -> TwiceState:
        return TwiceState(**payload)


def export(env: Any) -> dict:
    """The record of ``env``'s episode (``state``'s ``record``): what :func:`restore` replays."""
    record = env.state().record
    if record is None:
        raise TwiceError("the session has no episode to export yet: reset it first")
    return record


def fork(env: Any, turn: Optional[int] = None) -> tuple[Any, Any]:
    """A new session of the same server holding ``env``'s episode after ``turn`` actions (default: now).

    Returns ``(session, result)``: the new synchronous client (closed with ``env``) and its observation.
    """
    child = env.new_session()
    return child, child.reset(fork={"session": env.state().session, "turn": turn})


def twin(env: Any, action: str, *, turn: Optional[int] = None, branch: int = 1) -> tuple[Any, Any]:
    """A new session holding the twin of ``env``'s turn ``turn`` (default: now) that takes ``action``.

    The twin samples its alternative turn as ``branch`` of ``env``'s noise schedule and reports
    ``env``'s noise keys afterwards. Returns ``(session, result)``, the result of the alternative step.
    """
    child = env.new_session()
    spec = {"session": env.state().session, "turn": turn, "action": action, "branch": branch}
    return child, child.reset(twin=spec)


def restore(env: Any, record: dict) -> Any:
    """Reset ``env``'s session to the episode of ``record``, rebuilt by validated replay."""
    return env.reset(restore=record)
