"""``twice serve ENV_ID``: serve a registered env through OpenEnv until interrupted.

    twice serve SearchQA-v0                          # http://127.0.0.1:8000, sessions at /ws
    twice serve WebShop-v0 --port 0 --max-sessions 64 --session-timeout 60
    TWICE_SERVE_TOKEN=... twice serve SearchQA-v0 --host 0.0.0.0   # other addresses need a token
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Sequence

from twice_envs.integrations.openenv.server import ServeConfig, ServeConfigError, serve

TOKEN_VARIABLE = "TWICE_SERVE_TOKEN"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="twice serve",
        description="Serve a registered env through OpenEnv: WebSocket sessions at /ws (one env each), "
                    "plus /reset, /step, /state, /schema, /metadata and /health.")
    p.add_argument("env_id", metavar="ENV_ID", help="a registered env id (twice envs lists them)")
    p.add_argument("--env-kwargs", default="{}", metavar="JSON",
                   help="keyword arguments for twice_envs.make, as a JSON object (default: {})")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; any non-loopback address needs a token)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    p.add_argument("--max-sessions", type=int, default=8,
                   help="sessions at once; one more is refused with CAPACITY_REACHED (default 8)")
    p.add_argument("--session-timeout", type=float, default=300.0, metavar="S",
                   help="close a session that sends nothing for S seconds and free its slot (default 300)")
    p.add_argument("--token", default=os.environ.get(TOKEN_VARIABLE),
                   help=f"bearer token every request but /health must carry (default: ${TOKEN_VARIABLE})")
    p.add_argument("--max-request-bytes", type=int, default=1 << 20,
                   help="largest request body or WebSocket message (default 1048576)")
    p.add_argument("--single-thread", action="store_true",
                   help="run every session on one shared thread (for envs that need one thread)")
    p.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"),
                   help="the web server's log level (default warning)")
    return p


def serve_main(argv: Sequence[str]) -> int:
    """``twice serve``: parse, check every setting, bind and serve until interrupted."""
    args = parser().parse_args(argv)
    try:
        env_kwargs = json.loads(args.env_kwargs)
    except ValueError as exc:
        raise ServeConfigError(f"--env-kwargs is not JSON: {exc}") from None
    if not isinstance(env_kwargs, dict):
        raise ServeConfigError(f"--env-kwargs must be a JSON object, got {args.env_kwargs!r}")
    config = ServeConfig(args.env_id, env_kwargs, host=args.host, port=args.port, max_sessions=args.max_sessions,
                         session_timeout=args.session_timeout, token=args.token or None,
                         max_request_bytes=args.max_request_bytes, single_thread=args.single_thread)
    try:
        serve(config, log_level=args.log_level)
    except KeyboardInterrupt:
        pass
    return 0
