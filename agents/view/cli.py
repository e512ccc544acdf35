"""``twice view PATH``: write the explorer page for a record file, a run folder or an audit folder.

The page is one self-contained HTML file (:mod:`.page`); nothing is opened. ``--serve`` serves
it on 127.0.0.1 only, until interrupted.
"""

from __future__ import annotations

import argparse
import http.server
import sys
from pathlib import Path
from typing import Optional, Sequence

from twice_envs.agents.view.load import load
from twice_envs.agents.view.page import render
from twice_envs.trajectory import atomic_write_text

#: The page's file name inside a folder.
PAGE_NAME = "explorer.html"


def default_out(path: Path) -> Path:
    """Where the page goes by default: ``PATH/explorer.html`` for a folder, ``FILE.html`` beside a file."""
    return path / PAGE_NAME if path.is_dir() else path.with_suffix(".html")


def write_explorer(path: str | Path, out: Optional[str | Path] = None, title: Optional[str] = None) -> Path:
    """Read ``path`` and write its explorer page (default :func:`default_out`); returns the page's path."""
    path = Path(path)
    out = Path(out) if out is not None else default_out(path)
    explorer = load(path, title)
    atomic_write_text(out, render(explorer))
    return out


def serve(page: Path, port: int = 8765, say=print) -> None:
    """Serve ``page`` at ``http://127.0.0.1:PORT/`` (every path answers with the page) until interrupted."""
    body = page.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 -- the http.server interface
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 -- quiet
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler) as server:
        say(f"serving {page} at http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass


def view_main(argv: Sequence[str]) -> int:
    """``twice view PATH [--out FILE] [--serve [--port N]]``."""
    p = argparse.ArgumentParser(
        prog="twice view",
        description="Write a self-contained HTML explorer of episodes, their twins and credit, learning curves "
                    "and credit audits. PATH: a record file (twice rollout, twice play :save), a twice train run "
                    "folder, an audit folder (twice audit, LLM envs or the lab), or a folder holding several "
                    "(twice demo's output).")
    p.add_argument("path", help="record file, run folder, audit folder or a folder of them")
    p.add_argument("--out", default=None,
                   help=f"the HTML file to write (default: PATH/{PAGE_NAME} for a folder, FILE.html beside a file)")
    p.add_argument("--title", default=None, help="the page's title")
    p.add_argument("--serve", action="store_true", help="then serve the page on 127.0.0.1 (never other interfaces)")
    p.add_argument("--port", type=int, default=8765, help="port for --serve (default %(default)s; 0: any free port)")
    a = p.parse_args(argv)
    out = write_explorer(a.path, a.out, a.title)
    print(f"explorer: {out}")
    if a.serve:
        serve(out, a.port, say=lambda m: print(m, file=sys.stderr, flush=True))
    return 0
