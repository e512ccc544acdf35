"""The typed messages of a served twice env: one text action in, one text observation out.

* :class:`TwiceAction` -- ``{"text": "<search> who founded X </search>"}``: the agent's raw turn
  text (or a plain action), parsed by the env itself; nothing else is accepted (OpenEnv's
  ``Action`` forbids unknown fields, so a typo is a validation error, not a silent default).
* :class:`TwiceObservation` -- the observation ``text`` with OpenEnv's ``done`` and ``reward`` and
  a ``metadata`` dict: ``info`` (the env's info, JSON data), ``noise_key`` (the key base of the
  agent's next turn), ``digest`` (the digest chain's head), ``turn``, ``seed`` (the episode's seed,
  drawn and recorded when the reset named none), ``terminated`` and ``truncated``; a reset adds
  ``protocol`` (the stop strings and the action format).
* :class:`TwiceState` -- what ``state`` reports: the episode id, the step count, the identity (env
  id, seed, digest) a client needs to check that two sessions hold one episode, the session's
  handle (what a fork or twin names) and the episode's record (what a restore replays).
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional

from twice_envs._deps import require
from twice_envs.core import TextEnv

require("openenv", "openenv", "the OpenEnv server")  # names the package, not the submodule
_types = require("openenv.core.env_server.types", "openenv", "the OpenEnv server")
Field = require("pydantic", "openenv", "the OpenEnv server").Field


class TwiceAction(_types.Action):
    """One agent turn: the text the env parses (``{"text": "..."}``)."""

    text: str = Field(description="The agent's turn text (the env parses its own action protocol)")


class TwiceObservation(_types.Observation):
    """The env's text observation; ``metadata`` carries info, the noise key and the digest."""

    text: str = Field(default="", description="The observation text")


class TwiceState(_types.State):
    """The session's episode: its id, step count, env id, seed, turn and digest chain head."""

    env_id: str = Field(default="", description="The registered env id this server runs")
    seed: Optional[int] = Field(default=None, description="The episode's seed (None before the first reset)")
    turn: int = Field(default=0, ge=0, description="Actions taken in this episode")
    done: bool = Field(default=False, description="Whether the episode has ended")
    digest: Optional[str] = Field(default=None, description="The head of the episode's digest chain")
    session: str = Field(default="", description="The handle other sessions fork, twin or restore this one by")
    record: Optional[dict] = Field(default=None, description="The episode's record (export): a restore replays it")


def jsonable(value: Any) -> Any:
    """``value`` as JSON data: tuples become lists, numpy scalars numbers, anything else its text."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item):
        try:
            return jsonable(item())
        except (TypeError, ValueError):
            pass
    return str(value)


def observation(env: TextEnv, text: str, reward: Optional[float], info: dict) -> TwiceObservation:
    """The wire observation of ``env`` after a reset (``reward=None``) or a step."""
    traj = env.trajectory
    metadata = {
        "info": jsonable(info),
        "noise_key": env.noise_key().to_json(),
        "digest": traj.digest,
        "turn": traj.num_turns,
        "seed": traj.seed,
        "terminated": bool(traj.terminated),
        "truncated": bool(traj.truncated),
    }
    if reward is None:
        protocol = env.protocol()
        metadata["protocol"] = {"stop": list(protocol.stop), "action_format": protocol.action_format}
    json.dumps(metadata, allow_nan=False)  # fails here, with the field, rather than in the transport
    return TwiceObservation(text=text, done=env.done, reward=reward, metadata=metadata)
