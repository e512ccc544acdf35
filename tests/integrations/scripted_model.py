"""A scripted chat model on 127.0.0.1: an OpenAI-compatible ``/v1/chat/completions`` that replies
``actions[k]`` to a conversation holding ``k`` assistant messages, and keeps every request."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from typing import Iterator, Sequence

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route


@contextmanager
def scripted_model(actions: Sequence[str]) -> Iterator[tuple[str, list]]:
    """``(base_url, requests)``: the model's address and the request bodies it received."""
    requests: list = []

    async def chat(request):
        body = await request.json()
        requests.append(body)
        k = sum(1 for m in body["messages"] if m["role"] == "assistant")
        message = {"role": "assistant", "content": actions[min(k, len(actions) - 1)]}
        return JSONResponse({"id": f"c{len(requests)}", "object": "chat.completion", "created": 0,
                             "model": body["model"], "choices": [{"index": 0, "message": message,
                                                                  "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1", requests
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
