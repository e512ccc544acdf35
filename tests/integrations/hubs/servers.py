"""Shared pieces of the hub tests: a served env on 127.0.0.1 and a raw ``/ws`` session."""

from __future__ import annotations

import json
from contextlib import ExitStack, contextmanager
from typing import Iterator

from websockets.sync.client import connect

import twice_envs
from twice_envs.integrations.openenv.server import ServeConfig, ServerThread

ENV_ID = "SearchToy-v0"
ACTIONS = ("search q1", "search q5", "search q2", "answer")


@contextmanager
def served(**settings) -> Iterator[str]:
    """A server for ``ENV_ID`` on a free loopback port (``settings`` override :class:`ServeConfig`'s)."""
    config = ServeConfig(settings.pop("env_id", ENV_ID), port=0, **settings)
    with ServerThread(config) as url:
        yield url


def ws_url(url: str) -> str:
    return url.replace("http://", "ws://", 1) + "/ws"


class Session:
    """A raw ``/ws`` session: send a message (dict or text), read the reply as a dict."""

    def __init__(self, url: str, **connect_kwargs) -> None:
        self._stack = ExitStack()
        self.ws = self._stack.enter_context(connect(ws_url(url), open_timeout=10, **connect_kwargs))

    def ask(self, message: dict | str | bytes, timeout: float = 10) -> dict:
        self.ws.send(json.dumps(message) if isinstance(message, dict) else message)
        return json.loads(self.ws.recv(timeout=timeout))

    def reset(self, **data) -> dict:
        return self.ask({"type": "reset", "data": data})

    def step(self, text: str) -> dict:
        return self.ask({"type": "step", "data": {"text": text}})

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def in_process(seed: int, actions=ACTIONS) -> tuple[str, list[str]]:
    """The first observation and the digest chain of the same episode played in this process."""
    env = twice_envs.make(ENV_ID)
    obs, _ = env.reset(seed=seed)
    for action in actions:
        env.step(action)
    return obs, list(env.trajectory.digests)
