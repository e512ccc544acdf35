"""What the server adds in front of OpenEnv's routes: a bearer token, request size limits, idle timeouts.

:class:`Guard` is plain ASGI middleware (``app.add_middleware(Guard, ...)``), so it sees HTTP requests
and WebSocket frames before OpenEnv's handlers do:

* **Token.** With a token set, every request but ``GET /health`` needs ``Authorization: Bearer
  <token>``: HTTP answers 401, a WebSocket handshake is refused (HTTP 401 where the server supports
  denial responses, close code 1008 otherwise). Tokens are compared in constant time.
* **Size.** An HTTP body over ``max_request_bytes`` is answered 413 before it reaches a handler. A
  WebSocket frame over it, a binary frame, or JSON that is not an object gets an error frame
  (``{"type": "error", "data": {"code": ..., "message": ...}}``) and the session goes on: OpenEnv
  would otherwise end the session on the last two. (The transport closes a connection with code 1009
  for a frame over twice the limit, see :func:`ws_max_size`.)
* **Idle sessions.** A WebSocket session that sends nothing for ``idle_timeout`` seconds is closed
  with code 4408 and its slot freed, so a client that hangs or leaks its connection cannot hold a
  slot for good. (A client that vanishes is noticed sooner: its TCP connection closes, or the
  transport's keepalive pings go unanswered.)
"""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import Any, Awaitable, Callable, Optional

Scope = dict
Message = dict
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: Close code of a WebSocket session closed for idleness (application range; 408 as in HTTP).
IDLE_CLOSE_CODE = 4408
#: Paths open without the token (a liveness probe says nothing about the env).
OPEN_PATHS = ("/health",)


def ws_max_size(max_request_bytes: int) -> int:
    """The transport's hard frame limit: twice the request limit, so frames in between get a clear error."""
    return 2 * max_request_bytes


def error_frame(code: str, message: str) -> str:
    """An OpenEnv WebSocket error response."""
    return json.dumps({"type": "error", "data": {"code": code, "message": message}})


class Guard:
    """ASGI middleware: bearer token, request size limit and idle timeout (see the module docstring).

    Args:
        app: the ASGI app behind it.
        token: the bearer token every request needs (``None``: none needed).
        max_request_bytes: the largest HTTP body or WebSocket frame handed on.
        idle_timeout: seconds a WebSocket session may stay silent (``None``: no limit).
    """

    def __init__(self, app: Any, *, token: Optional[str], max_request_bytes: int,
                 idle_timeout: Optional[float]) -> None:
        self.app = app
        self.token = token
        self.max_request_bytes = max_request_bytes
        self.idle_timeout = idle_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        if self.token is None or scope.get("path") in OPEN_PATHS:
            return True
        for name, value in scope.get("headers", ()):
            if name.lower() == b"authorization":
                scheme, _, given = value.decode("latin-1").partition(" ")
                return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token.encode())
        return False

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._authorized(scope):
            await _json_response(send, 401, "missing or wrong bearer token (send 'Authorization: Bearer <token>')",
                                 [(b"www-authenticate", b"Bearer")])
            return
        limit = self.max_request_bytes
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > limit:
                await _json_response(send, 413, f"request body over the limit of {limit} bytes (--max-request-bytes)")
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._authorized(scope):
            await receive()  # websocket.connect
            if "websocket.http.response" in scope.get("extensions", {}):
                await _json_response(send, 401, "missing or wrong bearer token (send 'Authorization: Bearer <token>')",
                                     [(b"www-authenticate", b"Bearer")], prefix="websocket.http.response")
            else:
                await send({"type": "websocket.close", "code": 1008, "reason": "missing or wrong bearer token"})
            return
        closed = False

        async def guarded_send(message: Message) -> None:
            nonlocal closed
            if closed:  # the guard closed the connection; the handler's own close comes after it
                return
            if message["type"] == "websocket.close":
                closed = True
            await send(message)

        async def guarded_receive() -> Message:
            nonlocal closed
            while True:
                try:
                    message = await asyncio.wait_for(receive(), self.idle_timeout)
                except asyncio.TimeoutError:
                    if not closed:
                        closed = True
                        await send({"type": "websocket.close", "code": IDLE_CLOSE_CODE,
                                    "reason": f"idle for {self.idle_timeout:g} s: session closed"})
                    return {"type": "websocket.disconnect", "code": IDLE_CLOSE_CODE}
                if message["type"] != "websocket.receive":
                    return message
                problem = self._frame_problem(message)
                if problem is None:
                    return message
                await send({"type": "websocket.send", "text": error_frame(*problem)})

        await self.app(scope, guarded_receive, guarded_send)

    def _frame_problem(self, message: Message) -> Optional[tuple[str, str]]:
        """``(code, message)`` for a frame OpenEnv must not see, ``None`` for one it handles itself."""
        text = message.get("text")
        if text is None:
            return "INVALID_JSON", "binary frames are not part of the protocol: send JSON text"
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > self.max_request_bytes:
            return "REQUEST_TOO_LARGE", (f"message of {size} bytes is over the limit of "
                                         f"{self.max_request_bytes} bytes (--max-request-bytes)")
        try:
            value = json.loads(text)
        except ValueError:
            return None  # OpenEnv answers INVALID_JSON with the parser's message
        if not isinstance(value, dict):
            return "INVALID_JSON", f"a message is a JSON object with a 'type', got a JSON {type(value).__name__}"
        return None


async def _json_response(send: Send, status: int, detail: str, headers: list = (), *,
                         prefix: str = "http.response") -> None:
    body = json.dumps({"detail": detail}).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": f"{prefix}.start", "status": status, "headers": head})
    await send({"type": f"{prefix}.body", "body": body})
