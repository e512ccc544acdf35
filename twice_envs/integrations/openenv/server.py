"""``twice serve``: an OpenEnv server for any registered env id, built by OpenEnv's ``create_app``.

    from twice_envs.integrations.openenv import ServeConfig, serve
    serve(ServeConfig("SearchQA-v0", port=8000, max_sessions=16))

OpenEnv provides the routes (``/ws`` sessions, ``/reset``, ``/step``, ``/state``, ``/schema``,
``/metadata``, ``/health``, ``/mcp``), the session slots (``max_concurrent_envs``: a client over
the limit gets ``CAPACITY_REACHED``), a thread of its own for each session, the reaping of idle
sessions that no WebSocket holds, and the error frames for bad JSON, unknown message types and
actions that fail validation. This module adds, through :class:`~.guard.Guard`: the bearer token
(required for any address outside the loopback range), the request size limit, the idle timeout
of WebSocket sessions, and error frames where OpenEnv would end the session (binary frames, JSON
that is not an object). Requests the env refuses (a bad seed, a step before reset or after the
episode ended) come back as 400 over HTTP and as an ``EXECUTION_ERROR`` frame over ``/ws``.
"""

from __future__ import annotations

import ipaddress
import math
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import twice_envs
from twice_envs._deps import require
from twice_envs.errors import TwiceError
from twice_envs.integrations.openenv.environment import environment_class
from twice_envs.integrations.openenv.guard import Guard, ws_max_size
from twice_envs.integrations.openenv.models import TwiceAction, TwiceObservation, TwiceState
from twice_envs.trajectory import canonical_json

_http = require("openenv.core.env_server.http_server", "openenv", "the OpenEnv server")
_types = require("openenv.core.env_server.types", "openenv", "the OpenEnv server")
_responses = require("fastapi.responses", "openenv", "the OpenEnv server")
uvicorn = require("uvicorn", "openenv", "the OpenEnv server")

LOOPBACK_NAMES = ("localhost",)


class ServeConfigError(TwiceError, ValueError):
    """A server setting that cannot be used (named in the message)."""


@dataclass(frozen=True)
class ServeConfig:
    """How one env id is served.

    Attributes:
        env_id: a registered id (``twice envs`` lists them).
        env_kwargs: keyword arguments for ``twice_envs.make`` (JSON data).
        host: the address to bind; anything outside 127.0.0.0/8, ``::1`` and ``localhost`` needs a token.
        port: the TCP port (0: a free one, reported by :class:`ServerThread` and the start line).
        max_sessions: concurrent sessions; one more gets ``CAPACITY_REACHED``.
        session_timeout: seconds a session may stay silent before it is closed and its slot freed.
        token: the bearer token every request but ``/health`` must carry (``None``: none).
        max_request_bytes: the largest request body or WebSocket message handed to the env.
        single_thread: run all sessions on one shared thread (OpenEnv's ``REQUIRES_SINGLE_THREAD_EXECUTOR``).
    """

    env_id: str
    env_kwargs: dict = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 8000
    max_sessions: int = 8
    session_timeout: float = 300.0
    token: Optional[str] = None
    max_request_bytes: int = 1 << 20
    single_thread: bool = False

    def check(self) -> None:
        """Raise :class:`ServeConfigError` naming the first setting that cannot be used."""
        if not isinstance(self.env_kwargs, dict):
            raise ServeConfigError(f"env_kwargs must be a dict of JSON data, got {type(self.env_kwargs).__name__}")
        try:
            canonical_json(self.env_kwargs)
        except (TypeError, ValueError) as exc:
            raise ServeConfigError(f"env_kwargs must be JSON data: {exc}") from None
        for name, low in (("port", 0), ("max_sessions", 1), ("max_request_bytes", 1024)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ServeConfigError(f"{name} must be an int >= {low}, got {value!r}")
        if self.port > 65535:
            raise ServeConfigError(f"port must be in 0..65535, got {self.port}")
        timeout = self.session_timeout
        number = isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
        if not (number and math.isfinite(timeout) and timeout > 0):
            raise ServeConfigError(f"session_timeout must be a positive number of seconds, got {timeout!r}")
        token = self.token
        if token is not None and (not isinstance(token, str) or len(token) < 8 or not token.isprintable()):
            raise ServeConfigError("token must be printable text of at least 8 characters")
        if self.token is None and not is_loopback(self.host):
            raise ServeConfigError(
                f"host {self.host!r} is reachable from other machines: serving there needs a bearer token "
                "(--token, or the TWICE_SERVE_TOKEN environment variable)"
            )


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ``::1``) or ``localhost``."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def build_app(config: ServeConfig) -> Any:
    """The server's FastAPI app: OpenEnv's ``create_app`` for ``config.env_id`` behind a :class:`Guard`.

    The env is made once here, so an unknown id or kwarg fails before anything is bound (and the
    env's shared resources are loaded before the first session).
    """
    config.check()
    twice_envs.make(config.env_id, **config.env_kwargs).close()
    env_cls = environment_class(config.env_id, config.env_kwargs, single_thread=config.single_thread)
    concurrency = _types.ConcurrencyConfig(max_concurrent_envs=config.max_sessions,
                                           session_timeout=config.session_timeout)
    app = _http.create_app(env_cls, TwiceAction, TwiceObservation, env_name=env_cls.__name__,
                     concurrency_config=concurrency, state_cls=TwiceState)
    app.add_exception_handler(TwiceError, _refused)
    app.add_middleware(Guard, token=config.token, max_request_bytes=config.max_request_bytes,
                       idle_timeout=config.session_timeout)
    return app


async def _refused(request: Any, exc: Exception) -> Any:
    return _responses.JSONResponse(status_code=400, content={"detail": str(exc)})


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``(host, port)`` (port 0: a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise ServeConfigError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _uvicorn_server(config: ServeConfig, app: Any, log_level: str) -> Any:
    return uvicorn.Server(uvicorn.Config(app, log_level=log_level, ws_max_size=ws_max_size(config.max_request_bytes)))


def serve(config: ServeConfig, *, log_level: str = "warning") -> None:
    """Serve ``config.env_id`` until interrupted (prints one line with the address first)."""
    app = build_app(config)
    sock = bind(config.host, config.port)
    print(f"twice serve: {config.env_id} at {url_of(sock)} (sessions at /ws; {config.max_sessions} at once, "
          f"closed after {config.session_timeout:g} s idle{'; bearer token required' if config.token else ''})",
          flush=True)
    _uvicorn_server(config, app, log_level).run(sockets=[sock])


class ServerThread:
    """A server on a background thread of this process (tests, notebooks): ``with ServerThread(cfg) as url:``.

    Binds before the thread starts, so :attr:`url` is known at once (port 0 picks a free port),
    and waits until the server accepts requests.
    """

    def __init__(self, config: ServeConfig, *, log_level: str = "warning") -> None:
        self.config = config
        self.app = build_app(config)
        self._sock = bind(config.host, config.port)
        self.url = url_of(self._sock)
        self._server = _uvicorn_server(config, self.app, log_level)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name=f"twice-serve-{config.env_id}", daemon=True)

    def start(self, timeout: float = 30.0) -> str:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise TwiceError(f"the server for {self.config.env_id} did not start within {timeout:g} s")
            time.sleep(0.01)
        return self.url

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
